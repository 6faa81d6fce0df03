// The math of the depthwise convolution (depthwise_conv.h), written once for
// the CPU and the GPU like layer_functors.h: each functor computes one
// output pixel's (or input pixel's) run of channels, gathering over the
// filter's taps, so no two calls write the same element; the filter's
// gradient is a sum over output pixels (DepthwiseFilterGrad), which each
// device reduces in its own way.
#ifndef PSRT_KERNELS_DEPTHWISE_FUNCTORS_H_
#define PSRT_KERNELS_DEPTHWISE_FUNCTORS_H_

#include <cstdint>

#include "kernels/functors.h"
#include "kernels/window.h"

namespace psrt {
namespace kernels {
namespace functor {

// (n, h, w) of pixel p of [n, height, width] images.
struct PixelAt {
  int64_t n, h, w;
  PSRT_HOST_DEVICE PixelAt(int64_t p, int64_t height, int64_t width) {
    w = p % width;
    const int64_t rest = p / width;
    h = rest % height;
    n = rest / height;
  }
};

// The input pixel that tap (i, j) of output pixel `out` reads, or -1 in
// the padding.
PSRT_HOST_DEVICE inline int64_t TapInput(const DepthwiseConv2DShape& s, const PixelAt& out,
                                         int64_t i, int64_t j) {
  const int64_t ih = out.h * s.stride_height - s.pad_top() + i * s.dilation_height;
  const int64_t iw = out.w * s.stride_width - s.pad_left() + j * s.dilation_width;
  if (ih < 0 || ih >= s.in_height || iw < 0 || iw >= s.in_width) return -1;
  return (out.n * s.in_height + ih) * s.in_width + iw;
}

// y at output pixel p, output channels [oc_begin, oc_end).
struct DepthwiseConv {
  DepthwiseConv2DShape s;
  const float* x;
  const float* filter;
  float* y;
  PSRT_HOST_DEVICE void operator()(int64_t p, int64_t oc_begin, int64_t oc_end) const {
    const PixelAt at(p, s.out_height(), s.out_width());
    const int64_t oc_count = s.out_channels();
    float* out = y + p * oc_count;
    for (int64_t oc = oc_begin; oc < oc_end; ++oc) out[oc] = 0.0f;
    for (int64_t i = 0; i < s.filter_height; ++i) {
      for (int64_t j = 0; j < s.filter_width; ++j) {
        const int64_t pixel = TapInput(s, at, i, j);
        if (pixel < 0) continue;
        const float* in = x + pixel * s.channels;
        const float* tap = filter + (i * s.filter_width + j) * oc_count;
        if (s.multiplier == 1) {  // Contiguous on both sides: vectorizes.
          for (int64_t c = oc_begin; c < oc_end; ++c) out[c] += in[c] * tap[c];
        } else {
          for (int64_t oc = oc_begin; oc < oc_end; ++oc) {
            out[oc] += in[oc / s.multiplier] * tap[oc];
          }
        }
      }
    }
  }
};

// dx at input pixel q, input channels [c_begin, c_end): the sum over the
// taps whose output pixel reads q.
struct DepthwiseConvInputGrad {
  DepthwiseConv2DShape s;
  const float* dy;
  const float* filter;
  float* dx;
  PSRT_HOST_DEVICE void operator()(int64_t q, int64_t c_begin, int64_t c_end) const {
    const PixelAt at(q, s.in_height, s.in_width);
    const int64_t oc_count = s.out_channels();
    const int64_t m = s.multiplier;
    float* out = dx + q * s.channels;
    for (int64_t c = c_begin; c < c_end; ++c) out[c] = 0.0f;
    for (int64_t i = 0; i < s.filter_height; ++i) {
      const int64_t th = at.h + s.pad_top() - i * s.dilation_height;  // oh * stride_height.
      if (th < 0 || th % s.stride_height != 0 || th / s.stride_height >= s.out_height()) continue;
      for (int64_t j = 0; j < s.filter_width; ++j) {
        const int64_t tw = at.w + s.pad_left() - j * s.dilation_width;
        if (tw < 0 || tw % s.stride_width != 0 || tw / s.stride_width >= s.out_width()) continue;
        const float* grad =
            dy + ((at.n * s.out_height() + th / s.stride_height) * s.out_width() +
                  tw / s.stride_width) * oc_count;
        const float* tap = filter + (i * s.filter_width + j) * oc_count;
        if (m == 1) {
          for (int64_t c = c_begin; c < c_end; ++c) out[c] += grad[c] * tap[c];
        } else {
          for (int64_t c = c_begin; c < c_end; ++c) {
            for (int64_t k = 0; k < m; ++k) out[c] += grad[c * m + k] * tap[c * m + k];
          }
        }
      }
    }
  }
};

// Output pixel r's terms of the filter's gradient: for each tap (i, j) and
// output channel oc in [oc_begin, oc_end), dy[r, oc] times the input it
// read there, added to sums[(i * filter_width + j) * out_channels + oc].
// (The GPU sums one tap's column at a time: Term.)
struct DepthwiseFilterGrad {
  DepthwiseConv2DShape s;
  const float* x;
  const float* dy;
  PSRT_HOST_DEVICE void operator()(int64_t r, int64_t oc_begin, int64_t oc_end,
                                   float* sums) const {
    const PixelAt at(r, s.out_height(), s.out_width());
    const int64_t oc_count = s.out_channels();
    const float* grad = dy + r * oc_count;
    for (int64_t i = 0; i < s.filter_height; ++i) {
      for (int64_t j = 0; j < s.filter_width; ++j) {
        const int64_t pixel = TapInput(s, at, i, j);
        if (pixel < 0) continue;
        const float* in = x + pixel * s.channels;
        float* sum = sums + (i * s.filter_width + j) * oc_count;
        if (s.multiplier == 1) {
          for (int64_t c = oc_begin; c < oc_end; ++c) sum[c] += grad[c] * in[c];
        } else {
          for (int64_t oc = oc_begin; oc < oc_end; ++oc) {
            sum[oc] += grad[oc] * in[oc / s.multiplier];
          }
        }
      }
    }
  }
  // Output pixel r's term at tap (i, j) and output channel oc alone.
  PSRT_HOST_DEVICE float Term(int64_t r, int64_t i, int64_t j, int64_t oc) const {
    const int64_t pixel = TapInput(s, PixelAt(r, s.out_height(), s.out_width()), i, j);
    if (pixel < 0) return 0.0f;
    return dy[r * s.out_channels() + oc] * x[pixel * s.channels + oc / s.multiplier];
  }
};

}  // namespace functor
}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_DEPTHWISE_FUNCTORS_H_
