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

// Element-wise ops split into blocks of at least this many elements; below
// that a thread hand-off costs more than it saves.
constexpr int64_t kElementGrain = 1 << 15;

}  // namespace

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
  // Row by row, so that reads are contiguous (the GPU sums by column);
  // threads take blocks of 16 columns (a cache line of each row), so that
  // each reads only its own lines.
  constexpr int64_t kColumnBlock = 16;
  const int64_t blocks = (cols + kColumnBlock - 1) / kColumnBlock;
  const int64_t grain = std::max<int64_t>(
      1, kElementGrain / std::max<int64_t>(rows * kColumnBlock, 1));
  ctx.ParallelFor(blocks, grain, [&](int64_t begin, int64_t end) {
    const int64_t c0 = begin * kColumnBlock;
    const int64_t width = std::min(cols, end * kColumnBlock) - c0;
    Eigen::Map<Eigen::ArrayXf> sum(dbias + c0, width);
    sum.setZero();
    for (int64_t r = 0; r < rows; ++r) {
      sum += Eigen::Map<const Eigen::ArrayXf>(dy + r * cols + c0, width);
    }
  });
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

void SoftmaxCrossEntropyForward(const CpuContext& ctx, const float* logits,
                                const int32_t* labels, int64_t batch,
                                int64_t classes, float* loss) {
  *loss = SoftmaxCrossEntropyForward(ctx, logits, labels, batch, classes);
}

void CountCorrect(const CpuContext& ctx, const float* logits,
                  const int32_t* labels, int64_t batch, int64_t classes,
                  int32_t* correct) {
  const functor::CorrectPrediction f{logits, labels, classes};
  int32_t n = 0;
  for (int64_t r = 0; r < batch; ++r) n += f(r);
  *correct = n;
}

void Accumulate(const CpuContext& ctx, const float* x, float* acc, int64_t n) {
  Accumulate(absl::MakeConstSpan(x, n), absl::MakeSpan(acc, n));
}

}  // namespace kernels
}  // namespace psrt
