#include "kernels/depthwise_conv.h"

#include <algorithm>

#include "glog/logging.h"
#include "kernels/depthwise_functors.h"

namespace psrt {
namespace kernels {
namespace {

constexpr int64_t kElementGrain = 1 << 14;

void CheckShape(const DepthwiseConv2DShape& s) {
  CHECK(s.batch > 0 && s.in_height > 0 && s.in_width > 0 && s.channels > 0 &&
        s.filter_height > 0 && s.filter_width > 0 && s.multiplier > 0 && s.stride_height > 0 &&
        s.stride_width > 0 && s.dilation_height > 0 && s.dilation_width > 0 &&
        s.out_height() > 0 && s.out_width() > 0)
      << "bad DepthwiseConv2DShape";
}

// Runs f(pixel, 0, channels) over the pixels, a run of them per task.
template <class F>
void ForEachPixel(const CpuContext& ctx, int64_t pixels, int64_t channels, int64_t taps,
                  const F& f) {
  ctx.ParallelFor(pixels, std::max<int64_t>(1, kElementGrain / (channels * taps)),
                  [&](int64_t begin, int64_t end) {
                    const F local = f;  // See ForEachIndex.
                    for (int64_t p = begin; p < end; ++p) local(p, 0, channels);
                  });
}

}  // namespace

void DepthwiseConv2DForward(const CpuContext& ctx, const DepthwiseConv2DShape& s, const float* x,
                            const float* filter, float* y, Workspace* /*workspace*/) {
  CheckShape(s);
  ForEachPixel(ctx, s.batch * s.out_height() * s.out_width(), s.out_channels(),
               s.filter_height * s.filter_width, functor::DepthwiseConv{s, x, filter, y});
}

void DepthwiseConv2DBackward(const CpuContext& ctx, const DepthwiseConv2DShape& s, const float* x,
                             const float* filter, const float* dy, float* dx, float* dfilter,
                             Workspace* workspace) {
  CheckShape(s);
  const int64_t taps = s.filter_height * s.filter_width;
  if (dx != nullptr) {
    ForEachPixel(ctx, s.batch * s.in_height * s.in_width, s.channels, taps,
                 functor::DepthwiseConvInputGrad{s, dy, filter, dx});
  }
  // The filter's gradient: kChunks fixed runs of output pixels, each summed
  // into partial sums (a task per run and block of output channels), then
  // the partial sums added in run order.
  const int64_t oc_count = s.out_channels();
  const int64_t rows = s.batch * s.out_height() * s.out_width();
  constexpr int64_t kChunks = 4;
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (oc_count + kBlock - 1) / kBlock;
  const int64_t sums_size = taps * oc_count;
  float* partial = workspace->Get(0, kChunks * sums_size);
  const functor::DepthwiseFilterGrad grad{s, x, dy};
  ctx.ParallelFor(kChunks * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t chunk = task / blocks, block = task % blocks;
      const int64_t oc_begin = block * kBlock, oc_end = std::min(oc_count, oc_begin + kBlock);
      float* sums = partial + chunk * sums_size;
      for (int64_t t = 0; t < taps; ++t) {
        std::fill(sums + t * oc_count + oc_begin, sums + t * oc_count + oc_end, 0.0f);
      }
      const int64_t r_end = rows * (chunk + 1) / kChunks;
      for (int64_t r = rows * chunk / kChunks; r < r_end; ++r) grad(r, oc_begin, oc_end, sums);
    }
  });
  for (int64_t k = 0; k < sums_size; ++k) {
    float sum = partial[k];
    for (int64_t chunk = 1; chunk < kChunks; ++chunk) sum += partial[chunk * sums_size + k];
    dfilter[k] = sum;
  }
}

}  // namespace kernels
}  // namespace psrt
