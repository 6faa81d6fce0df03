// Launch helpers shared by the .cu files of kernels/ (error checks are in
// cuda_check.h): the grid-stride kernels that run the functors of
// functors.h and layer_functors.h one index (or one (row, column) pair) per
// thread, and a column-sum reduction (bias and batch-norm gradients, batch
// statistics).
// Internal to kernels/; included only by .cu files.
#ifndef PSRT_KERNELS_CUDA_LAUNCH_CUH_
#define PSRT_KERNELS_CUDA_LAUNCH_CUH_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "glog/logging.h"
#include "kernels/cuda_check.h"
#include "kernels/ops_cuda.h"

namespace psrt {
namespace kernels {
namespace cuda {

constexpr int kThreadsPerBlock = 256;
constexpr int64_t kMaxBlocks = 8192;  // Grid-stride loops cover the rest.

inline int BlocksFor(int64_t n) {
  return static_cast<int>(
      std::min(kMaxBlocks, (n + kThreadsPerBlock - 1) / kThreadsPerBlock));
}

template <class F>
__global__ void ForEachIndexKernel(int64_t n, F f) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    f(i);
  }
}

// Whether a grid-stride loop over n indices may count in 32 bits: 64-bit
// division costs the GPU several times more than 32-bit, and the kernels
// below divide once per index.
inline bool FitsUint32Loop(int64_t n) {
  return n + kMaxBlocks * kThreadsPerBlock < (int64_t{1} << 32);
}

template <class F>
__global__ void ForEachRowColKernel(int64_t rows, int64_t cols, F f, bool narrow) {
  const int64_t n = rows * cols;
  if (narrow) {
    const uint32_t n32 = static_cast<uint32_t>(n), cols32 = static_cast<uint32_t>(cols);
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n32; i += blockDim.x * gridDim.x) {
      const uint32_t r = i / cols32;
      f(r, i - r * cols32);
    }
    return;
  }
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    f(i / cols, i % cols);
  }
}

// For the pool functors, which take (pixel, channel_begin, channel_end):
// one channel per thread.
template <class F>
__global__ void ForEachPixelChannelKernel(int64_t pixels, int64_t channels, F f, bool narrow) {
  const int64_t n = pixels * channels;
  if (narrow) {
    const uint32_t n32 = static_cast<uint32_t>(n), channels32 = static_cast<uint32_t>(channels);
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n32; i += blockDim.x * gridDim.x) {
      const uint32_t q = i / channels32;
      const int64_t c = i - q * channels32;
      f(q, c, c + 1);
    }
    return;
  }
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    const int64_t c = i % channels;
    f(i / channels, c, c + 1);
  }
}

template <class F>
void LaunchForEachIndex(const CudaContext& ctx, int64_t n, const F& f) {
  if (n <= 0) return;
  ForEachIndexKernel<<<BlocksFor(n), kThreadsPerBlock, 0, ctx.stream()>>>(n, f);
  PSRT_CUDA_RECORD(ctx, cudaGetLastError());
}

template <class F>
void LaunchForEachRowCol(const CudaContext& ctx, int64_t rows, int64_t cols,
                         const F& f) {
  if (rows * cols <= 0) return;
  ForEachRowColKernel<<<BlocksFor(rows * cols), kThreadsPerBlock, 0, ctx.stream()>>>(
      rows, cols, f, FitsUint32Loop(rows * cols));
  PSRT_CUDA_RECORD(ctx, cudaGetLastError());
}

template <class F>
void LaunchForEachPixelChannel(const CudaContext& ctx, int64_t pixels,
                               int64_t channels, const F& f) {
  if (pixels * channels <= 0) return;
  ForEachPixelChannelKernel<<<BlocksFor(pixels * channels), kThreadsPerBlock, 0, ctx.stream()>>>(
      pixels, channels, f, FitsUint32Loop(pixels * channels));
  PSRT_CUDA_RECORD(ctx, cudaGetLastError());
}

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
  PSRT_CUDA_RECORD(ctx, cudaMemsetAsync(out, 0, cols * sizeof(float), ctx.stream()));
  const dim3 block(kColumnsPerBlock, kRowsPerBlock);
  const int64_t strips = (cols + kColumnsPerBlock - 1) / kColumnsPerBlock;
  const int64_t row_blocks = std::min<int64_t>(
      (rows + kRowsPerBlock * 16 - 1) / (kRowsPerBlock * 16), 1024);
  const dim3 grid(static_cast<unsigned>(strips),
                  static_cast<unsigned>(std::max<int64_t>(row_blocks, 1)));
  ColumnSumKernel<<<grid, block, 0, ctx.stream()>>>(rows, cols, f, out);
  PSRT_CUDA_RECORD(ctx, cudaGetLastError());
}

struct ScaledValue {
  const float* x;
  int64_t cols;
  float scale;
  __device__ float operator()(int64_t r, int64_t c) const {
    return x[r * cols + c] * scale;
  }
};

}  // namespace cuda
}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_CUDA_LAUNCH_CUH_
