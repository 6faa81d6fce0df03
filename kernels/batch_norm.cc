#include "kernels/batch_norm.h"

#include <algorithm>

#include "glog/logging.h"
#include "kernels/elementwise.h"
#include "kernels/layer_functors.h"

namespace psrt {
namespace kernels {
namespace {

constexpr int64_t kElementGrain = 1 << 14;
// Columns summed together in registers/L1 by one pass over the rows.
constexpr int64_t kColumnBlock = 64;

void CheckShape(const BatchNormShape& s) {
  CHECK(s.rows >= 1 && s.channels >= 1)
      << "bad BatchNormShape: rows=" << s.rows << " channels=" << s.channels;
}

// For every column c, out[c] = sum over rows of f(r, c), in double,
// parallel over blocks of columns (each thread reads only its columns, so
// there are no partial sums to combine).
template <class F>
void ColumnSums(const CpuContext& ctx, int64_t rows, int64_t cols, const F& f,
                float* out) {
  const int64_t grain =
      std::max<int64_t>(16, kElementGrain / std::max<int64_t>(rows, 1));
  ctx.ParallelFor(cols, grain, [&](int64_t begin, int64_t end) {
    for (int64_t c0 = begin; c0 < end; c0 += kColumnBlock) {
      const int64_t c1 = std::min(end, c0 + kColumnBlock);
      double acc[kColumnBlock] = {};
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = c0; c < c1; ++c) acc[c - c0] += f(r, c);
      }
      for (int64_t c = c0; c < c1; ++c)
        out[c] = static_cast<float>(acc[c - c0]);
    }
  });
}

template <class F>
void RunRowCol(const CpuContext& ctx, int64_t rows, int64_t cols, const F& f) {
  ctx.ParallelFor(
      rows, std::max<int64_t>(1, kElementGrain / cols),
      [&](int64_t begin, int64_t end) { ForEachRowCol(begin, end, cols, f); });
}

}  // namespace

void BatchNormTrainingForward(const CpuContext& ctx, const BatchNormShape& s,
                              const float* x, const float* gamma,
                              const float* beta, float* moving_mean,
                              float* moving_var, float* saved_mean,
                              float* saved_inv_std, float* y) {
  CheckShape(s);
  CHECK_EQ(moving_mean == nullptr, moving_var == nullptr)
      << "update both moving statistics or neither";
  const int64_t cols = s.channels;
  const double inv_rows = 1.0 / static_cast<double>(s.rows);
  ColumnSums(
      ctx, s.rows, cols,
      [&](int64_t r, int64_t c) { return double(x[r * cols + c]) * inv_rows; },
      saved_mean);
  ColumnSums(
      ctx, s.rows, cols,
      [&](int64_t r, int64_t c) {
        const double d = double(x[r * cols + c]) - saved_mean[c];
        return d * d;
      },
      saved_inv_std);
  ForEachIndex(
      0, cols,
      functor::BatchNormFinalize{s.rows, s.epsilon, s.momentum, s.bessel, saved_mean,
                                 saved_inv_std, moving_mean, moving_var});
  RunRowCol(ctx, s.rows, cols,
            functor::BatchNormApply{x, saved_mean, saved_inv_std, gamma, beta,
                                    cols, y});
}

void BatchNormTrainingBackward(const CpuContext& ctx, const BatchNormShape& s,
                               const float* x, const float* dy,
                               const float* gamma, const float* saved_mean,
                               const float* saved_inv_std, float* dx,
                               float* dgamma, float* dbeta) {
  CheckShape(s);
  const int64_t cols = s.channels;
  ColumnSums(
      ctx, s.rows, cols,
      [&](int64_t r, int64_t c) { return double(dy[r * cols + c]); }, dbeta);
  ColumnSums(
      ctx, s.rows, cols,
      [&](int64_t r, int64_t c) {
        const int64_t i = r * cols + c;
        return double(dy[i]) * ((x[i] - saved_mean[c]) * saved_inv_std[c]);
      },
      dgamma);
  if (dx == nullptr) return;
  RunRowCol(ctx, s.rows, cols,
            functor::BatchNormGrad{
                x, dy, saved_mean, saved_inv_std, gamma, dgamma, dbeta,
                1.0f / static_cast<float>(s.rows), cols, dx});
}

void BatchNormInferenceForward(const CpuContext& ctx, const BatchNormShape& s,
                               const float* x, const float* gamma,
                               const float* beta, const float* moving_mean,
                               const float* moving_var, float* y) {
  CheckShape(s);
  RunRowCol(ctx, s.rows, s.channels,
            functor::BatchNormInference{x, moving_mean, moving_var, s.epsilon,
                                        gamma, beta, s.channels, y});
}

}  // namespace kernels
}  // namespace psrt
