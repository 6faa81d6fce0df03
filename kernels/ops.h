// The CPU ops: each layer of a model is a forward/backward pair over plain
// float arrays (row-major; usually a Tensor's data()), run on the thread pool
// of the CpuContext passed in.
//
// The CUDA versions in ops_cuda.h take the same arguments with a CudaContext
// and device pointers; these CPU ops are their oracle.
//
// Every backward says whether it overwrites or adds into its outputs. Output
// buffers are never allocated here: the caller owns and reuses them.
#ifndef PSRT_KERNELS_OPS_H_
#define PSRT_KERNELS_OPS_H_

#include <cstdint>

#include "kernels/cpu_context.h"

namespace psrt {
namespace kernels {

// The shape of c = op(a) * op(b): op(a) is [m, k] and op(b) is [k, n], where
// op(x) is x or, when the flag is set, x transposed. So a is stored as [m, k]
// ([k, m] if transpose_a), b as [k, n] ([n, k] if transpose_b), c as [m, n].
struct MatMulShape {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  bool transpose_a = false;
  bool transpose_b = false;
};

// How a GPU's matrix products (and so its convolutions, which are GEMMs)
// round: kFp32 is IEEE single precision, as on the CPU; kTf32 lets cuBLAS
// use the tensor cores' TF32 (inputs rounded to a 10-bit mantissa, sums in
// FP32), as PyTorch's convolutions do by default. The CPU always runs FP32.
enum class GpuMath { kFp32, kTf32 };

// The GEMM: c = alpha * op(a) * op(b) + beta * c. With beta == 0, c is
// overwritten and its old contents are never read. Runs the fastest path
// this CPU supports (gemm.h: AVX-512 or Eigen; defined in gemm.cc).
// REQUIRES: c does not overlap a or b.
void Gemm(const CpuContext& ctx, const MatMulShape& shape, float alpha,
          const float* a, const float* b, float beta, float* c);

// Gemm on the calling thread only, for ops that split their work over the
// context's threads themselves and call it from inside a ParallelFor (where
// Gemm's own ParallelFor may not nest).
void GemmOnCallingThread(const MatMulShape& shape, float alpha, const float* a,
                         const float* b, float beta, float* c);

// Forward: c = op(a) * op(b). Overwrites c.
void MatMulForward(const CpuContext& ctx, const MatMulShape& shape,
                   const float* a, const float* b, float* c);

// Backward of MatMulForward: given dc = dL/dc, computes da = dL/da and
// db = dL/db (stored like a and b). Overwrites da and db; either may be null
// to skip computing it.
void MatMulBackward(const CpuContext& ctx, const MatMulShape& shape,
                    const float* a, const float* b, const float* dc, float* da,
                    float* db);

// Forward: y[rows, cols] = x + bias, with bias [cols] added to every row.
// Overwrites y; y may equal x.
void BiasAddForward(const CpuContext& ctx, const float* x, const float* bias,
                    int64_t rows, int64_t cols, float* y);

// Backward of BiasAddForward: dbias[cols] = the column sums of dy[rows, cols].
// Overwrites dbias. (dL/dx is dy itself; there is nothing to compute.)
void BiasAddBackward(const CpuContext& ctx, const float* dy, int64_t rows,
                     int64_t cols, float* dbias);

// Forward: y = max(x, 0) over n elements. Overwrites y; y may equal x.
void ReluForward(const CpuContext& ctx, const float* x, int64_t n, float* y);

// Backward of ReluForward, from its output y: dx = dy where y > 0, else 0.
// Overwrites dx; dx may equal dy.
void ReluBackward(const CpuContext& ctx, const float* y, const float* dy,
                  int64_t n, float* dx);

// Forward: the mean over the batch of the softmax cross-entropy of
// logits[batch, classes] against integer labels[batch]; returns it.
// REQUIRES: batch >= 1, classes >= 1, 0 <= labels[i] < classes (CHECKed).
float SoftmaxCrossEntropyForward(const CpuContext& ctx, const float* logits,
                                 const int32_t* labels, int64_t batch,
                                 int64_t classes);

// Backward of SoftmaxCrossEntropyForward (the loss is the end of the chain,
// so no upstream gradient): dlogits = (softmax(logits) - onehot(labels)) /
// batch. Overwrites dlogits[batch, classes]; dlogits may equal logits.
// REQUIRES: as for the forward.
void SoftmaxCrossEntropyBackward(const CpuContext& ctx, const float* logits,
                                 const int32_t* labels, int64_t batch,
                                 int64_t classes, float* dlogits);

// The forward with the CUDA op's signature (kernels/device.h): writes the
// mean loss to *loss.
void SoftmaxCrossEntropyForward(const CpuContext& ctx, const float* logits,
                                const int32_t* labels, int64_t batch,
                                int64_t classes, float* loss);

// Writes to *correct the number of rows of logits[batch, classes] whose
// arg-max (the first, on ties) is the label.
void CountCorrect(const CpuContext& ctx, const float* logits,
                  const int32_t* labels, int64_t batch, int64_t classes,
                  int32_t* correct);

// acc[i] += x[i] over n elements.
void Accumulate(const CpuContext& ctx, const float* x, float* acc, int64_t n);

}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_OPS_H_
