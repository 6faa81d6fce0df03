#include "kernels/pool.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "glog/logging.h"
#include "kernels/elementwise.h"
#include "kernels/layer_functors.h"

namespace psrt {
namespace kernels {
namespace {

// Rows (pixels) per parallel block: at least this many elements.
constexpr int64_t kElementGrain = 1 << 14;

int64_t RowGrain(int64_t cols) {
  return std::max<int64_t>(1, kElementGrain / std::max<int64_t>(cols, 1));
}

void CheckShape(const Pool2DShape& s) {
  CHECK(s.batch > 0 && s.in_height > 0 && s.in_width > 0 && s.channels > 0 &&
        s.window_height > 0 && s.window_width > 0 && s.stride_height > 0 &&
        s.stride_width > 0)
      << "bad Pool2DShape: batch=" << s.batch << " input=" << s.in_height << "x"
      << s.in_width << "x" << s.channels << " window=" << s.window_height << "x"
      << s.window_width << " stride=" << s.stride_height << "x"
      << s.stride_width;
  CHECK(s.out_height() > 0 && s.out_width() > 0)
      << "a " << s.window_height << "x" << s.window_width
      << " VALID window does not fit a " << s.in_height << "x" << s.in_width
      << " input";
}

// Runs f(r, c) over [rows, cols] on the context's threads.
template <class F>
void RunRowCol(const CpuContext& ctx, int64_t rows, int64_t cols, const F& f) {
  ctx.ParallelFor(rows, RowGrain(cols), [&](int64_t begin, int64_t end) {
    ForEachRowCol(begin, end, cols, f);
  });
}

// Runs a pool functor f(pixel, 0, channels) over the pixels.
template <class F>
void RunPixels(const CpuContext& ctx, int64_t pixels, int64_t channels,
               const F& f) {
  ctx.ParallelFor(pixels, RowGrain(channels), [&](int64_t begin, int64_t end) {
    const F local = f;  // See ForEachIndex.
    for (int64_t p = begin; p < end; ++p) local(p, 0, channels);
  });
}

}  // namespace

void MaxPoolForward(const CpuContext& ctx, const Pool2DShape& s, const float* x,
                    float* y) {
  CheckShape(s);
  RunPixels(ctx, s.batch * s.out_height() * s.out_width(), s.channels,
            functor::MaxPool{functor::PoolGeometry(s), x, y});
}

namespace {

// A group of channels that MaxPoolBackward routes at once: one float, or a
// GCC/Clang vector of one register's width (8 floats with AVX, else 4), with
// the same operators.
#if defined(__AVX__)
constexpr int kVectorLanes = 8;
#else
constexpr int kVectorLanes = 4;
#endif
using Lane1 = float;
using LaneVector =
    float __attribute__((vector_size(kVectorLanes * sizeof(float))));
template <class V>
constexpr int kLaneCount = sizeof(V) / sizeof(float);

template <class V>
V LoadLanes(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
template <class V>
void StoreLanes(const V& v, float* p) {
  std::memcpy(p, &v, sizeof(V));
}
inline float LaneOf(Lane1 v, int) { return v; }
inline float LaneOf(const LaneVector& v, int i) { return v[i]; }

// MaxPoolBackward's work for the channels [c0, c0 + lanes) of one output
// pixel: finds its window's first max cell per channel and routes the
// pixel's gradient there. A window that overlaps no other (kDisjoint)
// writes all of its cells, zero but at the max, so that dx needs no clearing
// first; otherwise it adds into the max cell. Cells are numbered row-major
// within the window (floats, so that the selects stay in float vectors).
template <class V, bool kDisjoint>
void RouteMaxGradient(const functor::PoolGeometry& g,
                      const functor::Window& win, const float* xi,
                      const float* d, int64_t c0, float* dxi) {
  const int64_t C = g.channels;
  const int64_t win_width = win.w_end - win.w_begin;
  auto cell_offset = [&](int64_t h, int64_t w) {
    return (h * g.in_width + w) * C + c0;
  };
  V best = LoadLanes<V>(xi + cell_offset(win.h_begin, win.w_begin));
  V where = V{} + 0.0f;
  float number = 0.0f;
  for (int64_t h = win.h_begin; h < win.h_end; ++h) {
    for (int64_t w = win.w_begin; w < win.w_end; ++w, number += 1.0f) {
      const V v = LoadLanes<V>(xi + cell_offset(h, w));
      const auto greater = v > best;
      best = greater ? v : best;
      where = greater ? V{} + number : where;
    }
  }
  if (!kDisjoint) {
    for (int c = 0; c < kLaneCount<V>; ++c) {
      const int64_t k = static_cast<int64_t>(LaneOf(where, c));
      dxi[cell_offset(win.h_begin + k / win_width,
                      win.w_begin + k % win_width) +
          c] += d[c0 + c];
    }
    return;
  }
  const V grad = LoadLanes<V>(d + c0);
  number = 0.0f;
  for (int64_t h = win.h_begin; h < win.h_end; ++h) {
    for (int64_t w = win.w_begin; w < win.w_end; ++w, number += 1.0f) {
      StoreLanes<V>(where == number ? grad : V{} + 0.0f,
                    dxi + cell_offset(h, w));
    }
  }
}

// MaxPoolBackward on whole images [begin, end).
template <bool kDisjoint>
void MaxPoolBackwardImages(const functor::PoolGeometry& g, const float* x,
                           const float* dy, int64_t begin, int64_t end,
                           float* dx) {
  const int64_t C = g.channels;
  const int64_t image_size = g.in_height * g.in_width * C;
  for (int64_t n = begin; n < end; ++n) {
    const float* xi = x + n * image_size;
    float* dxi = dx + n * image_size;
    for (int64_t oh = 0; oh < g.out_height; ++oh) {
      for (int64_t ow = 0; ow < g.out_width; ++ow) {
        const functor::Window win(g, n, oh, ow);
        const float* d = dy + ((n * g.out_height + oh) * g.out_width + ow) * C;
        int64_t c0 = 0;
        for (; c0 + kVectorLanes <= C; c0 += kVectorLanes) {
          RouteMaxGradient<LaneVector, kDisjoint>(g, win, xi, d, c0, dxi);
        }
        for (; c0 < C; ++c0) {
          RouteMaxGradient<Lane1, kDisjoint>(g, win, xi, d, c0, dxi);
        }
      }
    }
  }
}

}  // namespace

void MaxPoolBackward(const CpuContext& ctx, const Pool2DShape& s,
                     const float* x, const float* y, const float* dy,
                     float* dx) {
  CheckShape(s);
  // The GPU gathers with functor::MaxPoolGrad, which must recheck every
  // window around a cell; the CPU instead scatters: threads own whole
  // images, find each window's first max cell per channel with a scan
  // vectorized over channels (as the forward does), and route dy there. Both
  // route each gradient to the same cell. When the windows tile the image
  // (stride == window, and they reach its end: LeNet's 2x2 pools), each
  // window writes its own cells and dx is written once; otherwise dx is
  // cleared and the gradients added.
  const functor::PoolGeometry g(s);
  const int64_t image_size = g.in_height * g.in_width * g.channels;
  const bool tiles =
      s.stride_height == s.window_height && s.stride_width == s.window_width &&
      g.out_height * g.stride_height - g.pad_top >= g.in_height &&
      g.out_width * g.stride_width - g.pad_left >= g.in_width;
  ctx.ParallelFor(s.batch, 1, [&](int64_t begin, int64_t end) {
    if (tiles) {
      MaxPoolBackwardImages<true>(g, x, dy, begin, end, dx);
      return;
    }
    std::fill(dx + begin * image_size, dx + end * image_size, 0.0f);
    MaxPoolBackwardImages<false>(g, x, dy, begin, end, dx);
  });
}

void AvgPoolForward(const CpuContext& ctx, const Pool2DShape& s, const float* x,
                    float* y) {
  CheckShape(s);
  RunPixels(ctx, s.batch * s.out_height() * s.out_width(), s.channels,
            functor::AvgPool{functor::PoolGeometry(s), x, y});
}

void AvgPoolBackward(const CpuContext& ctx, const Pool2DShape& s,
                     const float* dy, float* dx) {
  CheckShape(s);
  RunPixels(ctx, s.batch * s.in_height * s.in_width, s.channels,
            functor::AvgPoolGrad{functor::PoolGeometry(s), dy, dx});
}

void GlobalAvgPoolForward(const CpuContext& ctx, const float* x, int64_t batch,
                          int64_t pixels, int64_t channels, float* y) {
  CHECK(batch > 0 && pixels > 0 && channels > 0);
  // Image by image, adding whole rows so that reads are contiguous (the GPU
  // runs functor::GlobalAvgPool per (n, c)).
  const float inv = 1.0f / static_cast<float>(pixels);
  ctx.ParallelFor(batch, RowGrain(pixels * channels),
                  [&](int64_t begin, int64_t end) {
                    for (int64_t n = begin; n < end; ++n) {
                      float* out = y + n * channels;
                      const float* image = x + n * pixels * channels;
                      std::fill_n(out, channels, 0.0f);
                      for (int64_t p = 0; p < pixels; ++p) {
                        const float* row = image + p * channels;
                        for (int64_t c = 0; c < channels; ++c) out[c] += row[c];
                      }
                      for (int64_t c = 0; c < channels; ++c) out[c] *= inv;
                    }
                  });
}

void GlobalAvgPoolBackward(const CpuContext& ctx, const float* dy,
                           int64_t batch, int64_t pixels, int64_t channels,
                           float* dx) {
  CHECK(batch > 0 && pixels > 0 && channels > 0);
  RunRowCol(ctx, batch * pixels, channels,
            functor::GlobalAvgPoolGrad{dy, pixels, channels, dx});
}

}  // namespace kernels
}  // namespace psrt
