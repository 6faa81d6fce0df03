#include "kernels/ops.h"

#include <algorithm>

#include "Eigen/Core"
#include "glog/logging.h"
#include "kernels/elementwise.h"
#include "kernels/functors.h"
#include "kernels/matmul_backward.h"

namespace psrt {
namespace kernels {
namespace {

template <int Order>
using MatrixMap = Eigen::Map<
    const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Order>>;
using RowMajorMap = Eigen::Map<
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

// Element-wise ops split into blocks of at least this many elements; below
// that a thread hand-off costs more than it saves.
constexpr int64_t kElementGrain = 1 << 15;
// GEMMs with fewer multiply-adds than this run on one thread.
constexpr int64_t kMinParallelGemmWork = 1 << 18;
// Rows or columns per GEMM block: a multiple of Eigen's register blocking.
constexpr int64_t kGemmGrain = 32;

// c = alpha * a * b + beta * c for one block (Eigen's single-threaded GEMM).
template <class A, class B, class C>
void GemmBlock(float alpha, const A& a, const B& b, float beta, C&& c) {
  if (beta == 0.0f) {
    c.noalias() = alpha * a * b;
    return;
  }
  if (beta != 1.0f) c *= beta;
  c.noalias() += alpha * a * b;
}

// Splits c = op(a) * op(b) along its larger dimension: column blocks of c
// pair with column blocks of op(b), row blocks with row blocks of op(a).
template <class A, class B>
void ParallelGemm(const CpuContext& ctx, const MatMulShape& s, float alpha,
                  const A& a, const B& b, float beta, float* c_data) {
  RowMajorMap c(c_data, s.m, s.n);
  const bool small = s.m * s.n * s.k < kMinParallelGemmWork;
  if (s.n >= s.m) {
    ctx.ParallelFor(s.n, small ? s.n : kGemmGrain,
                    [&](int64_t begin, int64_t end) {
                      GemmBlock(alpha, a, b.middleCols(begin, end - begin),
                                beta, c.middleCols(begin, end - begin));
                    });
  } else {
    ctx.ParallelFor(s.m, small ? s.m : kGemmGrain,
                    [&](int64_t begin, int64_t end) {
                      GemmBlock(alpha, a.middleRows(begin, end - begin), b,
                                beta, c.middleRows(begin, end - begin));
                    });
  }
}

// The four storage orders of (a, b) as Eigen maps, handed to fn(a, b).
template <class Fn>
void WithOperands(const MatMulShape& s, const float* a, const float* b,
                  Fn&& fn) {
  auto with_a = [&](const auto& bm) {
    if (s.transpose_a) {
      fn(MatrixMap<Eigen::ColMajor>(a, s.m, s.k), bm);
    } else {
      fn(MatrixMap<Eigen::RowMajor>(a, s.m, s.k), bm);
    }
  };
  if (s.transpose_b) {
    with_a(MatrixMap<Eigen::ColMajor>(b, s.k, s.n));
  } else {
    with_a(MatrixMap<Eigen::RowMajor>(b, s.k, s.n));
  }
}

void CheckGemmShape(const MatMulShape& shape) {
  CHECK(shape.m >= 0 && shape.n >= 0 && shape.k >= 0)
      << "negative GEMM dimension: m=" << shape.m << " n=" << shape.n
      << " k=" << shape.k;
}

}  // namespace

void GemmOnCallingThread(const MatMulShape& shape, float alpha, const float* a,
                         const float* b, float beta, float* c) {
  CheckGemmShape(shape);
  if (shape.m == 0 || shape.n == 0) return;
  WithOperands(shape, a, b, [&](const auto& am, const auto& bm) {
    GemmBlock(alpha, am, bm, beta, RowMajorMap(c, shape.m, shape.n));
  });
}

void Gemm(const CpuContext& ctx, const MatMulShape& shape, float alpha,
          const float* a, const float* b, float beta, float* c) {
  CheckGemmShape(shape);
  if (shape.m == 0 || shape.n == 0) return;
  WithOperands(shape, a, b, [&](const auto& am, const auto& bm) {
    ParallelGemm(ctx, shape, alpha, am, bm, beta, c);
  });
}

void MatMulForward(const CpuContext& ctx, const MatMulShape& shape,
                   const float* a, const float* b, float* c) {
  Gemm(ctx, shape, 1.0f, a, b, 0.0f, c);
}

void MatMulBackward(const CpuContext& ctx, const MatMulShape& shape,
                    const float* a, const float* b, const float* dc, float* da,
                    float* db) {
  internal::MatMulBackwardWith(ctx, shape, a, b, dc, da, db);
}

void BiasAddForward(const CpuContext& ctx, const float* x, const float* bias,
                    int64_t rows, int64_t cols, float* y) {
  const functor::BiasAdd f{x, bias, cols, y};
  ctx.ParallelFor(
      rows, std::max<int64_t>(1, kElementGrain / std::max<int64_t>(cols, 1)),
      [&](int64_t begin, int64_t end) { ForEachRowCol(begin, end, cols, f); });
}

void BiasAddBackward(const CpuContext& ctx, const float* dy, int64_t rows,
                     int64_t cols, float* dbias) {
  // Row by row, so that every read is contiguous (the GPU sums by column).
  Eigen::Map<Eigen::ArrayXf> sum(dbias, cols);
  sum.setZero();
  for (int64_t r = 0; r < rows; ++r) {
    sum += Eigen::Map<const Eigen::ArrayXf>(dy + r * cols, cols);
  }
}

void ReluForward(const CpuContext& ctx, const float* x, int64_t n, float* y) {
  const functor::Relu f{x, y};
  ctx.ParallelFor(n, kElementGrain, [&](int64_t begin, int64_t end) {
    ForEachIndex(begin, end, f);
  });
}

void ReluBackward(const CpuContext& ctx, const float* y, const float* dy,
                  int64_t n, float* dx) {
  const functor::ReluGrad f{y, dy, dx};
  ctx.ParallelFor(n, kElementGrain, [&](int64_t begin, int64_t end) {
    ForEachIndex(begin, end, f);
  });
}

namespace {

void CheckSoftmaxArgs(const int32_t* labels, int64_t batch, int64_t classes) {
  CHECK_GE(batch, 1);
  CHECK_GE(classes, 1);
  for (int64_t i = 0; i < batch; ++i) {
    CHECK(labels[i] >= 0 && labels[i] < classes)
        << "label " << labels[i] << " of example " << i << " is outside [0, "
        << classes << ")";
  }
}

}  // namespace

float SoftmaxCrossEntropyForward(const CpuContext& ctx, const float* logits,
                                 const int32_t* labels, int64_t batch,
                                 int64_t classes) {
  CheckSoftmaxArgs(labels, batch, classes);
  const functor::SoftmaxCrossEntropyRow f{logits, labels, batch, classes,
                                          /*dlogits=*/nullptr};
  double loss = 0.0;
  for (int64_t r = 0; r < batch; ++r) loss += f(r);
  return static_cast<float>(loss);
}

void SoftmaxCrossEntropyBackward(const CpuContext& ctx, const float* logits,
                                 const int32_t* labels, int64_t batch,
                                 int64_t classes, float* dlogits) {
  CheckSoftmaxArgs(labels, batch, classes);
  const functor::SoftmaxCrossEntropyRow f{logits, labels, batch, classes,
                                          dlogits};
  ctx.ParallelFor(batch, std::max<int64_t>(1, kElementGrain / classes),
                  [&](int64_t begin, int64_t end) {
                    for (int64_t r = begin; r < end; ++r) f(r);
                  });
}

}  // namespace kernels
}  // namespace psrt
