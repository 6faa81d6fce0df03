// Conv2D on the GPU: im2col + cuBLAS, a chunk of the batch at a time.
#include <algorithm>
#include <cstdint>

#include "glog/logging.h"
#include "kernels/cuda_launch.cuh"
#include "kernels/layer_functors.h"
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

// What the im2col kernels index with: the geometry in `Index` (32 bits
// whenever a chunk's arrays allow it: 64-bit division costs the GPU several
// times more, and these kernels are bound by their index arithmetic), with
// channels counted in units of `kUnit` floats (4 when the channel count
// allows it: one float4 load and store per 4 channels).
template <typename Index, int kUnit>
struct ColumnIndexing {
  Index in_height, in_width, channels;  // Channels in units.
  Index filter_height, filter_width, stride_height, stride_width;
  Index out_height, out_width, pad_top, pad_left;
  Index patch;  // In units.
  explicit ColumnIndexing(const ConvGeometry& g)
      : in_height(g.in_height),
        in_width(g.in_width),
        channels(g.in_channels / kUnit),
        filter_height(g.filter_height),
        filter_width(g.filter_width),
        stride_height(g.stride_height),
        stride_width(g.stride_width),
        out_height(g.out_height),
        out_width(g.out_width),
        pad_top(g.pad_top),
        pad_left(g.pad_left),
        patch(g.patch / kUnit) {}
};

template <int kUnit>
struct UnitOf;  // The vector type of kUnit floats.
template <>
struct UnitOf<1> {
  using Type = float;
};
template <>
struct UnitOf<4> {
  using Type = float4;
};

__device__ inline void AddTo(float& sum, float x) { sum += x; }
__device__ inline void AddTo(float4& sum, const float4& x) {
  sum.x += x.x;
  sum.y += x.y;
  sum.z += x.z;
  sum.w += x.w;
}

// col[row, k] for the rows (n, oh, ow) of `images` images at x: the input
// cell under filter tap k = (kh, kw, ci) of output pixel (oh, ow), or 0 in
// the padding; a unit of channels per thread.
template <typename Index, int kUnit>
__global__ void Im2ColKernel(ColumnIndexing<Index, kUnit> g, const float* x_floats, Index images,
                             float* col_floats) {
  using Unit = typename UnitOf<kUnit>::Type;
  const Unit* x = reinterpret_cast<const Unit*>(x_floats);
  Unit* col = reinterpret_cast<Unit*>(col_floats);
  const Index n_total = images * g.out_height * g.out_width * g.patch;
  for (Index i = blockIdx.x * blockDim.x + threadIdx.x; i < n_total; i += blockDim.x * gridDim.x) {
    const Index row = i / g.patch;
    const Index k = i - row * g.patch;
    const Index tap = k / g.channels;
    const Index ci = k - tap * g.channels;
    const Index kh = tap / g.filter_width;
    const Index kw = tap - kh * g.filter_width;
    const Index image_row = row / g.out_width;
    const Index ow = row - image_row * g.out_width;
    const Index n = image_row / g.out_height;
    const Index oh = image_row - n * g.out_height;
    const Index h = oh * g.stride_height - g.pad_top + kh;
    const Index w = ow * g.stride_width - g.pad_left + kw;
    col[i] = h >= 0 && h < g.in_height && w >= 0 && w < g.in_width
                 ? x[((n * g.in_height + h) * g.in_width + w) * g.channels + ci]
                 : Unit{};
  }
}

