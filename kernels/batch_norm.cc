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

namespace {

void CheckShape(const LayerNormShape& s) {
  CHECK(s.rows >= 1 && s.channels >= 1)
      << "bad LayerNormShape: rows=" << s.rows << " channels=" << s.channels;
}

// For every row r, out[r] = the mean over the columns of f(r, c), in
// double, parallel over rows.
template <class F>
void RowMeans(const CpuContext& ctx, int64_t rows, int64_t cols, const F& f, float* out) {
  ctx.ParallelFor(rows, std::max<int64_t>(1, kElementGrain / cols),
                  [&](int64_t begin, int64_t end) {
                    for (int64_t r = begin; r < end; ++r) {
                      double sum = 0;
                      for (int64_t c = 0; c < cols; ++c) sum += f(r, c);
                      out[r] = static_cast<float>(sum / static_cast<double>(cols));
                    }
                  });
}

}  // namespace

void LayerNormForward(const CpuContext& ctx, const LayerNormShape& s, const float* x,
                      const float* gamma, const float* beta, float* saved_mean,
                      float* saved_inv_std, float* y) {
  CheckShape(s);
  const int64_t cols = s.channels;
  RowMeans(ctx, s.rows, cols, [&](int64_t r, int64_t c) { return double(x[r * cols + c]); },
           saved_mean);
  RowMeans(
      ctx, s.rows, cols,
      [&](int64_t r, int64_t c) {
        const double d = double(x[r * cols + c]) - saved_mean[r];
        return d * d;
      },
      saved_inv_std);
  ForEachIndex(0, s.rows, functor::LayerNormFinalize{s.epsilon, saved_inv_std});
  RunRowCol(ctx, s.rows, cols,
            functor::LayerNormApply{x, saved_mean, saved_inv_std, gamma, beta, cols, y});
}

void LayerNormBackward(const CpuContext& ctx, const LayerNormShape& s, const float* x,
                       const float* dy, const float* gamma, const float* saved_mean,
                       const float* saved_inv_std, float* row_scratch, float* dx,
                       float* dgamma, float* dbeta) {
  CheckShape(s);
  const int64_t cols = s.channels;
  auto xhat = [&](int64_t r, int64_t c) {
    return (x[r * cols + c] - saved_mean[r]) * saved_inv_std[r];
  };
  ColumnSums(
      ctx, s.rows, cols, [&](int64_t r, int64_t c) { return double(dy[r * cols + c]); },
      dbeta);
  ColumnSums(
      ctx, s.rows, cols,
      [&](int64_t r, int64_t c) { return double(dy[r * cols + c]) * xhat(r, c); }, dgamma);
  if (dx == nullptr) return;
  float* g_mean = row_scratch;
  float* gx_mean = row_scratch + s.rows;
  RowMeans(
      ctx, s.rows, cols,
      [&](int64_t r, int64_t c) { return double(dy[r * cols + c]) * gamma[c]; }, g_mean);
  RowMeans(
      ctx, s.rows, cols,
      [&](int64_t r, int64_t c) { return double(dy[r * cols + c]) * gamma[c] * xhat(r, c); },
      gx_mean);
  RunRowCol(ctx, s.rows, cols,
            functor::LayerNormGrad{x, dy, saved_mean, saved_inv_std, gamma, g_mean, gx_mean,
                                   cols, dx});
}

}  // namespace kernels
}  // namespace psrt
