// Conv2D on the GPU: im2col + cuBLAS, a chunk of the batch at a time.
#include <algorithm>

#include "glog/logging.h"
#include "kernels/cuda_launch.cuh"
#include "kernels/layers_cuda.h"

namespace psrt {
namespace kernels {
namespace {

// Column matrices of at most this many floats (128 MiB) unless one image
// needs more.
constexpr int64_t kMaxColumnFloats = int64_t{1} << 25;

// The derived sizes of a convolution, computed once on the host.
struct ConvGeometry {
  int64_t in_height, in_width, in_channels;
  int64_t filter_height, filter_width, out_channels;
  int64_t stride_height, stride_width;
  int64_t out_height, out_width, pad_top, pad_left;
  int64_t patch;  // filter_height * filter_width * in_channels
  explicit ConvGeometry(const Conv2DShape& s)
      : in_height(s.in_height),
        in_width(s.in_width),
        in_channels(s.in_channels),
        filter_height(s.filter_height),
        filter_width(s.filter_width),
        out_channels(s.out_channels),
        stride_height(s.stride_height),
        stride_width(s.stride_width),
        out_height(s.out_height()),
        out_width(s.out_width()),
        pad_top(s.pad_top()),
        pad_left(s.pad_left()),
        patch(s.filter_height * s.filter_width * s.in_channels) {}
};

// col[row, k] for the rows (n, oh, ow) of `images` images at x: the input
// cell under filter tap k = (kh, kw, ci) of output pixel (oh, ow), or 0 in
// the padding.
__global__ void Im2ColKernel(ConvGeometry g, const float* x, int64_t images,
                             float* col) {
  const int64_t n_total = images * g.out_height * g.out_width * g.patch;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n_total;
       i += int64_t{blockDim.x} * gridDim.x) {
    const int64_t k = i % g.patch;
    const int64_t row = i / g.patch;
    const int64_t ci = k % g.in_channels;
    const int64_t kw = (k / g.in_channels) % g.filter_width;
    const int64_t kh = k / (g.in_channels * g.filter_width);
    const int64_t ow = row % g.out_width;
    const int64_t oh = (row / g.out_width) % g.out_height;
    const int64_t n = row / (g.out_width * g.out_height);
    const int64_t h = oh * g.stride_height - g.pad_top + kh;
    const int64_t w = ow * g.stride_width - g.pad_left + kw;
    col[i] =
        h >= 0 && h < g.in_height && w >= 0 && w < g.in_width
            ? x[((n * g.in_height + h) * g.in_width + w) * g.in_channels + ci]
            : 0.0f;
  }
}

// The adjoint of Im2Col, gathering: dx[n, h, w, ci] = the sum of the
// column-matrix entries copied from that cell. Overwrites dx.
__global__ void Col2ImKernel(ConvGeometry g, const float* col, int64_t images,
                             float* dx) {
  const int64_t n_total = images * g.in_height * g.in_width * g.in_channels;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n_total;
       i += int64_t{blockDim.x} * gridDim.x) {
    const int64_t ci = i % g.in_channels;
    const int64_t w = (i / g.in_channels) % g.in_width;
    const int64_t h = (i / (g.in_channels * g.in_width)) % g.in_height;
    const int64_t n = i / (g.in_channels * g.in_width * g.in_height);
    float sum = 0.0f;
    for (int64_t kh = 0; kh < g.filter_height; ++kh) {
      const int64_t oh_s = h + g.pad_top - kh;  // oh * stride
      if (oh_s < 0 || oh_s % g.stride_height != 0) continue;
      const int64_t oh = oh_s / g.stride_height;
      if (oh >= g.out_height) continue;
      for (int64_t kw = 0; kw < g.filter_width; ++kw) {
        const int64_t ow_s = w + g.pad_left - kw;
        if (ow_s < 0 || ow_s % g.stride_width != 0) continue;
        const int64_t ow = ow_s / g.stride_width;
        if (ow >= g.out_width) continue;
        const int64_t row = (n * g.out_height + oh) * g.out_width + ow;
        sum += col[row * g.patch + (kh * g.filter_width + kw) * g.in_channels +
                   ci];
      }
    }
    dx[i] = sum;
  }
}

int64_t ChunkImages(const Conv2DShape& s, const ConvGeometry& g) {
  const int64_t per_image = g.out_height * g.out_width * g.patch;
  return std::clamp<int64_t>(kMaxColumnFloats / per_image, 1, s.batch);
}

void Im2Col(const CudaContext& ctx, const ConvGeometry& g, const float* x,
            int64_t images, float* col) {
  const int64_t n = images * g.out_height * g.out_width * g.patch;
  Im2ColKernel<<<cuda::BlocksFor(n), cuda::kThreadsPerBlock, 0, ctx.stream()>>>(
      g, x, images, col);
  PSRT_CUDA_RECORD(ctx, cudaGetLastError());
}

void CheckShape(const Conv2DShape& s) {
  CHECK(s.batch > 0 && s.in_height > 0 && s.in_width > 0 && s.in_channels > 0 &&
        s.filter_height > 0 && s.filter_width > 0 && s.out_channels > 0 &&
        s.stride_height > 0 && s.stride_width > 0 && s.out_height() > 0 &&
        s.out_width() > 0)
      << "bad Conv2DShape";
}

}  // namespace

