// Shapes of the windowed ops (convolution and pooling) over NHWC images,
// with TensorFlow's padding rules. Plain structs whose derived sizes are
// PSRT_HOST_DEVICE, so CUDA kernels and functors take them by value.
//
// Layout: every image tensor is NHWC, row-major: [batch, height, width,
// channels], channels fastest. That is TensorFlow's default layout, the one
// of its MNIST and Inception examples, and the layout of psrt's [B, H*W*C]
// input batches; it also makes a convolution one GEMM over im2col rows whose
// output is NHWC again, and makes a 1x1 convolution a plain GEMM on the
// input with no copy at all. Filters are HWIO: [height, width, in, out].
#ifndef PSRT_KERNELS_WINDOW_H_
#define PSRT_KERNELS_WINDOW_H_

#include <cstdint>

#include "kernels/functors.h"

namespace psrt {
namespace kernels {

// TensorFlow's padding, per spatial dimension of size `in`, window `k` and
// stride `s`:
//   kValid: no padding; out = ceil((in - k + 1) / s) (0 when k > in).
//   kSame:  out = ceil(in / s); padding total = max((out - 1) * s + k - in,
//           0), of which floor(total / 2) goes before (top/left) and the rest
//           after (bottom/right). Padded cells are zero for a convolution and
//           are skipped by the pools (neither a max candidate nor counted in
//           an average).
enum class Padding { kValid, kSame };

PSRT_HOST_DEVICE inline int64_t WindowOutputSize(int64_t in, int64_t k,
                                                 int64_t s, Padding p) {
  if (p == Padding::kSame) return (in + s - 1) / s;
  return in >= k ? (in - k) / s + 1 : 0;
}

PSRT_HOST_DEVICE inline int64_t WindowPaddingBefore(int64_t in, int64_t k,
                                                    int64_t s, Padding p) {
  if (p == Padding::kValid) return 0;
  const int64_t total = (WindowOutputSize(in, k, s, p) - 1) * s + k - in;
  return total > 0 ? total / 2 : 0;
}

// A 2-D convolution: x [batch, in_height, in_width, in_channels] (NHWC),
// filter [filter_height, filter_width, in_channels, out_channels] (HWIO),
// y [batch, out_height(), out_width(), out_channels] (NHWC).
struct Conv2DShape {
  int64_t batch = 0;
  int64_t in_height = 0;
  int64_t in_width = 0;
  int64_t in_channels = 0;
  int64_t filter_height = 0;
  int64_t filter_width = 0;
  int64_t out_channels = 0;
  int64_t stride_height = 1;
  int64_t stride_width = 1;
  Padding padding = Padding::kSame;

  PSRT_HOST_DEVICE int64_t out_height() const {
    return WindowOutputSize(in_height, filter_height, stride_height, padding);
  }
  PSRT_HOST_DEVICE int64_t out_width() const {
    return WindowOutputSize(in_width, filter_width, stride_width, padding);
  }
  PSRT_HOST_DEVICE int64_t pad_top() const {
    return WindowPaddingBefore(in_height, filter_height, stride_height,
                               padding);
  }
  PSRT_HOST_DEVICE int64_t pad_left() const {
    return WindowPaddingBefore(in_width, filter_width, stride_width, padding);
  }
  // Elements of x, of y and of the filter.
  int64_t input_size() const {
    return batch * in_height * in_width * in_channels;
  }
  int64_t output_size() const {
    return batch * out_height() * out_width() * out_channels;
  }
  int64_t filter_size() const {
    return filter_height * filter_width * in_channels * out_channels;
  }
  // A 1x1, stride-1 convolution: y = x * filter as [B*H*W, in] x [in, out].
  bool is_pointwise() const {
    return filter_height == 1 && filter_width == 1 && stride_height == 1 &&
           stride_width == 1;
  }
};

// A pooling window over x [batch, in_height, in_width, channels] (NHWC),
// giving y [batch, out_height(), out_width(), channels].
struct Pool2DShape {
  int64_t batch = 0;
  int64_t in_height = 0;
  int64_t in_width = 0;
  int64_t channels = 0;
  int64_t window_height = 0;
  int64_t window_width = 0;
  int64_t stride_height = 1;
  int64_t stride_width = 1;
  Padding padding = Padding::kValid;

