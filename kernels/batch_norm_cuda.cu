// Batch norm on the GPU: per-channel sums by the column-reduction kernel of
// cuda_launch.cuh, element-wise work by the functors of layer_functors.h.
#include <algorithm>

#include "glog/logging.h"
#include "kernels/cuda_launch.cuh"
#include "kernels/layer_functors.h"
#include "kernels/layers_cuda.h"

namespace psrt {
namespace kernels {
namespace {

using cuda::ColumnSums;
using cuda::ScaledValue;

struct SquaredDeviation {
  const float* x;
  int64_t cols;
  const float* mean;
  __device__ float operator()(int64_t r, int64_t c) const {
    const float d = x[r * cols + c] - mean[c];
    return d * d;
  }
};

// dy * xhat, xhat = (x - mean) * inv_std with a mean and inv_std per
// channel (batch norm) or per row (`per_row`: layer norm).
struct GradTimesNormalized {
  const float* x;
  const float* dy;
  int64_t cols;
  const float* mean;
  const float* inv_std;
  bool per_row;
  __device__ float operator()(int64_t r, int64_t c) const {
    const int64_t i = r * cols + c;
    const int64_t s = per_row ? r : c;
    return dy[i] * ((x[i] - mean[s]) * inv_std[s]);
  }
};

// Layer norm's per-row terms, for ColumnSums over the transposed view: its
// "row" k is a channel, its "column" r a row of x, so out[r] = the mean
// over the channels of row r.
struct RowMeanTerm {
  const float* x;  // [rows, cols]
  int64_t cols;
  const float* center;  // [rows]: (x - center)^2 when not null, else x.
  __device__ float operator()(int64_t k, int64_t r) const {
    const float v = x[r * cols + k];
    if (center == nullptr) return v / static_cast<float>(cols);
    const float d = v - center[r];
    return d * d / static_cast<float>(cols);
  }
};

// Layer norm's g = dy * gamma (and g * xhat when `mean` is not null), over
// the channels, for ColumnSums over the transposed view.
struct RowGradTerm {
  const float* x;
  const float* dy;
  const float* gamma;
  int64_t cols;
  const float* mean;
  const float* inv_std;
  __device__ float operator()(int64_t k, int64_t r) const {
    const int64_t i = r * cols + k;
    const float g = dy[i] * gamma[k] / static_cast<float>(cols);
    return mean == nullptr ? g : g * ((x[i] - mean[r]) * inv_std[r]);
  }
};

void CheckShape(const LayerNormShape& s) {
  CHECK(s.rows >= 1 && s.channels >= 1)
      << "bad LayerNormShape: rows=" << s.rows << " channels=" << s.channels;
}

void CheckShape(const BatchNormShape& s) {
  CHECK(s.rows >= 1 && s.channels >= 1)
      << "bad BatchNormShape: rows=" << s.rows << " channels=" << s.channels;
}

}  // namespace

void BatchNormTrainingForward(const CudaContext& ctx, const BatchNormShape& s,
                              const float* x, const float* gamma,
                              const float* beta, float* moving_mean,
                              float* moving_var, float* saved_mean,
                              float* saved_inv_std, float* y) {
  CheckShape(s);
  CHECK_EQ(moving_mean == nullptr, moving_var == nullptr);
  const int64_t cols = s.channels;
  ColumnSums(ctx, s.rows, cols,
             ScaledValue{x, cols, 1.0f / static_cast<float>(s.rows)},
             saved_mean);
  ColumnSums(ctx, s.rows, cols, SquaredDeviation{x, cols, saved_mean},
             saved_inv_std);
  cuda::LaunchForEachIndex(
      ctx, cols,
      functor::BatchNormFinalize{s.rows, s.epsilon, s.momentum, s.bessel, saved_mean,
                                 saved_inv_std, moving_mean, moving_var});
  cuda::LaunchForEachRowCol(
      ctx, s.rows, cols,
      functor::BatchNormApply{x, saved_mean, saved_inv_std, gamma, beta, cols,
                              y});
}

void BatchNormTrainingBackward(const CudaContext& ctx, const BatchNormShape& s,
                               const float* x, const float* dy,
                               const float* gamma, const float* saved_mean,
                               const float* saved_inv_std, float* dx,
                               float* dgamma, float* dbeta) {
  CheckShape(s);
  const int64_t cols = s.channels;
  ColumnSums(ctx, s.rows, cols, ScaledValue{dy, cols, 1.0f}, dbeta);
  ColumnSums(ctx, s.rows, cols,
             GradTimesNormalized{x, dy, cols, saved_mean, saved_inv_std, /*per_row=*/false},
             dgamma);
  if (dx == nullptr) return;
  cuda::LaunchForEachRowCol(
      ctx, s.rows, cols,
      functor::BatchNormGrad{x, dy, saved_mean, saved_inv_std, gamma, dgamma,
                             dbeta, 1.0f / static_cast<float>(s.rows), cols,
                             dx});
}

void BatchNormInferenceForward(const CudaContext& ctx, const BatchNormShape& s,
                               const float* x, const float* gamma,
                               const float* beta, const float* moving_mean,
                               const float* moving_var, float* y) {
  CheckShape(s);
  cuda::LaunchForEachRowCol(
      ctx, s.rows, s.channels,
      functor::BatchNormInference{x, moving_mean, moving_var, s.epsilon, gamma,
                                  beta, s.channels, y});
}

void LayerNormForward(const CudaContext& ctx, const LayerNormShape& s, const float* x,
                      const float* gamma, const float* beta, float* saved_mean,
                      float* saved_inv_std, float* y) {
  CheckShape(s);
  const int64_t cols = s.channels;
  ColumnSums(ctx, cols, s.rows, RowMeanTerm{x, cols, nullptr}, saved_mean);
  ColumnSums(ctx, cols, s.rows, RowMeanTerm{x, cols, saved_mean}, saved_inv_std);
  cuda::LaunchForEachIndex(ctx, s.rows, functor::LayerNormFinalize{s.epsilon, saved_inv_std});
  cuda::LaunchForEachRowCol(
      ctx, s.rows, cols,
      functor::LayerNormApply{x, saved_mean, saved_inv_std, gamma, beta, cols, y});
}

void LayerNormBackward(const CudaContext& ctx, const LayerNormShape& s, const float* x,
                       const float* dy, const float* gamma, const float* saved_mean,
                       const float* saved_inv_std, float* row_scratch, float* dx,
                       float* dgamma, float* dbeta) {
  CheckShape(s);
  const int64_t cols = s.channels;
  ColumnSums(ctx, s.rows, cols, ScaledValue{dy, cols, 1.0f}, dbeta);
  ColumnSums(ctx, s.rows, cols,
             GradTimesNormalized{x, dy, cols, saved_mean, saved_inv_std, /*per_row=*/true},
             dgamma);
  if (dx == nullptr) return;
  float* g_mean = row_scratch;
  float* gx_mean = row_scratch + s.rows;
  ColumnSums(ctx, cols, s.rows, RowGradTerm{x, dy, gamma, cols, nullptr, nullptr}, g_mean);
  ColumnSums(ctx, cols, s.rows, RowGradTerm{x, dy, gamma, cols, saved_mean, saved_inv_std},
             gx_mean);
  cuda::LaunchForEachRowCol(
      ctx, s.rows, cols,
      functor::LayerNormGrad{x, dy, saved_mean, saved_inv_std, gamma, g_mean, gx_mean, cols,
                             dx});
}

}  // namespace kernels
}  // namespace psrt
