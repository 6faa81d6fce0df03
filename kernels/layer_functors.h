// The element-wise math of the layer ops (pools, concat, batch norm,
// dropout, L2 loss), written once for the CPU and the GPU like functors.h:
// each functor does the work of one index or one (row, channel) pair; the
// CPU runs it in a loop (vectorized over the channel, the fastest NHWC
// dimension), the GPU in a grid-stride kernel. Reductions over rows
// (per-channel sums) are the exception: each device sums in its own way and
// the functors take the finished sums.
//
// Image tensors are NHWC; a "pixel" is one (n, h, w) position, so an image
// tensor is a [pixels, channels] matrix.
#ifndef PSRT_KERNELS_LAYER_FUNCTORS_H_
#define PSRT_KERNELS_LAYER_FUNCTORS_H_

#include <cmath>
#include <cstdint>

#include "kernels/functors.h"
#include "kernels/window.h"

namespace psrt {
namespace kernels {
namespace functor {

PSRT_HOST_DEVICE inline int64_t MinI(int64_t a, int64_t b) {
  return a < b ? a : b;
}
PSRT_HOST_DEVICE inline int64_t MaxI(int64_t a, int64_t b) {
  return a > b ? a : b;
}
PSRT_HOST_DEVICE inline float RsqrtF(float v) {
#if defined(__CUDA_ARCH__)
  return 1.0f / sqrtf(v);
#else
  return 1.0f / std::sqrt(v);
#endif
}

// A pooling window's geometry with every derived size computed once (the
// functors run per element on the GPU, where divisions are costly).
struct PoolGeometry {
  int64_t in_height, in_width, channels;
  int64_t window_height, window_width, stride_height, stride_width;
  int64_t out_height, out_width, pad_top, pad_left;
  PoolGeometry() = default;
  explicit PoolGeometry(const Pool2DShape& s)
      : in_height(s.in_height),
        in_width(s.in_width),
        channels(s.channels),
        window_height(s.window_height),
        window_width(s.window_width),
        stride_height(s.stride_height),
        stride_width(s.stride_width),
        out_height(s.out_height()),
        out_width(s.out_width()),
        pad_top(s.pad_top()),
        pad_left(s.pad_left()) {}
};

// The valid (unpadded) input cells of output pixel p's window: rows
// [h_begin, h_end) and columns [w_begin, w_end) of image n.
struct Window {
  int64_t n, h_begin, h_end, w_begin, w_end;
  PSRT_HOST_DEVICE Window(const PoolGeometry& g, int64_t p) {
    const int64_t ow = p % g.out_width;
    const int64_t rest = p / g.out_width;
    const int64_t oh = rest % g.out_height;
    n = rest / g.out_height;
    Init(g, oh, ow);
  }
  PSRT_HOST_DEVICE Window(const PoolGeometry& g, int64_t n_, int64_t oh,
                          int64_t ow) {
    n = n_;
    Init(g, oh, ow);
  }
  PSRT_HOST_DEVICE int64_t count() const {
    return (h_end - h_begin) * (w_end - w_begin);
  }

 private:
  PSRT_HOST_DEVICE void Init(const PoolGeometry& g, int64_t oh, int64_t ow) {
    const int64_t h0 = oh * g.stride_height - g.pad_top;
    const int64_t w0 = ow * g.stride_width - g.pad_left;
    h_begin = MaxI(h0, 0);
    h_end = MinI(h0 + g.window_height, g.in_height);
    w_begin = MaxI(w0, 0);
    w_end = MinI(w0 + g.window_width, g.in_width);
  }
};

// The output pixels whose windows hold input pixel q: rows
// [oh_begin, oh_end) and columns [ow_begin, ow_end) of image n.
struct Covering {
  int64_t n, ih, iw, oh_begin, oh_end, ow_begin, ow_end;
  PSRT_HOST_DEVICE Covering(const PoolGeometry& g, int64_t q) {
    iw = q % g.in_width;
    const int64_t rest = q / g.in_width;
    ih = rest % g.in_height;
    n = rest / g.in_height;
    Range(ih, g.stride_height, g.pad_top, g.window_height, g.out_height,
          &oh_begin, &oh_end);
    Range(iw, g.stride_width, g.pad_left, g.window_width, g.out_width,
          &ow_begin, &ow_end);
  }

