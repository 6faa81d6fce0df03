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

// The valid (unpadded) input rows [begin, end) of the window of output row
// `o`, along one dimension of input size `in`.
struct WindowRange {
  int64_t begin;
  int64_t end;
  PSRT_HOST_DEVICE WindowRange(int64_t o, int64_t stride, int64_t pad,
                               int64_t k, int64_t in) {
    const int64_t start = o * stride - pad;
    begin = MaxI(start, 0);
    end = MinI(start + k, in);
  }
};

// The output rows [begin, end) whose windows contain input row `i`.
struct CoveringRange {
  int64_t begin;
  int64_t end;
  PSRT_HOST_DEVICE CoveringRange(int64_t i, int64_t stride, int64_t pad,
                                 int64_t k, int64_t out) {
    const int64_t lo = i + pad - k + 1;  // o * stride >= lo
    begin = lo > 0 ? (lo + stride - 1) / stride : 0;
    end = MinI((i + pad) / stride + 1, out);
  }
};

// y[p, c] = the max of x over the valid cells of output pixel p's window.
// SAME padding leaves at least one valid cell in every window.
struct MaxPool {
  Pool2DShape s;
  const float* x;
  float* y;
  PSRT_HOST_DEVICE void operator()(int64_t p, int64_t c) const {
    const int64_t oh_n = p / s.out_width();
    const int64_t ow = p % s.out_width();
    const int64_t oh = oh_n % s.out_height();
    const int64_t n = oh_n / s.out_height();
    const WindowRange hr(oh, s.stride_height, s.pad_top(), s.window_height,
                         s.in_height);
    const WindowRange wr(ow, s.stride_width, s.pad_left(), s.window_width,
                         s.in_width);
    const float* image = x + n * s.in_height * s.in_width * s.channels + c;
    float m = image[(hr.begin * s.in_width + wr.begin) * s.channels];
    for (int64_t h = hr.begin; h < hr.end; ++h) {
      for (int64_t w = wr.begin; w < wr.end; ++w) {
        m = MaxF(m, image[(h * s.in_width + w) * s.channels]);
      }
    }
    y[p * s.channels + c] = m;
  }
};

// dx[q, c] for input pixel q: the sum of dy over the outputs whose max is
// this cell. A window's max goes to its first cell (row-major) holding the
// max value, as in TensorFlow and PyTorch. Gathers (one writer per dx
// element), so it needs no atomics and is deterministic. Overwrites dx.
struct MaxPoolGrad {
  Pool2DShape s;
  const float* x;
  const float* y;
  const float* dy;
  float* dx;
  PSRT_HOST_DEVICE void operator()(int64_t q, int64_t c) const {
    const int64_t ih_n = q / s.in_width;
    const int64_t iw = q % s.in_width;
    const int64_t ih = ih_n % s.in_height;
    const int64_t n = ih_n / s.in_height;
    const int64_t oh_size = s.out_height(), ow_size = s.out_width();
    const CoveringRange hr(ih, s.stride_height, s.pad_top(), s.window_height,
                           oh_size);
    const CoveringRange wr(iw, s.stride_width, s.pad_left(), s.window_width,
                           ow_size);
    const float v = x[q * s.channels + c];
    float sum = 0.0f;
    for (int64_t oh = hr.begin; oh < hr.end; ++oh) {
      for (int64_t ow = wr.begin; ow < wr.end; ++ow) {
        const int64_t o = (n * oh_size + oh) * ow_size + ow;
        const float m = y[o * s.channels + c];
        if (v == m && IsFirstMax(n, oh, ow, c, ih, iw, m)) {
          sum += dy[o * s.channels + c];
        }
      }
    }
    dx[q * s.channels + c] = sum;
  }

 private:
  // Whether (ih, iw) is the first cell of output (oh, ow)'s window holding m.
  PSRT_HOST_DEVICE bool IsFirstMax(int64_t n, int64_t oh, int64_t ow,
                                   int64_t c, int64_t ih, int64_t iw,
                                   float m) const {
    const WindowRange hr(oh, s.stride_height, s.pad_top(), s.window_height,
                         s.in_height);
    const WindowRange wr(ow, s.stride_width, s.pad_left(), s.window_width,
                         s.in_width);
    const float* image = x + n * s.in_height * s.in_width * s.channels + c;
    for (int64_t h = hr.begin; h < hr.end; ++h) {
      for (int64_t w = wr.begin; w < wr.end; ++w) {
        if (image[(h * s.in_width + w) * s.channels] == m) {
          return h == ih && w == iw;
        }
      }
    }
    return false;
  }
};