// The adjoint of Im2Col, gathering: dx[n, h, w, ci] = the sum of the
// column-matrix entries copied from that cell. Overwrites dx.
template <typename Index, int kUnit>
__global__ void Col2ImKernel(ColumnIndexing<Index, kUnit> g, const float* col_floats, Index images,
                             float* dx_floats) {
  using Unit = typename UnitOf<kUnit>::Type;
  const Unit* col = reinterpret_cast<const Unit*>(col_floats);
  Unit* dx = reinterpret_cast<Unit*>(dx_floats);
  const Index n_total = images * g.in_height * g.in_width * g.channels;
  for (Index i = blockIdx.x * blockDim.x + threadIdx.x; i < n_total; i += blockDim.x * gridDim.x) {
    const Index pixel = i / g.channels;
    const Index ci = i - pixel * g.channels;
    const Index image_row = pixel / g.in_width;
    const Index w = pixel - image_row * g.in_width;
    const Index n = image_row / g.in_height;
    const Index h = image_row - n * g.in_height;
    Unit sum{};
    for (Index kh = 0; kh < g.filter_height; ++kh) {
      const Index oh_s = h + g.pad_top - kh;  // oh * stride
      if (oh_s < 0 || oh_s % g.stride_height != 0) continue;
      const Index oh = oh_s / g.stride_height;
      if (oh >= g.out_height) continue;
      for (Index kw = 0; kw < g.filter_width; ++kw) {
        const Index ow_s = w + g.pad_left - kw;
        if (ow_s < 0 || ow_s % g.stride_width != 0) continue;
        const Index ow = ow_s / g.stride_width;
        if (ow >= g.out_width) continue;
        const Index row = (n * g.out_height + oh) * g.out_width + ow;
        AddTo(sum, col[row * g.patch + (kh * g.filter_width + kw) * g.channels + ci]);
      }
    }
    dx[i] = sum;
  }
}

int64_t ChunkImages(const Conv2DShape& s, const ConvGeometry& g) {
  const int64_t per_image = g.out_height * g.out_width * g.patch;
  return std::clamp<int64_t>(kMaxColumnFloats / per_image, 1, s.batch);
}

// Runs Launcher<Index, kUnit> on `images` images of the geometry with the
// narrowest index and the widest unit that fit: 32 bits when every index,
// and a grid-stride step past the last, fits in an int32_t.
template <template <typename, int> class Launcher>
void LaunchColumnKernel(const CudaContext& ctx, const ConvGeometry& g, const float* in,
                        int64_t images, float* out) {
  const int64_t largest = images * std::max(g.in_height * g.in_width * g.in_channels,
                                            g.out_height * g.out_width * g.patch);
  const bool narrow = largest + cuda::kMaxBlocks * cuda::kThreadsPerBlock < (int64_t{1} << 31);
  // float4 needs 16-byte aligned rows: a chunk starts at a multiple of
  // in_channels floats, and the arrays themselves are aligned.
  const bool vector = g.in_channels % 4 == 0 && reinterpret_cast<uintptr_t>(in) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (narrow && vector) {
    Launcher<int32_t, 4>::Run(ctx, g, in, images, out);
  } else if (narrow) {
    Launcher<int32_t, 1>::Run(ctx, g, in, images, out);
  } else if (vector) {
    Launcher<int64_t, 4>::Run(ctx, g, in, images, out);
  } else {
    Launcher<int64_t, 1>::Run(ctx, g, in, images, out);
  }
}

template <typename Index, int kUnit>
struct Im2ColLauncher {
  static void Run(const CudaContext& ctx, const ConvGeometry& g, const float* x, int64_t images,
                  float* col) {
    const int64_t n = images * g.out_height * g.out_width * g.patch / kUnit;
    Im2ColKernel<Index, kUnit><<<cuda::BlocksFor(n), cuda::kThreadsPerBlock, 0, ctx.stream()>>>(
        ColumnIndexing<Index, kUnit>(g), x, static_cast<Index>(images), col);
    PSRT_CUDA_RECORD(ctx, cudaGetLastError());
  }
};

template <typename Index, int kUnit>
struct Col2ImLauncher {
  static void Run(const CudaContext& ctx, const ConvGeometry& g, const float* col, int64_t images,
                  float* dx) {
    const int64_t n = images * g.in_height * g.in_width * g.in_channels / kUnit;
    Col2ImKernel<Index, kUnit><<<cuda::BlocksFor(n), cuda::kThreadsPerBlock, 0, ctx.stream()>>>(
        ColumnIndexing<Index, kUnit>(g), col, static_cast<Index>(images), dx);
    PSRT_CUDA_RECORD(ctx, cudaGetLastError());
  }
};