 private:
  PSRT_HOST_DEVICE static void Range(int64_t i, int64_t stride, int64_t pad,
                                     int64_t k, int64_t out, int64_t* begin,
                                     int64_t* end) {
    const int64_t lo = i + pad - k + 1;  // Outputs o with o * stride >= lo.
    *begin = lo > 0 ? (lo + stride - 1) / stride : 0;
    *end = MinI((i + pad) / stride + 1, out);
  }
};

// The pool functors work on one pixel and a run of channels [c_begin,
// c_end): the CPU passes all channels of a pixel (the inner loop over
// contiguous channels vectorizes, and the pixel's index math is done once),
// the GPU one channel per thread.

// y[p, c] = the max of x over the valid cells of output pixel p's window.
// SAME padding leaves at least one valid cell in every window.
struct MaxPool {
  PoolGeometry g;
  const float* x;
  float* y;
  PSRT_HOST_DEVICE void operator()(int64_t p, int64_t c_begin,
                                   int64_t c_end) const {
    const Window win(g, p);
    const int64_t C = g.channels;
    const float* image = x + win.n * g.in_height * g.in_width * C;
    float* out = y + p * C;
    const float* first = image + (win.h_begin * g.in_width + win.w_begin) * C;
    for (int64_t c = c_begin; c < c_end; ++c) out[c] = first[c];
    for (int64_t h = win.h_begin; h < win.h_end; ++h) {
      for (int64_t w = win.w_begin; w < win.w_end; ++w) {
        const float* cell = image + (h * g.in_width + w) * C;
        for (int64_t c = c_begin; c < c_end; ++c)
          out[c] = MaxF(out[c], cell[c]);
      }
    }
  }
};

// dx[q, c] for input pixel q: the sum of dy over the outputs whose max is
// this cell. A window's max goes to its first cell (row-major) holding the
// max value, as in TensorFlow and PyTorch. Gathers (one writer per dx
// element), so it needs no atomics and is deterministic. Overwrites dx.
struct MaxPoolGrad {
  PoolGeometry g;
  const float* x;
  const float* y;
  const float* dy;
  float* dx;
  PSRT_HOST_DEVICE void operator()(int64_t q, int64_t c_begin,
                                   int64_t c_end) const {
    const Covering cov(g, q);
    const int64_t C = g.channels;
    const float* v = x + q * C;
    float* out = dx + q * C;
    for (int64_t c = c_begin; c < c_end; ++c) out[c] = 0.0f;
    for (int64_t oh = cov.oh_begin; oh < cov.oh_end; ++oh) {
      for (int64_t ow = cov.ow_begin; ow < cov.ow_end; ++ow) {
        const int64_t o = (cov.n * g.out_height + oh) * g.out_width + ow;
        const float* m = y + o * C;
        const float* d = dy + o * C;
        for (int64_t c = c_begin; c < c_end; ++c) {
          if (v[c] == m[c] && IsFirstMax(cov, oh, ow, c, m[c])) out[c] += d[c];
        }
      }
    }
  }

