// Batch norm on the GPU: per-channel sums by a column-reduction kernel,
// element-wise work by the functors of layer_functors.h.
#include <algorithm>

#include "glog/logging.h"
#include "kernels/cuda_launch.cuh"
#include "kernels/layer_functors.h"
#include "kernels/layers_cuda.h"

namespace psrt {
namespace kernels {
namespace {

constexpr int kColumnsPerBlock = 32;
constexpr int kRowsPerBlock = 8;

// out[c] += sum over rows of f(r, c): each block sums a 32-column strip
// over a stride of rows, reduces its 8 row lanes in shared memory and adds
// the result with one atomic per column. Coalesced: a warp reads 32
// consecutive columns of a row.
template <class F>
__global__ void ColumnSumKernel(int64_t rows, int64_t cols, F f, float* out) {
  __shared__ float partial[kRowsPerBlock][kColumnsPerBlock + 1];
  const int64_t c = blockIdx.x * int64_t{kColumnsPerBlock} + threadIdx.x;
  float sum = 0.0f;
  if (c < cols) {
    for (int64_t r = blockIdx.y * int64_t{kRowsPerBlock} + threadIdx.y;
         r < rows; r += int64_t{gridDim.y} * kRowsPerBlock) {
      sum += f(r, c);
    }
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0.0f;
    for (int i = 0; i < kRowsPerBlock; ++i) total += partial[i][threadIdx.x];
    atomicAdd(out + c, total);
  }
}

// Overwrites out[cols] with the column sums of f.
template <class F>
void ColumnSums(const CudaContext& ctx, int64_t rows, int64_t cols, const F& f,
                float* out) {
  PSRT_CUDA_CHECK(cudaMemsetAsync(out, 0, cols * sizeof(float), ctx.stream()));
  const dim3 block(kColumnsPerBlock, kRowsPerBlock);
  const int64_t strips = (cols + kColumnsPerBlock - 1) / kColumnsPerBlock;
  const int64_t row_blocks = std::min<int64_t>(
      (rows + kRowsPerBlock * 16 - 1) / (kRowsPerBlock * 16), 1024);
  const dim3 grid(static_cast<unsigned>(strips),
                  static_cast<unsigned>(std::max<int64_t>(row_blocks, 1)));
  ColumnSumKernel<<<grid, block, 0, ctx.stream()>>>(rows, cols, f, out);
  PSRT_CUDA_CHECK(cudaGetLastError());
}

struct ScaledValue {
  const float* x;
  int64_t cols;
  float scale;
  __device__ float operator()(int64_t r, int64_t c) const {
    return x[r * cols + c] * scale;
  }
};

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
      functor::BatchNormFinalize{s.rows, s.epsilon, s.momentum, saved_mean,
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
