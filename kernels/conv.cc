#include "kernels/conv.h"

#include <algorithm>
#include <cstring>

#include "Eigen/Core"
#include "glog/logging.h"
#include "kernels/conv_direct.h"
#include "kernels/conv_winograd.h"
#include "kernels/elementwise.h"
#include "kernels/functors.h"
#include "kernels/ops.h"

namespace psrt {
namespace kernels {
namespace {

// A column buffer per thread of at most this many floats (1 MiB, unless
// one image needs more): GEMMs of a few hundred rows or more, which run near
// their peak, on a buffer that stays in the core's L2 (half of it here).
constexpr int64_t kColumnBufferFloats = 1 << 18;
// Threads that take a share of one convolution (more wait).
constexpr int64_t kMaxThreads = 64;
// A thread adds the bias to (sums its gradient from) blocks of about this
// many output floats (1 MiB) of its share, right after (before) the method
// runs on the block, while they are in its core's L2.
constexpr int64_t kBiasBlockFloats = 1 << 18;

void CheckShape(const Conv2DShape& s) {
  CHECK(s.batch > 0 && s.in_height > 0 && s.in_width > 0 && s.in_channels > 0 &&
        s.filter_height > 0 && s.filter_width > 0 && s.out_channels > 0 &&
        s.stride_height > 0 && s.stride_width > 0)
      << "bad Conv2DShape: batch=" << s.batch << " input=" << s.in_height << "x"
      << s.in_width << "x" << s.in_channels << " filter=" << s.filter_height
      << "x" << s.filter_width << "x" << s.out_channels
      << " stride=" << s.stride_height << "x" << s.stride_width;
  CHECK(s.out_height() > 0 && s.out_width() > 0)
      << "a " << s.filter_height << "x" << s.filter_width
      << " VALID window does not fit a " << s.in_height << "x" << s.in_width
      << " input";
}

// The work split of a convolution: which images each thread takes, and how
// many it puts in one GEMM.
struct Plan {
  int64_t pixels;  // Output pixels per image.
  int64_t patch;   // fh * fw * in: a column-matrix row.
  int threads;     // Threads that take a share of the batch.
  int64_t chunk;   // Images per GEMM.
};

Plan MakePlan(const CpuContext& ctx, const Conv2DShape& s) {
  Plan p;
  p.pixels = s.out_height() * s.out_width();
  p.patch = s.filter_height * s.filter_width * s.in_channels;
  p.threads = static_cast<int>(
      std::min<int64_t>({ctx.num_threads(), s.batch, kMaxThreads}));
  const int64_t per_thread = (s.batch + p.threads - 1) / p.threads;
  p.chunk = std::clamp<int64_t>(kColumnBufferFloats / (p.pixels * p.patch), 1,
                                per_thread);
  return p;
}

// The images [begin, end) of thread t's share.
void Share(const Conv2DShape& s, const Plan& p, int64_t t, int64_t* begin,
           int64_t* end) {
  *begin = s.batch * t / p.threads;
  *end = s.batch * (t + 1) / p.threads;
}

// Runs fn(t, begin, end) for each thread t's share [begin, end) of the
// batch, on the context's threads.
template <class Fn>
void ForEachShare(const CpuContext& ctx, const Conv2DShape& s, const Plan& p,
                  Fn&& fn) {
  ctx.ParallelFor(p.threads, 1, [&](int64_t t_begin, int64_t t_end) {
    for (int64_t t = t_begin; t < t_end; ++t) {
      int64_t begin, end;
      Share(s, p, t, &begin, &end);
      fn(t, begin, end);
    }
  });
}

// The images of one bias block.
int64_t BiasBlockImages(const Plan& p, const Conv2DShape& s) {
  return std::max<int64_t>(1,
                           kBiasBlockFloats / (p.pixels * s.out_channels));
}

// y[r, c] += bias[c] for the rows r of y [rows, channels]: BiasAddForward's
// functor, on the calling thread.
void AddBias(const float* bias, int64_t channels, int64_t rows, float* y) {
  ForEachRowCol(0, rows, channels, functor::BiasAdd{y, bias, channels, y});
}

// sum[c] += dy[r, c] over the rows r of dy [rows, channels], in order.
void AddColumnSums(const float* dy, int64_t channels, int64_t rows,
                   float* sum) {
  Eigen::Map<Eigen::ArrayXf> acc(sum, channels);
  for (int64_t r = 0; r < rows; ++r) {
    acc += Eigen::Map<const Eigen::ArrayXf>(dy + r * channels, channels);
  }
}

// Runs method(t, begin, end) on each thread t's share of the batch; with a
// bias, block by block, adding the bias to each block's y as it is made.
template <class Method>
void ForwardByShare(const CpuContext& ctx, const Conv2DShape& s,
                    const Plan& p, const float* bias, float* y,
                    Method&& method) {
  const int64_t block = BiasBlockImages(p, s);
  ForEachShare(ctx, s, p, [&](int64_t t, int64_t begin, int64_t end) {
    if (bias == nullptr) {
      method(t, begin, end);
      return;
    }
    for (int64_t n = begin; n < end; n += block) {
      const int64_t stop = std::min(end, n + block);
      method(t, n, stop);
      AddBias(bias, s.out_channels, (stop - n) * p.pixels,
              y + n * p.pixels * s.out_channels);
    }
  });
}

// Copies and clears of the runs that im2col moves: a filter row of the
// window, fw * in floats (5 for a one-channel image). Runs of 4 to 16 floats
// take two overlapping fixed-size moves, so that the shortest, the most
// numerous, cost no loop; longer ones Eigen's vectorized loop.
void CopyLongRun(const float* src, int64_t n, float* dst) {
  Eigen::Map<Eigen::ArrayXf>(dst, n) = Eigen::Map<const Eigen::ArrayXf>(src, n);
}
inline void CopyFloats(const float* src, int64_t n, float* dst) {
  if (n >= 4 && n <= 8) {
    std::memcpy(dst, src, 4 * sizeof(float));
    std::memcpy(dst + n - 4, src + n - 4, 4 * sizeof(float));
  } else if (n > 8 && n <= 16) {
    std::memcpy(dst, src, 8 * sizeof(float));
    std::memcpy(dst + n - 8, src + n - 8, 8 * sizeof(float));
  } else {
    CopyLongRun(src, n, dst);
  }
}
void ZeroFloats(int64_t n, float* dst) {
  Eigen::Map<Eigen::ArrayXf>(dst, n).setZero();
}
void AddFloats(const float* src, int64_t n, float* dst) {
  Eigen::Map<Eigen::ArrayXf>(dst, n) +=
      Eigen::Map<const Eigen::ArrayXf>(src, n);
}

// Walks the column matrix of `images` images: row (n, oh, ow) holds the
// window of output pixel (oh, ow) of image n as [fh, fw, in], one run of
// fw * in floats per filter row kh, taken from input row h = oh * sh -
// pad_top + kh, columns w0 = ow * sw - pad_left onwards. For the part of a
// run inside the image (contiguous NHWC memory) it calls
// inside(col_offset, x_offset, count); for padding, outside(col_offset,
// count). Offsets count floats from the first image and its matrix. The
// loop over ow is split where windows start and stop touching the padding,
// so that the middle part, nearly all of it, only steps two offsets.
template <class Inside, class Outside>
void WalkColumnMatrix(const Conv2DShape& s, int64_t images, Inside&& inside,
                      Outside&& outside) {
  const int64_t oh_size = s.out_height(), ow_size = s.out_width();
  const int64_t pad_top = s.pad_top(), pad_left = s.pad_left();
  const int64_t in_height = s.in_height, in_width = s.in_width;
  const int64_t sh = s.stride_height, sw = s.stride_width;
  const int64_t c = s.in_channels, fh = s.filter_height, fw = s.filter_width;
  const int64_t row_len = fw * c, patch = fh * row_len;
  const int64_t image_size = in_height * in_width * c;
  // Windows [ow_begin, ow_end) lie inside the image's width.
  const int64_t ow_begin = std::min(ow_size, (pad_left + sw - 1) / sw);
  const int64_t ow_end = std::clamp<int64_t>(
      in_width - fw + pad_left < 0 ? 0 : (in_width - fw + pad_left) / sw + 1,
      ow_begin, ow_size);
  // A window that crosses the left or right edge of the image.
  auto edge_run = [&](int64_t ow, int64_t col, int64_t x_row) {
    const int64_t w0 = ow * sw - pad_left;
    const int64_t kw_begin = std::max<int64_t>(0, -w0);
    const int64_t kw_end = std::min<int64_t>(fw, in_width - w0);
    if (kw_begin >= kw_end) {
      outside(col, row_len);
      return;
    }
    if (kw_begin > 0) outside(col, kw_begin * c);
    inside(col + kw_begin * c, x_row + (w0 + kw_begin) * c,
           (kw_end - kw_begin) * c);
    if (kw_end < fw) outside(col + kw_end * c, (fw - kw_end) * c);
  };
  for (int64_t n = 0; n < images; ++n) {
    for (int64_t oh = 0; oh < oh_size; ++oh) {
      const int64_t first_row = (n * oh_size + oh) * ow_size * patch;
      for (int64_t kh = 0; kh < fh; ++kh) {
        const int64_t h = oh * sh - pad_top + kh;
        const int64_t col = first_row + kh * row_len;
        if (h < 0 || h >= in_height) {
          for (int64_t ow = 0; ow < ow_size; ++ow) {
            outside(col + ow * patch, row_len);
          }
          continue;
        }
        const int64_t x_row = n * image_size + h * in_width * c;
        for (int64_t ow = 0; ow < ow_begin; ++ow) {
          edge_run(ow, col + ow * patch, x_row);
        }
        int64_t x = x_row + (ow_begin * sw - pad_left) * c;
        for (int64_t ow = ow_begin; ow < ow_end; ++ow, x += sw * c) {
          inside(col + ow * patch, x, row_len);
        }
        for (int64_t ow = ow_end; ow < ow_size; ++ow) {
          edge_run(ow, col + ow * patch, x_row);
        }
      }
    }
  }
}

// Fills the column matrix of `images` images starting at x (zeros for
// padding).
void Im2Col(const Conv2DShape& s, const float* x, int64_t images, float* col) {
  WalkColumnMatrix(
      s, images,
      [&](int64_t c, int64_t i, int64_t n) { CopyFloats(x + i, n, col + c); },
      [&](int64_t c, int64_t n) { ZeroFloats(n, col + c); });
}

// The adjoint of Im2Col: adds every column-matrix entry into the input cell
// it was copied from (padding entries are dropped). dx must start zeroed.
void Col2Im(const Conv2DShape& s, const float* col, int64_t images, float* dx) {
  WalkColumnMatrix(
      s, images,
      [&](int64_t c, int64_t i, int64_t n) { AddFloats(col + c, n, dx + i); },
      [](int64_t, int64_t) {});
}

// The filter as a row-major [out, patch] matrix (its transpose): Eigen's
// GEMM runs faster with this operand order for both y = cols filter and
// d(cols) = dy filter^T.
float* TransposedFilter(const Conv2DShape& s, const Plan& p,
                        const float* filter, Workspace* workspace, int slot) {
  float* t = workspace->Get(slot, p.patch * s.out_channels);
  for (int64_t k = 0; k < p.patch; ++k) {
    for (int64_t o = 0; o < s.out_channels; ++o) {
      t[o * p.patch + k] = filter[k * s.out_channels + o];
    }
  }
  return t;
}

}  // namespace

namespace internal {

void Conv2DForwardOnPath(GemmPath path, const CpuContext& ctx,
                         const Conv2DShape& s, const float* x,
                         const float* filter, const float* bias, float* y,
                         Workspace* workspace) {
  CheckShape(s);
  const Plan p = MakePlan(ctx, s);
  if (s.is_pointwise()) {
    const int64_t rows = s.batch * p.pixels;
    GemmOnPath(path, ctx, MatMulShape{rows, s.out_channels, s.in_channels},
               1.0f, x, filter, 0.0f, y);
    if (bias != nullptr) BiasAddForward(ctx, y, bias, rows, s.out_channels, y);
    return;
  }
  if (WinogradConvApplies(path, s)) {
    float* points = workspace->Get(p.threads, WinogradFilterFloats(s));
    WinogradTransformFilter(
        s, filter, workspace->Get(p.threads + 1, WinogradFilterScratch(s)),
        points);
    float* scratch[kMaxThreads];
    for (int t = 0; t < p.threads; ++t) {
      scratch[t] = workspace->Get(t, WinogradForwardScratch(s));
    }
    ForwardByShare(ctx, s, p, bias, y,
                   [&](int64_t t, int64_t begin, int64_t end) {
                     WinogradConvForward(path, s, x, points, begin, end,
                                         scratch[t], y);
                   });
    return;
  }
  if (DirectConvForwardApplies(path, s)) {
    float* scratch[kMaxThreads];
    for (int t = 0; t < p.threads; ++t) {
      scratch[t] = workspace->Get(t, DirectConvForwardScratch(s));
    }
    ForwardByShare(ctx, s, p, bias, y,
                   [&](int64_t t, int64_t begin, int64_t end) {
                     DirectConvForward(path, s, x, filter, begin, end,
                                       scratch[t], y);
                   });
    return;
  }
  float* cols[kMaxThreads];
  for (int t = 0; t < p.threads; ++t) {
    cols[t] = workspace->Get(t, p.chunk * p.pixels * p.patch);
  }
  const float* filter_t =
      TransposedFilter(s, p, filter, workspace, /*slot=*/p.threads);
  const int64_t in_image = s.in_height * s.in_width * s.in_channels;
  const int64_t out_image = p.pixels * s.out_channels;
  ForwardByShare(ctx, s, p, bias, y, [&](int64_t t, int64_t begin,
                                         int64_t end) {
    for (int64_t n = begin; n < end; n += p.chunk) {
      const int64_t images = std::min(p.chunk, end - n);
      Im2Col(s, x + n * in_image, images, cols[t]);
      GemmOnCallingThreadOnPath(
          path,
          MatMulShape{images * p.pixels, s.out_channels, p.patch, false, true},
          1.0f, cols[t], filter_t, 0.0f, y + n * out_image);
    }
  });
}

void Conv2DBackwardOnPath(GemmPath path, const CpuContext& ctx,
                          const Conv2DShape& s, const float* x,
                          const float* filter, const float* dy, float* dx,
                          float* dfilter, float* dbias, Workspace* workspace) {
  CheckShape(s);
  const Plan p = MakePlan(ctx, s);
  if (dbias != nullptr &&
      (s.is_pointwise() || (dx == nullptr && dfilter == nullptr))) {
    BiasAddBackward(ctx, dy, s.batch * p.pixels, s.out_channels, dbias);
    dbias = nullptr;
  }
  if (s.is_pointwise()) {
    // y = x * filter as [rows, in] x [in, out] (MatMulBackward's formulas).
    const int64_t rows = s.batch * p.pixels;
    const int64_t in = s.in_channels, out = s.out_channels;
    if (dx != nullptr) {  // dx = dy filter^T.
      GemmOnPath(path, ctx, MatMulShape{rows, in, out, false, true}, 1.0f, dy,
                 filter, 0.0f, dx);
    }
    if (dfilter != nullptr) {  // dfilter = x^T dy.
      GemmOnPath(path, ctx, MatMulShape{in, out, rows, true, false}, 1.0f, x,
                 dy, 0.0f, dfilter);
    }
    return;
  }
  if (dx == nullptr && dfilter == nullptr) return;
  // Slot t: thread t's column matrix (and then its d(column matrix)), or its
  // direct or Winograd scratch; slot threads + t: thread t's partial filter
  // gradient (at the points for Winograd; otherwise thread 0 sums into
  // dfilter itself); slot 2 * threads: the transposed (im2col) or flipped
  // (direct, Winograd) filter; 2 * threads + 1: the flipped filter at the
  // points; 2 * threads + 2: the Winograd transforms' scratch;
  // 2 * threads + 3: the threads' partial bias gradients, [threads, out].
  const bool winograd = WinogradConvApplies(path, s);
  const bool direct = !winograd && DirectConvBackwardApplies(path, s);
  const int64_t filter_size = s.filter_size();
  const int64_t partial_size = winograd ? WinogradFilterFloats(s) : filter_size;
  float* const transform_scratch =
      winograd ? workspace->Get(2 * p.threads + 2, WinogradFilterScratch(s))
               : nullptr;
  float* scratch[kMaxThreads];
  float* partials[kMaxThreads];
  for (int t = 0; t < p.threads; ++t) {
    scratch[t] = workspace->Get(
        t, winograd ? WinogradBackwardScratch(s)
           : direct ? DirectConvBackwardScratch(s)
                    : p.chunk * p.pixels * p.patch);
    partials[t] = dfilter == nullptr          ? nullptr
                  : t == 0 && !winograd ? dfilter
                                        : workspace->Get(p.threads + t, partial_size);
  }
  const float* filter_t = nullptr;
  if (dx != nullptr && (direct || winograd)) {
    float* flipped = workspace->Get(2 * p.threads, filter_size);
    FlipFilter(s, filter, flipped);
    filter_t = flipped;
    if (winograd) {
      float* points = workspace->Get(2 * p.threads + 1, WinogradFilterFloats(s));
      WinogradTransformFilter(s, flipped, transform_scratch, points);
      filter_t = points;
    }
  } else if (dx != nullptr) {
    filter_t = TransposedFilter(s, p, filter, workspace, 2 * p.threads);
  }
  float* const bias_partials =
      dbias == nullptr
          ? nullptr
          : workspace->Get(2 * p.threads + 3, p.threads * s.out_channels);
  const int64_t in_image = s.in_height * s.in_width * s.in_channels;
  const int64_t out_image = p.pixels * s.out_channels;
  // Thread t's backward of images [begin, end): dx, and its partial filter
  // gradient added to.
  auto backward = [&](int64_t t, int64_t begin, int64_t end) {
    if (winograd) {
      WinogradConvBackward(path, s, x, filter_t, dy, begin, end, scratch[t], dx,
                           partials[t]);
      return;
    }
    if (direct) {
      DirectConvBackward(path, s, x, filter_t, dy, begin, end, scratch[t], dx,
                         partials[t]);
      return;
    }
    if (dx != nullptr) {
      std::fill(dx + begin * in_image, dx + end * in_image, 0.0f);
    }
    float* cols = scratch[t];
    for (int64_t n = begin; n < end; n += p.chunk) {
      const int64_t images = std::min(p.chunk, end - n);
      const int64_t rows = images * p.pixels;
      const float* dy_n = dy + n * out_image;
      if (dfilter != nullptr) {
        // dfilter += cols^T dy: [patch, rows] x [rows, out].
        Im2Col(s, x + n * in_image, images, cols);
        GemmOnCallingThreadOnPath(
            path, MatMulShape{p.patch, s.out_channels, rows, true, false}, 1.0f,
            cols, dy_n, 1.0f, partials[t]);
      }
      if (dx != nullptr) {
        // d(cols) = dy filter^T: [rows, out] x [out, patch].
        GemmOnCallingThreadOnPath(path,
                                  MatMulShape{rows, p.patch, s.out_channels},
                                  1.0f, dy_n, filter_t, 0.0f, cols);
        Col2Im(s, cols, images, dx + n * in_image);
      }
    }
  };
  const int64_t block = BiasBlockImages(p, s);
  ForEachShare(ctx, s, p, [&](int64_t t, int64_t begin, int64_t end) {
    if (dfilter != nullptr) std::fill_n(partials[t], partial_size, 0.0f);
    if (dbias == nullptr) {
      backward(t, begin, end);
      return;
    }
    // Block by block: the sums of dy bring the block into the cache that
    // the method reads it from.
    float* bias_sum = bias_partials + t * s.out_channels;
    std::fill_n(bias_sum, s.out_channels, 0.0f);
    for (int64_t n = begin; n < end; n += block) {
      const int64_t stop = std::min(end, n + block);
      AddColumnSums(dy + n * out_image, s.out_channels, (stop - n) * p.pixels,
                    bias_sum);
      backward(t, n, stop);
    }
  });
  if (dbias != nullptr) {
    std::copy_n(bias_partials, s.out_channels, dbias);
    for (int t = 1; t < p.threads; ++t) {
      AddFloats(bias_partials + t * s.out_channels, s.out_channels, dbias);
    }
  }
  if (dfilter == nullptr) return;
  if (p.threads > 1) {
    float* sum = partials[0];
    ctx.ParallelFor(partial_size, 1 << 14, [&](int64_t begin, int64_t end) {
      for (int t = 1; t < p.threads; ++t) {
        const float* part = partials[t];
        for (int64_t i = begin; i < end; ++i) sum[i] += part[i];
      }
    });
  }
  if (winograd) {
    WinogradFilterGradient(s, partials[0], transform_scratch, dfilter);
  }
}

}  // namespace internal

void Conv2DForward(const CpuContext& ctx, const Conv2DShape& s, const float* x,
                   const float* filter, const float* bias, float* y,
                   Workspace* workspace) {
  internal::Conv2DForwardOnPath(BestGemmPath(), ctx, s, x, filter, bias, y,
                                workspace);
}

void Conv2DBackward(const CpuContext& ctx, const Conv2DShape& s, const float* x,
                    const float* filter, const float* dy, float* dx,
                    float* dfilter, float* dbias, Workspace* workspace) {
  internal::Conv2DBackwardOnPath(BestGemmPath(), ctx, s, x, filter, dy, dx,
                                 dfilter, dbias, workspace);
}

}  // namespace kernels
}  // namespace psrt
