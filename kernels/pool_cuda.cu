// Pooling on the GPU: the functors of layer_functors.h, one (pixel,
// channel) per thread; the average pool's backward gathers (no atomics);
// the max pool's scatters (below).
#include "glog/logging.h"
#include "kernels/cuda_launch.cuh"
#include "kernels/layer_functors.h"
#include "kernels/layers_cuda.h"

namespace psrt {
namespace kernels {
namespace {

void CheckShape(const Pool2DShape& s) {
  CHECK(s.batch > 0 && s.in_height > 0 && s.in_width > 0 && s.channels > 0 &&
        s.window_height > 0 && s.window_width > 0 && s.stride_height > 0 &&
        s.stride_width > 0 && s.out_height() > 0 && s.out_width() > 0)
      << "bad Pool2DShape";
}

// Max pooling's backward, one thread per (output pixel, channel): dy goes
// to the first cell (row-major) of the window equal to the forward's max y,
// the rule of functor::MaxPoolGrad (nowhere when y is NaN), added
// atomically where windows overlap (so sums of a few terms in any order).
// The gather of functor::MaxPoolGrad, one thread per input cell, rescans a
// window for every tie, and ReLU's zeros make ties common: it ran
// ResNet-50's pool about five times slower. REQUIRES: dx zeroed.
struct MaxPoolGradScatter {
  functor::PoolGeometry g;
  const float* x;
  const float* y;
  const float* dy;
  float* dx;
  __device__ void operator()(int64_t p, int64_t c, int64_t /*c_end*/) const {
    const functor::Window win(g, p);
    const int64_t C = g.channels;
    const int64_t image = win.n * g.in_height * g.in_width;
    const float max = y[p * C + c];
    for (int64_t h = win.h_begin; h < win.h_end; ++h) {
      for (int64_t w = win.w_begin; w < win.w_end; ++w) {
        const int64_t cell = (image + h * g.in_width + w) * C + c;
        if (x[cell] == max) {
          atomicAdd(dx + cell, dy[p * C + c]);
          return;
        }
      }
    }
  }
};

int64_t OutPixels(const Pool2DShape& s) {
  return s.batch * s.out_height() * s.out_width();
}
int64_t InPixels(const Pool2DShape& s) {
  return s.batch * s.in_height * s.in_width;
}

}  // namespace

void MaxPoolForward(const CudaContext& ctx, const Pool2DShape& s,
                    const float* x, float* y) {
  CheckShape(s);
  cuda::LaunchForEachPixelChannel(
      ctx, OutPixels(s), s.channels,
      functor::MaxPool{functor::PoolGeometry(s), x, y});
}

void MaxPoolBackward(const CudaContext& ctx, const Pool2DShape& s,
                     const float* x, const float* y, const float* dy,
                     float* dx) {
  CheckShape(s);
  PSRT_CUDA_RECORD(ctx, cudaMemsetAsync(dx, 0, s.input_size() * sizeof(float), ctx.stream()));
  cuda::LaunchForEachPixelChannel(ctx, OutPixels(s), s.channels,
                                  MaxPoolGradScatter{functor::PoolGeometry(s), x, y, dy, dx});
}

void AvgPoolForward(const CudaContext& ctx, const Pool2DShape& s,
                    const float* x, float* y) {
  CheckShape(s);
  cuda::LaunchForEachPixelChannel(
      ctx, OutPixels(s), s.channels,
      functor::AvgPool{functor::PoolGeometry(s), x, y});
}

void AvgPoolBackward(const CudaContext& ctx, const Pool2DShape& s,
                     const float* dy, float* dx) {
  CheckShape(s);
  cuda::LaunchForEachPixelChannel(
      ctx, InPixels(s), s.channels,
      functor::AvgPoolGrad{functor::PoolGeometry(s), dy, dx});
}

void GlobalAvgPoolForward(const CudaContext& ctx, const float* x, int64_t batch,
                          int64_t pixels, int64_t channels, float* y) {
  CHECK(batch > 0 && pixels > 0 && channels > 0);
  cuda::LaunchForEachRowCol(ctx, batch, channels,
                            functor::GlobalAvgPool{x, pixels, channels, y});
}

void GlobalAvgPoolBackward(const CudaContext& ctx, const float* dy,
                           int64_t batch, int64_t pixels, int64_t channels,
                           float* dx) {
  CHECK(batch > 0 && pixels > 0 && channels > 0);
  cuda::LaunchForEachRowCol(
      ctx, batch * pixels, channels,
      functor::GlobalAvgPoolGrad{dy, pixels, channels, dx});
}

}  // namespace kernels
}  // namespace psrt