 private:
  // Whether input pixel (cov.ih, cov.iw) is the first cell of output
  // (oh, ow)'s window holding m in channel c.
  PSRT_HOST_DEVICE bool IsFirstMax(const Covering& cov, int64_t oh, int64_t ow,
                                   int64_t c, float m) const {
    const Window win(g, cov.n, oh, ow);
    const int64_t C = g.channels;
    const float* image = x + cov.n * g.in_height * g.in_width * C + c;
    for (int64_t h = win.h_begin; h < win.h_end; ++h) {
      for (int64_t w = win.w_begin; w < win.w_end; ++w) {
        if (image[(h * g.in_width + w) * C] == m) {
          return h == cov.ih && w == cov.iw;
        }
      }
    }
    return false;
  }
};

// y[p, c] = the mean of x over the valid cells of output pixel p's window
// (padding is not counted, as in TensorFlow).
struct AvgPool {
  PoolGeometry g;
  const float* x;
  float* y;
  PSRT_HOST_DEVICE void operator()(int64_t p, int64_t c_begin,
                                   int64_t c_end) const {
    const Window win(g, p);
    const int64_t C = g.channels;
    const float* image = x + win.n * g.in_height * g.in_width * C;
    float* out = y + p * C;
    for (int64_t c = c_begin; c < c_end; ++c) out[c] = 0.0f;
    for (int64_t h = win.h_begin; h < win.h_end; ++h) {
      for (int64_t w = win.w_begin; w < win.w_end; ++w) {
        const float* cell = image + (h * g.in_width + w) * C;
        for (int64_t c = c_begin; c < c_end; ++c) out[c] += cell[c];
      }
    }
    const float inv = 1.0f / static_cast<float>(win.count());
    for (int64_t c = c_begin; c < c_end; ++c) out[c] *= inv;
  }
};

// dx[q, c] = sum over the outputs whose window holds input pixel q of
// dy / (that window's valid cell count). Gathers; overwrites dx.
struct AvgPoolGrad {
  PoolGeometry g;
  const float* dy;
  float* dx;
  PSRT_HOST_DEVICE void operator()(int64_t q, int64_t c_begin,
                                   int64_t c_end) const {
    const Covering cov(g, q);
    const int64_t C = g.channels;
    float* out = dx + q * C;
    for (int64_t c = c_begin; c < c_end; ++c) out[c] = 0.0f;
    for (int64_t oh = cov.oh_begin; oh < cov.oh_end; ++oh) {
      for (int64_t ow = cov.ow_begin; ow < cov.ow_end; ++ow) {
        const Window win(g, cov.n, oh, ow);
        const float inv = 1.0f / static_cast<float>(win.count());
        const float* d =
            dy + ((cov.n * g.out_height + oh) * g.out_width + ow) * C;
        for (int64_t c = c_begin; c < c_end; ++c) out[c] += d[c] * inv;
      }
    }
  }
};

// y[n, c] = mean over the `pixels` pixels of image n of x[n, p, c]
// (overwrites). One index per (n, c): the GPU's form; the CPU sums rows.
struct GlobalAvgPool {
  const float* x;
  int64_t pixels;
  int64_t channels;
  float* y;
  PSRT_HOST_DEVICE void operator()(int64_t n, int64_t c) const {
    const float* image = x + n * pixels * channels + c;
    float sum = 0.0f;
    for (int64_t p = 0; p < pixels; ++p) sum += image[p * channels];
    y[n * channels + c] = sum / static_cast<float>(pixels);
  }
};

// dx[r, c] = dy[r / pixels, c] / pixels, for rows r = (n, p) of dx.
struct GlobalAvgPoolGrad {
  const float* dy;
  int64_t pixels;
  int64_t channels;
  float* dx;
  PSRT_HOST_DEVICE void operator()(int64_t r, int64_t c) const {
    dx[r * channels + c] =
        dy[(r / pixels) * channels + c] / static_cast<float>(pixels);
  }
};

// dst[r, dst_offset + c] = src[r, src_offset + c]: one input's channels of a
// channel concatenation (forward) or of its split (backward).
struct CopyColumns {
  const float* src;
  int64_t src_cols;
  int64_t src_offset;
  float* dst;
  int64_t dst_cols;
  int64_t dst_offset;
  PSRT_HOST_DEVICE void operator()(int64_t r, int64_t c) const {
    dst[r * dst_cols + dst_offset + c] = src[r * src_cols + src_offset + c];
  }
};

// y[r, c] = x[r, c] * scale[c] + offset[c] (Keras's Rescaling and
// Normalization; with offset 0, their gradient). y may alias x.
struct ChannelAffine {
  const float* x;
  const float* scale;
  const float* offset;
  int64_t channels;
  float* y;
  PSRT_HOST_DEVICE void operator()(int64_t r, int64_t c) const {
    y[r * channels + c] = x[r * channels + c] * scale[c] + offset[c];
  }
};

// The element-wise product y = a * b (Keras's Multiply) of [batch * pixels,
// channels] rows, b either alike or [batch, channels], broadcast over each
// image's pixels (squeeze-and-excitation). Also the gradient of either
// factor: dy times the other. y may alias a.
struct Multiply {
  const float* a;
  const float* b;
  int64_t pixels;  // Per image.
  int64_t channels;
  bool broadcast;  // b is [batch, channels].
  float* y;
  PSRT_HOST_DEVICE void operator()(int64_t r, int64_t c) const {
    const int64_t j = (broadcast ? r / pixels : r) * channels + c;
    y[r * channels + c] = a[r * channels + c] * b[j];
  }
};

// The broadcast factor's gradient, one term: dy[n, p, c] * a[n, p, c], as
// a column sum over the image's pixels p of column j = n * channels + c.
struct MultiplyBroadcastGradTerm {
  const float* dy;
  const float* a;
  int64_t pixels;
  int64_t channels;
  PSRT_HOST_DEVICE float operator()(int64_t p, int64_t j) const {
    const int64_t i = ((j / channels) * pixels + p) * channels + j % channels;
    return dy[i] * a[i];
  }
};

// Batch norm statistics of channel c from its sums over `rows` rows:
// mean[c] holds sum(x) / rows on entry; inv_std[c] holds sum((x - mean)^2)
// on entry and 1 / sqrt(var + epsilon) on exit (var = that sum / rows, the
// biased variance used to normalize). Moving statistics, when not null,
// follow TensorFlow/Keras' momentum (decay):
//   moving_mean = momentum * moving_mean + (1 - momentum) * mean
//   moving_var  = momentum * moving_var  + (1 - momentum) * var * n/(n-1)
// (with `bessel`, the unbiased variance, as TensorFlow's fused and
// PyTorch's batch norms use; Keras 3's takes var itself).
struct BatchNormFinalize {
  int64_t rows;
  float epsilon;
  float momentum;
  bool bessel;
  const float* mean;
  float* inv_std;
  float* moving_mean;  // Or null.
  float* moving_var;   // Or null.
  PSRT_HOST_DEVICE void operator()(int64_t c) const {
    const float var = inv_std[c] / static_cast<float>(rows);
    inv_std[c] = RsqrtF(var + epsilon);
    if (moving_mean != nullptr) {
      const float follow =
          bessel && rows > 1 ? var * static_cast<float>(rows) / (rows - 1) : var;
      moving_mean[c] = momentum * moving_mean[c] + (1.0f - momentum) * mean[c];
      moving_var[c] = momentum * moving_var[c] + (1.0f - momentum) * follow;
    }
  }
};

// Layer norm: y[r, c] = gamma[c] * (x[r, c] - mean[r]) * inv_std[r] +
// beta[c], each row with its own statistics. y may alias x.
struct LayerNormApply {
  const float* x;
  const float* mean;
  const float* inv_std;
  const float* gamma;
  const float* beta;
  int64_t cols;
  float* y;
  PSRT_HOST_DEVICE void operator()(int64_t r, int64_t c) const {
    const int64_t i = r * cols + c;
    y[i] = gamma[c] * ((x[i] - mean[r]) * inv_std[r]) + beta[c];
  }
};

// Layer norm: a row's variance (in place) becomes 1 / sqrt(var + epsilon).
struct LayerNormFinalize {
  float epsilon;
  float* var_to_inv_std;
  PSRT_HOST_DEVICE void operator()(int64_t r) const {
    var_to_inv_std[r] = RsqrtF(var_to_inv_std[r] + epsilon);
  }
};

// Layer norm's input gradient, from each row's means of g = dy * gamma
// (g_mean) and of g * xhat (gx_mean), xhat = (x - mean) * inv_std:
//   dx = inv_std * (g - g_mean - xhat * gx_mean). dx may alias dy.
struct LayerNormGrad {
  const float* x;
  const float* dy;
  const float* mean;
  const float* inv_std;
  const float* gamma;
  const float* g_mean;
  const float* gx_mean;
  int64_t cols;
  float* dx;
  PSRT_HOST_DEVICE void operator()(int64_t r, int64_t c) const {
    const int64_t i = r * cols + c;
    const float xhat = (x[i] - mean[r]) * inv_std[r];
    dx[i] = inv_std[r] * (dy[i] * gamma[c] - g_mean[r] - xhat * gx_mean[r]);
  }
};

// y[r, c] = gamma[c] * (x[r, c] - mean[c]) * inv_std[c] + beta[c]. y may
// alias x.
struct BatchNormApply {
  const float* x;
  const float* mean;
  const float* inv_std;
  const float* gamma;
  const float* beta;
  int64_t cols;
  float* y;
  PSRT_HOST_DEVICE void operator()(int64_t r, int64_t c) const {
    const int64_t i = r * cols + c;
    y[i] = gamma[c] * ((x[i] - mean[c]) * inv_std[c]) + beta[c];
  }
};

// Inference: y[r, c] = gamma[c] * (x[r, c] - mean[c]) / sqrt(var[c] +
// epsilon) + beta[c], with the moving statistics. y may alias x.
struct BatchNormInference {
  const float* x;
  const float* mean;
  const float* var;
  float epsilon;
  const float* gamma;
  const float* beta;
  int64_t cols;
  float* y;
  PSRT_HOST_DEVICE void operator()(int64_t r, int64_t c) const {
    const int64_t i = r * cols + c;
    y[i] = gamma[c] * ((x[i] - mean[c]) * RsqrtF(var[c] + epsilon)) + beta[c];
  }
};

// The input gradient of training-mode batch norm, from the per-channel sums
// dbeta = sum(dy) and dgamma = sum(dy * xhat), xhat = (x - mean) * inv_std:
//   dx = gamma * inv_std * (dy - dbeta / rows - xhat * dgamma / rows).
// dx may alias dy.
struct BatchNormGrad {
  const float* x;
  const float* dy;
  const float* mean;
  const float* inv_std;
  const float* gamma;
  const float* dgamma;
  const float* dbeta;
  float inv_rows;
  int64_t cols;
  float* dx;
  PSRT_HOST_DEVICE void operator()(int64_t r, int64_t c) const {
    const int64_t i = r * cols + c;
    const float xhat = (x[i] - mean[c]) * inv_std[c];
    dx[i] = gamma[c] * inv_std[c] *
            (dy[i] - dbeta[c] * inv_rows - xhat * dgamma[c] * inv_rows);
  }
};

// Dropout's mask, a pure function of (seed, i): element i is kept when a
// uniform number in [0, 1) drawn by the SplitMix64 hash of (seed, i) is
// below keep_prob. The same on every device, so backward recomputes the
// mask instead of storing it, and the GPU drops the same elements as the CPU.
PSRT_HOST_DEVICE inline bool DropoutKeep(uint64_t seed, int64_t i,
                                         float keep_prob) {
  uint64_t z = seed + (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
  return u < keep_prob;
}

// Inverted dropout: y[i] = x[i] / keep_prob where kept, else 0, a draw per
// element, example or (example, channel) (DropoutNoise). Its own backward
// (dx = dy masked and scaled the same way). y may alias x.
struct Dropout {
  const float* x;
  float keep_prob;
  uint64_t seed;
  DropoutNoise noise;
  float* y;
  PSRT_HOST_DEVICE void operator()(int64_t i) const {
    int64_t draw = i;
    if (noise.example > 0) {
      draw = i / noise.example;
      if (noise.channels > 0) draw = draw * noise.channels + i % noise.channels;
    }
    y[i] = DropoutKeep(seed, draw, keep_prob) ? x[i] * (1.0f / keep_prob) : 0.0f;
  }
};

// Copies a window of NHWC images: dst [batch, dst_height, dst_width,
// channels] gets dst[n, h, w, c] = src[n, h - offset_height,
// w - offset_width, c], 0 outside src, for dst pixel `pixel` and channels
// [c_begin, c_end). Positive offsets pad (a zero padding's forward, the
// explicit padding of cuDNN convolutions), negative ones crop (their
// gradients).
struct ImageWindowCopy {
  const float* src;
  float* dst;
  int64_t channels, src_height, src_width, dst_height, dst_width, offset_height, offset_width;
  PSRT_HOST_DEVICE void operator()(int64_t pixel, int64_t c_begin, int64_t c_end) const {
    const int64_t image_row = pixel / dst_width;
    const int64_t w = pixel - image_row * dst_width;
    const int64_t n = image_row / dst_height;
    const int64_t h = image_row - n * dst_height;
    const int64_t sh = h - offset_height, sw = w - offset_width;
    float* out = dst + pixel * channels;
    if (sh < 0 || sh >= src_height || sw < 0 || sw >= src_width) {
      for (int64_t c = c_begin; c < c_end; ++c) out[c] = 0.0f;
      return;
    }
    const float* in = src + ((n * src_height + sh) * src_width + sw) * channels;
    for (int64_t c = c_begin; c < c_end; ++c) out[c] = in[c];
  }
};

// A zero padding's forward (pad) and backward (crop) as window copies.
inline ImageWindowCopy ZeroPad2D(const Pad2DShape& s, const float* x, float* y) {
  return {x, y, s.channels, s.in_height, s.in_width, s.out_height(), s.out_width(), s.top, s.left};
}
inline ImageWindowCopy ZeroPad2DGrad(const Pad2DShape& s, const float* dy, float* dx) {
  return {dy, dx, s.channels, s.out_height(), s.out_width(), s.in_height, s.in_width, -s.top,
          -s.left};
}

// dx[i] = dloss * x[i]: the gradient of dloss * sum(x^2) / 2.
struct L2LossGrad {
  const float* x;
  float dloss;
  float* dx;
  PSRT_HOST_DEVICE void operator()(int64_t i) const { dx[i] = dloss * x[i]; }
};

}  // namespace functor
}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_LAYER_FUNCTORS_H_