CudaWorkspace::~CudaWorkspace() {
  if (data_ != nullptr) cudaFree(data_);
}

float* CudaWorkspace::Get(const CudaContext& ctx, int64_t size) {
  if (size > capacity_) {
    if (data_ != nullptr) PSRT_CUDA_RECORD(ctx, cudaFree(data_));
    data_ = nullptr;
    capacity_ = 0;
    if (!PSRT_CUDA_RECORD(ctx, cudaMalloc(reinterpret_cast<void**>(&data_),
                                          size * sizeof(float)))) {
      data_ = nullptr;
      return nullptr;
    }
    capacity_ = size;
  }
  return data_;
}

void Conv2DForward(const CudaContext& ctx, const Conv2DShape& s, const float* x,
                   const float* filter, float* y, CudaWorkspace* workspace) {
  CheckShape(s);
  const ConvGeometry g(s);
  const int64_t pixels = g.out_height * g.out_width;
  if (s.is_pointwise()) {
    Gemm(ctx, MatMulShape{s.batch * pixels, s.out_channels, s.in_channels},
         1.0f, x, filter, 0.0f, y);
    return;
  }
  const int64_t chunk = ChunkImages(s, g);
  float* col = workspace->Get(ctx, chunk * pixels * g.patch);
  if (col == nullptr) return;  // Recorded in ctx.
  const int64_t in_image = s.in_height * s.in_width * s.in_channels;
  for (int64_t n = 0; n < s.batch; n += chunk) {
    const int64_t images = std::min(chunk, s.batch - n);
    Im2Col(ctx, g, x + n * in_image, images, col);
    Gemm(ctx, MatMulShape{images * pixels, s.out_channels, g.patch}, 1.0f, col,
         filter, 0.0f, y + n * pixels * s.out_channels);
  }
}

void Conv2DBackward(const CudaContext& ctx, const Conv2DShape& s,
                    const float* x, const float* filter, const float* dy,
                    float* dx, float* dfilter, CudaWorkspace* workspace) {
  CheckShape(s);
  const ConvGeometry g(s);
  const int64_t pixels = g.out_height * g.out_width;
  if (s.is_pointwise()) {
    MatMulBackward(ctx,
                   MatMulShape{s.batch * pixels, s.out_channels, s.in_channels},
                   x, filter, dy, dx, dfilter);
    return;
  }
  const int64_t chunk = ChunkImages(s, g);
  float* col = workspace->Get(ctx, chunk * pixels * g.patch);
  if (col == nullptr) return;  // Recorded in ctx.
  const int64_t in_image = s.in_height * s.in_width * s.in_channels;
  const int64_t out_image = pixels * s.out_channels;
  for (int64_t n = 0; n < s.batch; n += chunk) {
    const int64_t images = std::min(chunk, s.batch - n);
    const int64_t rows = images * pixels;
    const float* dy_n = dy + n * out_image;
    if (dfilter != nullptr) {
      // dfilter (+)= col^T dy; the first chunk overwrites.
      Im2Col(ctx, g, x + n * in_image, images, col);
      Gemm(ctx, MatMulShape{g.patch, s.out_channels, rows, true, false}, 1.0f,
           col, dy_n, n == 0 ? 0.0f : 1.0f, dfilter);
    }
    if (dx != nullptr) {
      Gemm(ctx, MatMulShape{rows, g.patch, s.out_channels, false, true}, 1.0f,
           dy_n, filter, 0.0f, col);
      const int64_t cells = images * in_image;
      Col2ImKernel<<<cuda::BlocksFor(cells), cuda::kThreadsPerBlock, 0,
                     ctx.stream()>>>(g, col, images, dx + n * in_image);
      PSRT_CUDA_RECORD(ctx, cudaGetLastError());
    }
  }
}

}  // namespace kernels
}  // namespace psrt
