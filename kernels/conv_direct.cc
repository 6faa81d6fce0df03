#include "kernels/conv_direct.h"

#include <algorithm>
#include <vector>

#include "kernels/gemm.h"

namespace psrt {
namespace kernels {
namespace internal {

ConvGeometry ForwardGeometry(const Conv2DShape& s) {
  return ConvGeometry{s.in_height,     s.in_width,     s.in_channels,
                      s.out_height(),  s.out_width(),  s.out_channels,
                      s.filter_height, s.filter_width, s.stride_height,
                      s.stride_width,  s.pad_top(),    s.pad_left()};
}

ConvGeometry DxGeometry(const Conv2DShape& s) {
  return ConvGeometry{s.out_height(),
                      s.out_width(),
                      s.out_channels,
                      s.in_height,
                      s.in_width,
                      s.in_channels,
                      s.filter_height,
                      s.filter_width,
                      1,
                      1,
                      s.filter_height - 1 - s.pad_top(),
                      s.filter_width - 1 - s.pad_left()};
}

void PadImage(const ConvGeometry& g, const float* image, int64_t height,
              int64_t width, float* padded) {
  const int64_t rows = std::min(g.in_h, height - g.pad_top);
  const int64_t cols = std::min(g.in_w, width - g.pad_left);
  for (int64_t h = 0; h < rows; ++h) {
    std::copy_n(image + h * g.in_w * g.in_c, cols * g.in_c,
                padded + ((h + g.pad_top) * width + g.pad_left) * g.in_c);
  }
}

namespace {

// Copies image into the interior of padded, whose border is zero.
void Pad(const ConvGeometry& g, const float* image, float* padded) {
  PadImage(g, image, g.height(), g.width(), padded);
}

// The window rows kh of output row oh's pixels, as the rows of a matrix
// [out_w, run] with row stride sw * in_c.
const float* WindowRuns(const ConvGeometry& g, const float* padded, int64_t oh,
                        int64_t kh) {
  return padded + (oh * g.sh + kh) * g.width() * g.in_c;
}

// out = the convolution of one padded image, output row by output row.
void ConvolveImage(GemmPath path, const ConvGeometry& g, const float* padded,
                   const float* filter, std::vector<GemmTerm>* terms,
                   float* out) {
  terms->resize(g.fh);
  for (int64_t oh = 0; oh < g.out_h; ++oh) {
    for (int64_t kh = 0; kh < g.fh; ++kh) {
      (*terms)[kh] = GemmTerm{WindowRuns(g, padded, oh, kh),
                              filter + kh * g.run() * g.out_c, g.run()};
    }
    BatchReduceGemmOnPath(path, BatchReduceGemm{
        g.out_w, g.out_c, false, false, terms->data(), g.fh, g.sw * g.in_c,
        g.out_c, 1.0f, 0.0f, out + oh * g.out_w * g.out_c, g.out_c});
  }
}

// dfilter += the filter gradient of one padded image and its dy.
void AddFilterGradient(GemmPath path, const ConvGeometry& g, const float* padded,
                       const float* dy, std::vector<GemmTerm>* terms,
                       float* dfilter) {
  terms->resize(g.out_h);
  for (int64_t kh = 0; kh < g.fh; ++kh) {
    for (int64_t oh = 0; oh < g.out_h; ++oh) {
      (*terms)[oh] = GemmTerm{WindowRuns(g, padded, oh, kh),
                              dy + oh * g.out_w * g.out_c, g.out_w};
    }
    BatchReduceGemmOnPath(path, BatchReduceGemm{
        g.run(), g.out_c, true, false, terms->data(), g.out_h, g.sw * g.in_c,
        g.out_c, 1.0f, 1.0f, dfilter + kh * g.run() * g.out_c, g.out_c});
  }
}

// The calling thread's list of GEMM terms, reused from call to call so that
// a training step allocates nothing once the first has sized it.
std::vector<GemmTerm>* TermBuffer() {
  thread_local std::vector<GemmTerm> terms;
  return &terms;
}

}  // namespace

bool DirectConvForwardApplies(GemmPath path, const Conv2DShape& /*s*/) {
  return path != GemmPath::kPortable;  // A blocked path: batch-reduce GEMMs.
}

bool DirectConvBackwardApplies(GemmPath path, const Conv2DShape& s) {
  return DirectConvForwardApplies(path, s) && s.stride_height == 1 &&
         s.stride_width == 1;
}

int64_t DirectConvForwardScratch(const Conv2DShape& s) {
  return ForwardGeometry(s).padded_size();
}

int64_t DirectConvBackwardScratch(const Conv2DShape& s) {
  return ForwardGeometry(s).padded_size() + DxGeometry(s).padded_size();
}

void DirectConvForward(GemmPath path, const Conv2DShape& s, const float* x,
                       const float* filter, int64_t begin, int64_t end,
                       float* scratch, float* y) {
  const ConvGeometry g = ForwardGeometry(s);
  std::fill_n(scratch, g.padded_size(), 0.0f);
  std::vector<GemmTerm>* terms = TermBuffer();
  for (int64_t n = begin; n < end; ++n) {
    Pad(g, x + n * g.in_image(), scratch);
    ConvolveImage(path, g, scratch, filter, terms, y + n * g.out_image());
  }
}

void FlipFilter(const Conv2DShape& s, const float* filter, float* flipped) {
  const int64_t fh = s.filter_height, fw = s.filter_width;
  const int64_t in = s.in_channels, out = s.out_channels;
  for (int64_t kh = 0; kh < fh; ++kh) {
    for (int64_t kw = 0; kw < fw; ++kw) {
      const float* src = filter + ((fh - 1 - kh) * fw + (fw - 1 - kw)) * in * out;
      float* dst = flipped + (kh * fw + kw) * out * in;
      for (int64_t i = 0; i < in; ++i) {
        for (int64_t o = 0; o < out; ++o) dst[o * in + i] = src[i * out + o];
      }
    }
  }
}

void DirectConvBackward(GemmPath path, const Conv2DShape& s, const float* x,
                        const float* flipped, const float* dy, int64_t begin,
                        int64_t end, float* scratch, float* dx,
                        float* dfilter) {
  const ConvGeometry fwd = ForwardGeometry(s), back = DxGeometry(s);
  float* padded_x = scratch;
  float* padded_dy = scratch + fwd.padded_size();
  if (dfilter != nullptr) std::fill_n(padded_x, fwd.padded_size(), 0.0f);
  if (dx != nullptr) std::fill_n(padded_dy, back.padded_size(), 0.0f);
  std::vector<GemmTerm>* terms = TermBuffer();
  for (int64_t n = begin; n < end; ++n) {
    const float* dy_n = dy + n * fwd.out_image();
    if (dfilter != nullptr) {
      Pad(fwd, x + n * fwd.in_image(), padded_x);
      AddFilterGradient(path, fwd, padded_x, dy_n, terms, dfilter);
    }
    if (dx != nullptr) {
      Pad(back, dy_n, padded_dy);
      ConvolveImage(path, back, padded_dy, flipped, terms,
                    dx + n * back.out_image());
    }
  }
}

}  // namespace internal
}  // namespace kernels
}  // namespace psrt