  PSRT_HOST_DEVICE int64_t out_height() const {
    return WindowOutputSize(in_height, window_height, stride_height, padding);
  }
  PSRT_HOST_DEVICE int64_t out_width() const {
    return WindowOutputSize(in_width, window_width, stride_width, padding);
  }
  PSRT_HOST_DEVICE int64_t pad_top() const {
    return WindowPaddingBefore(in_height, window_height, stride_height,
                               padding);
  }
  PSRT_HOST_DEVICE int64_t pad_left() const {
    return WindowPaddingBefore(in_width, window_width, stride_width, padding);
  }
  int64_t input_size() const { return batch * in_height * in_width * channels; }
  int64_t output_size() const {
    return batch * out_height() * out_width() * channels;
  }
};

// A depthwise convolution (Keras's DepthwiseConv2D): x [batch, in_height,
// in_width, channels] (NHWC) and filter [filter_height, filter_width,
// channels, multiplier]; output channel c * multiplier + k of y [batch,
// out_height(), out_width(), out_channels()] is input channel c convolved
// with the filter's [:, :, c, k], with strides, a dilation (taps that
// many pixels apart) and TensorFlow's SAME or VALID padding of the
// dilated window.
struct DepthwiseConv2DShape {
  int64_t batch = 0;
  int64_t in_height = 0;
  int64_t in_width = 0;
  int64_t channels = 0;
  int64_t filter_height = 0;
  int64_t filter_width = 0;
  int64_t multiplier = 1;
  int64_t stride_height = 1;
  int64_t stride_width = 1;
  int64_t dilation_height = 1;
  int64_t dilation_width = 1;
  Padding padding = Padding::kValid;

  // The dilated window's extent.
  PSRT_HOST_DEVICE int64_t window_height() const { return (filter_height - 1) * dilation_height + 1; }
  PSRT_HOST_DEVICE int64_t window_width() const { return (filter_width - 1) * dilation_width + 1; }
  PSRT_HOST_DEVICE int64_t out_height() const {
    return WindowOutputSize(in_height, window_height(), stride_height, padding);
  }
  PSRT_HOST_DEVICE int64_t out_width() const {
    return WindowOutputSize(in_width, window_width(), stride_width, padding);
  }
  PSRT_HOST_DEVICE int64_t pad_top() const {
    return WindowPaddingBefore(in_height, window_height(), stride_height, padding);
  }
  PSRT_HOST_DEVICE int64_t pad_left() const {
    return WindowPaddingBefore(in_width, window_width(), stride_width, padding);
  }
  PSRT_HOST_DEVICE int64_t out_channels() const { return channels * multiplier; }
  int64_t input_size() const { return batch * in_height * in_width * channels; }
  int64_t output_size() const { return batch * out_height() * out_width() * out_channels(); }
  int64_t filter_size() const { return filter_height * filter_width * channels * multiplier; }
};

// The element-wise product of a [batch * pixels, channels] and b, either
// alike or [batch, channels] broadcast over each image's pixels
// (`broadcast`: squeeze-and-excitation).
struct MultiplyShape {
  int64_t batch = 0;
  int64_t pixels = 0;  // Per image.
  int64_t channels = 0;
  bool broadcast = false;
};

// What one draw of dropout's mask covers (Keras's noise_shape): an
// element (the default), a whole example of `example` values ((None, 1, 1,
// 1): EfficientNet's stochastic depth), or a channel of an example of
// `example` values in `channels` channels ((None, 1, 1, C): Keras's
// SpatialDropout2D).
struct DropoutNoise {
  int64_t example = 0;   // 0: a draw per element.
  int64_t channels = 0;  // With `example`: a draw per (example, channel).
};

// Zero padding around x [batch, in_height, in_width, channels] (NHWC):
// y [batch, out_height(), out_width(), channels] holds x at rows
// [top, top + in_height) and columns [left, left + in_width), zeros
// elsewhere (Keras's ZeroPadding2D).
struct Pad2DShape {
  int64_t batch = 0;
  int64_t in_height = 0;
  int64_t in_width = 0;
  int64_t channels = 0;
  int64_t top = 0;
  int64_t bottom = 0;
  int64_t left = 0;
  int64_t right = 0;

  PSRT_HOST_DEVICE int64_t out_height() const { return in_height + top + bottom; }
  PSRT_HOST_DEVICE int64_t out_width() const { return in_width + left + right; }
  int64_t input_size() const { return batch * in_height * in_width * channels; }
  int64_t output_size() const { return batch * out_height() * out_width() * channels; }
};

}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_WINDOW_H_