// y[p, c] = the mean of x over the valid cells of output pixel p's window
// (padding is not counted, as in TensorFlow).
struct AvgPool {
  Pool2DShape s;
  const float* x;
  float* y;
  PSRT_HOST_DEVICE void operator()(int64_t p, int64_t c) const {
    const int64_t oh_n = p / s.out_width();
    const int64_t ow = p % s.out_width();
    const int64_t oh = oh_n % s.out_height();
    const int64_t n = oh_n / s.out_height();
    const WindowRange hr(oh, s.stride_height, s.pad_top(), s.window_height,
                         s.in_height);
    const WindowRange wr(ow, s.stride_width, s.pad_left(), s.window_width,
                         s.in_width);
    const float* image = x + n * s.in_height * s.in_width * s.channels + c;
    float sum = 0.0f;
    for (int64_t h = hr.begin; h < hr.end; ++h) {
      for (int64_t w = wr.begin; w < wr.end; ++w) {
        sum += image[(h * s.in_width + w) * s.channels];
      }
    }
    const float count =
        static_cast<float>((hr.end - hr.begin) * (wr.end - wr.begin));
    y[p * s.channels + c] = sum / count;
  }
};

// dx[q, c] = sum over the outputs whose window holds input pixel q of
// dy / (that window's valid cell count). Gathers; overwrites dx.
struct AvgPoolGrad {
  Pool2DShape s;
  const float* dy;
  float* dx;
  PSRT_HOST_DEVICE void operator()(int64_t q, int64_t c) const {
    const int64_t ih_n = q / s.in_width;
    const int64_t iw = q % s.in_width;
    const int64_t ih = ih_n % s.in_height;
    const int64_t n = ih_n / s.in_height;
    const int64_t oh_size = s.out_height(), ow_size = s.out_width();
    const CoveringRange hr(ih, s.stride_height, s.pad_top(), s.window_height,
                           oh_size);
    const CoveringRange wr(iw, s.stride_width, s.pad_left(), s.window_width,
                           ow_size);
    float sum = 0.0f;
    for (int64_t oh = hr.begin; oh < hr.end; ++oh) {
      const WindowRange wh(oh, s.stride_height, s.pad_top(), s.window_height,
                           s.in_height);
      for (int64_t ow = wr.begin; ow < wr.end; ++ow) {
        const WindowRange ww(ow, s.stride_width, s.pad_left(), s.window_width,
                             s.in_width);
        const float count =
            static_cast<float>((wh.end - wh.begin) * (ww.end - ww.begin));
        const int64_t o = (n * oh_size + oh) * ow_size + ow;
        sum += dy[o * s.channels + c] / count;
      }
    }
    dx[q * s.channels + c] = sum;
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

// Batch norm statistics of channel c from its sums over `rows` rows:
// mean[c] holds sum(x) / rows on entry; inv_std[c] holds sum((x - mean)^2)
// on entry and 1 / sqrt(var + epsilon) on exit (var = that sum / rows, the
// biased variance used to normalize). Moving statistics, when not null,
// follow TensorFlow/Keras' momentum (decay):
//   moving_mean = momentum * moving_mean + (1 - momentum) * mean
//   moving_var  = momentum * moving_var  + (1 - momentum) * var * n/(n-1)
// (the unbiased variance, as TensorFlow's and PyTorch's batch norms use).
struct BatchNormFinalize {
  int64_t rows;
  float epsilon;
  float momentum;
  const float* mean;
  float* inv_std;
  float* moving_mean;  // Or null.
  float* moving_var;   // Or null.
  PSRT_HOST_DEVICE void operator()(int64_t c) const {
    const float var = inv_std[c] / static_cast<float>(rows);
    inv_std[c] = RsqrtF(var + epsilon);
    if (moving_mean != nullptr) {
      const float unbiased =
          rows > 1 ? var * static_cast<float>(rows) / (rows - 1) : var;
      moving_mean[c] = momentum * moving_mean[c] + (1.0f - momentum) * mean[c];
      moving_var[c] = momentum * moving_var[c] + (1.0f - momentum) * unbiased;
    }
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

// Inverted dropout: y[i] = x[i] / keep_prob where kept, else 0. Its own
// backward (dx = dy masked and scaled the same way). y may alias x.
struct Dropout {
  const float* x;
  float keep_prob;
  uint64_t seed;
  float* y;
  PSRT_HOST_DEVICE void operator()(int64_t i) const {
    y[i] = DropoutKeep(seed, i, keep_prob) ? x[i] * (1.0f / keep_prob) : 0.0f;
  }
};

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
