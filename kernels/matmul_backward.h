// The gradient of c = op(a) * op(b), written once over any device's Gemm
// (ops.cc and ops_cuda.cu instantiate it). Internal to kernels/.
#ifndef PSRT_KERNELS_MATMUL_BACKWARD_H_
#define PSRT_KERNELS_MATMUL_BACKWARD_H_

#include "kernels/ops.h"

namespace psrt {
namespace kernels {
namespace internal {

// With C = op(A) op(B): d op(A) = dC op(B)^T and d op(B) = op(A)^T dC. A
// transposed operand gets the transpose of that, computed directly by
// swapping the factors (as TensorFlow's MatMul gradient does). Overwrites da
// and db; a null one is skipped.
template <class Context>
void MatMulBackwardWith(const Context& ctx, const MatMulShape& shape,
                        const float* a, const float* b, const float* dc,
                        float* da, float* db) {
  const int64_t m = shape.m, n = shape.n, k = shape.k;
  const bool ta = shape.transpose_a, tb = shape.transpose_b;
  if (da != nullptr) {
    if (!ta) {  // dA[m, k] = dC op(B)^T.
      Gemm(ctx, MatMulShape{m, k, n, false, !tb}, 1.0f, dc, b, 0.0f, da);
    } else {  // dA[k, m] = op(B) dC^T.
      Gemm(ctx, MatMulShape{k, m, n, tb, true}, 1.0f, b, dc, 0.0f, da);
    }
  }
  if (db != nullptr) {
    if (!tb) {  // dB[k, n] = op(A)^T dC.
      Gemm(ctx, MatMulShape{k, n, m, !ta, false}, 1.0f, a, dc, 0.0f, db);
    } else {  // dB[n, k] = dC^T op(A).
      Gemm(ctx, MatMulShape{n, k, m, true, ta}, 1.0f, dc, a, 0.0f, db);
    }
  }
}

}  // namespace internal
}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_MATMUL_BACKWARD_H_
