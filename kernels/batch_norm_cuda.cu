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

struct GradTimesNormalized {
  const float* x;
  const float* dy;
  int64_t cols;
  const float* mean;
  const float* inv_std;
  __device__ float operator()(int64_t r, int64_t c) const {
    const int64_t i = r * cols + c;
    return dy[i] * ((x[i] - mean[c]) * inv_std[c]);
  }
};

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
             GradTimesNormalized{x, dy, cols, saved_mean, saved_inv_std},
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

}  // namespace kernels
}  // namespace psrt
