// Concat, dropout and L2 loss on the GPU.
#include "glog/logging.h"
#include "kernels/cuda_launch.cuh"
#include "kernels/layer_functors.h"
#include "kernels/layers_cuda.h"

namespace psrt {
namespace kernels {
namespace {

// *loss += sum over the block's share of x[i]^2 / 2: a grid-stride sum per
// thread, a shared-memory tree per block, one atomic per block.
__global__ void HalfSquaredSumKernel(const float* x, int64_t n, float* loss) {
  __shared__ float partial[cuda::kThreadsPerBlock];
  float sum = 0.0f;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    sum += x[i] * x[i];
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(loss, partial[0] * 0.5f);
}

int64_t TotalChannels(absl::Span<const int64_t> channels) {
  int64_t total = 0;
  for (int64_t c : channels) {
    CHECK_GE(c, 1);
    total += c;
  }
  return total;
}

}  // namespace

void ConcatChannelsForward(const CudaContext& ctx, int64_t pixels,
                           absl::Span<const float* const> inputs,
                           absl::Span<const int64_t> channels, float* y) {
  CHECK_EQ(inputs.size(), channels.size());
  const int64_t total = TotalChannels(channels);
  int64_t offset = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    cuda::LaunchForEachRowCol(
        ctx, pixels, channels[i],
        functor::CopyColumns{inputs[i], channels[i], 0, y, total, offset});
    offset += channels[i];
  }
}

void ConcatChannelsBackward(const CudaContext& ctx, int64_t pixels,
                            const float* dy, absl::Span<const int64_t> channels,
                            absl::Span<float* const> dinputs) {
  CHECK_EQ(dinputs.size(), channels.size());
  const int64_t total = TotalChannels(channels);
  int64_t offset = 0;
  for (size_t i = 0; i < dinputs.size(); ++i) {
    if (dinputs[i] != nullptr) {
      cuda::LaunchForEachRowCol(
          ctx, pixels, channels[i],
          functor::CopyColumns{dy, total, offset, dinputs[i], channels[i], 0});
    }
    offset += channels[i];
  }
}

void ChannelAffineForward(const CudaContext& ctx, const float* x, const float* scale,
                          const float* offset, int64_t pixels, int64_t channels, float* y) {
  cuda::LaunchForEachRowCol(ctx, pixels, channels,
                            functor::ChannelAffine{x, scale, offset, channels, y});
}

void MultiplyForward(const CudaContext& ctx, const MultiplyShape& s, const float* a,
                     const float* b, float* y) {
  cuda::LaunchForEachRowCol(ctx, s.batch * s.pixels, s.channels,
                            functor::Multiply{a, b, s.pixels, s.channels, s.broadcast, y});
}

void MultiplyBackward(const CudaContext& ctx, const MultiplyShape& s, const float* a,
                      const float* b, const float* dy, float* da, float* db) {
  if (da != nullptr) MultiplyForward(ctx, s, dy, b, da);
  if (db == nullptr) return;
  if (!s.broadcast) {
    MultiplyForward(ctx, s, dy, a, db);
    return;
  }
  cuda::ColumnSums(ctx, s.pixels, s.batch * s.channels,
                   functor::MultiplyBroadcastGradTerm{dy, a, s.pixels, s.channels}, db);
}

void ZeroPad2DForward(const CudaContext& ctx, const Pad2DShape& s, const float* x, float* y) {
  CopyImageWindow(ctx, x, s.batch, s.in_height, s.in_width, s.channels, s.out_height(),
                  s.out_width(), s.top, s.left, y);
}

void ZeroPad2DBackward(const CudaContext& ctx, const Pad2DShape& s, const float* dy,
                       float* dx) {
  CopyImageWindow(ctx, dy, s.batch, s.out_height(), s.out_width(), s.channels, s.in_height,
                  s.in_width, -s.top, -s.left, dx);
}

void DropoutForward(const CudaContext& ctx, const float* x, int64_t n,
                    float keep_prob, uint64_t seed, float* y, const DropoutNoise& noise) {
  CHECK(keep_prob > 0.0f && keep_prob <= 1.0f);
  cuda::LaunchForEachIndex(ctx, n, functor::Dropout{x, keep_prob, seed, noise, y});
}

void DropoutBackward(const CudaContext& ctx, const float* dy, int64_t n,
                     float keep_prob, uint64_t seed, float* dx, const DropoutNoise& noise) {
  DropoutForward(ctx, dy, n, keep_prob, seed, dx, noise);
}

void L2LossForward(const CudaContext& ctx, const float* x, int64_t n,
                   float* loss) {
  PSRT_CUDA_RECORD(ctx, cudaMemsetAsync(loss, 0, sizeof(float), ctx.stream()));
  if (n <= 0) return;
  HalfSquaredSumKernel<<<cuda::BlocksFor(n), cuda::kThreadsPerBlock, 0,
                         ctx.stream()>>>(x, n, loss);
  PSRT_CUDA_RECORD(ctx, cudaGetLastError());
}

void L2LossBackward(const CudaContext& ctx, const float* x, int64_t n,
                    float dloss, float* dx) {
  cuda::LaunchForEachIndex(ctx, n, functor::L2LossGrad{x, dloss, dx});
}

}  // namespace kernels
}  // namespace psrt
