#include "kernels/pool.h"

#include <algorithm>

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
      << "bad Pool2DShape: batch=" << s.batch << " input=" << s.in_height
      << "x" << s.in_width << "x" << s.channels
      << " window=" << s.window_height << "x" << s.window_width
      << " stride=" << s.stride_height << "x" << s.stride_width;
  CHECK(s.out_height() > 0 && s.out_width() > 0)
      << "a " << s.window_height << "x" << s.window_width
      << " VALID window does not fit a " << s.in_height << "x" << s.in_width
      << " input";
}

// Runs f(pixel, c) over [rows, cols] on the context's threads.
template <class F>
void RunRowCol(const CpuContext& ctx, int64_t rows, int64_t cols, const F& f) {
  ctx.ParallelFor(rows, RowGrain(cols), [&](int64_t begin, int64_t end) {
    ForEachRowCol(begin, end, cols, f);
  });
}

}  // namespace

void MaxPoolForward(const CpuContext& ctx, const Pool2DShape& s,
                    const float* x, float* y) {
  CheckShape(s);
  RunRowCol(ctx, s.batch * s.out_height() * s.out_width(), s.channels,
            functor::MaxPool{s, x, y});
}

void MaxPoolBackward(const CpuContext& ctx, const Pool2DShape& s,
                     const float* x, const float* y, const float* dy,
                     float* dx) {
  CheckShape(s);
  RunRowCol(ctx, s.batch * s.in_height * s.in_width, s.channels,
            functor::MaxPoolGrad{s, x, y, dy, dx});
}

void AvgPoolForward(const CpuContext& ctx, const Pool2DShape& s,
                    const float* x, float* y) {
  CheckShape(s);
  RunRowCol(ctx, s.batch * s.out_height() * s.out_width(), s.channels,
            functor::AvgPool{s, x, y});
}

void AvgPoolBackward(const CpuContext& ctx, const Pool2DShape& s,
                     const float* dy, float* dx) {
  CheckShape(s);
  RunRowCol(ctx, s.batch * s.in_height * s.in_width, s.channels,
            functor::AvgPoolGrad{s, dy, dx});
}

void GlobalAvgPoolForward(const CpuContext& ctx, const float* x,
                          int64_t batch, int64_t pixels, int64_t channels,
                          float* y) {
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