void Im2Col(const CudaContext& ctx, const ConvGeometry& g, const float* x, int64_t images,
            float* col) {
  LaunchColumnKernel<Im2ColLauncher>(ctx, g, x, images, col);
}

void Col2Im(const CudaContext& ctx, const ConvGeometry& g, const float* col, int64_t images,
            float* dx) {
  LaunchColumnKernel<Col2ImLauncher>(ctx, g, col, images, dx);
}

void CheckShape(const Conv2DShape& s) {
  CHECK(s.batch > 0 && s.in_height > 0 && s.in_width > 0 && s.in_channels > 0 &&
        s.filter_height > 0 && s.filter_width > 0 && s.out_channels > 0 && s.stride_height > 0 &&
        s.stride_width > 0 && s.out_height() > 0 && s.out_width() > 0)
      << "bad Conv2DShape";
}

}  // namespace

void CopyImageWindow(const CudaContext& ctx, const float* src, int64_t batch, int64_t src_height,
                     int64_t src_width, int64_t channels, int64_t dst_height, int64_t dst_width,
                     int64_t offset_height, int64_t offset_width, float* dst) {
  cuda::LaunchForEachPixelChannel(
      ctx, batch * dst_height * dst_width, channels,
      functor::ImageWindowCopy{src, dst, channels, src_height, src_width, dst_height, dst_width,
                               offset_height, offset_width});
}

CudaWorkspace::~CudaWorkspace() {
  if (data_ != nullptr) cudaFree(data_);
}

float* CudaWorkspace::Get(const CudaContext& ctx, int64_t size) {
  if (size > capacity_) {
    if (data_ != nullptr) PSRT_CUDA_RECORD(ctx, cudaFree(data_));
    data_ = nullptr;
    capacity_ = 0;
    if (!PSRT_CUDA_RECORD(ctx,
                          cudaMalloc(reinterpret_cast<void**>(&data_), size * sizeof(float)))) {
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
    Gemm(ctx, MatMulShape{s.batch * pixels, s.out_channels, s.in_channels}, 1.0f, x, filter, 0.0f,
         y);
    return;
  }
  const int64_t chunk = ChunkImages(s, g);
  float* col = workspace->Get(ctx, chunk * pixels * g.patch);
  if (col == nullptr) return;  // Recorded in ctx.
  const int64_t in_image = s.in_height * s.in_width * s.in_channels;
  for (int64_t n = 0; n < s.batch; n += chunk) {
    const int64_t images = std::min(chunk, s.batch - n);
    Im2Col(ctx, g, x + n * in_image, images, col);
    Gemm(ctx, MatMulShape{images * pixels, s.out_channels, g.patch}, 1.0f, col, filter, 0.0f,
         y + n * pixels * s.out_channels);
  }
}

void Conv2DBackward(const CudaContext& ctx, const Conv2DShape& s, const float* x,
                    const float* filter, const float* dy, float* dx, float* dfilter,
                    CudaWorkspace* workspace) {
  CheckShape(s);
  const ConvGeometry g(s);
  const int64_t pixels = g.out_height * g.out_width;
  if (s.is_pointwise()) {
    MatMulBackward(ctx, MatMulShape{s.batch * pixels, s.out_channels, s.in_channels}, x, filter, dy,
                   dx, dfilter);
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
      Gemm(ctx, MatMulShape{g.patch, s.out_channels, rows, true, false}, 1.0f, col, dy_n,
           n == 0 ? 0.0f : 1.0f, dfilter);
    }
    if (dx != nullptr) {
      Gemm(ctx, MatMulShape{rows, g.patch, s.out_channels, false, true}, 1.0f, dy_n, filter, 0.0f,
           col);
      Col2Im(ctx, g, col, images, dx + n * in_image);
    }
  }
}

}  // namespace kernels
}  // namespace psrt
