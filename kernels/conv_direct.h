// The direct method of Conv2DForward / Conv2DBackward (conv.h): batch-reduce
// GEMMs (gemm.h) on the zero-padded input, read in place, instead of im2col
// and one GEMM on a column matrix. Internal to kernels/; conv.cc picks the
// method, splits the batch over threads and owns the workspace.
//
// Each image is copied into a zero-padded buffer [height, width, in] whose
// border stays zero from image to image. There, row kh of the window of
// output pixel (oh, ow) is one contiguous run of fw * in floats, at padded
// row oh * sh + kh, column ow * sw; the runs of one output row's pixels lie
// sw * in floats apart, so they are the overlapping rows of a matrix read in
// place. Then:
//   y row oh [ow_size, out] = sum over kh of runs(oh, kh) [ow_size, fw * in]
//                             * filter rows kh [fw * in, out];
//   dfilter rows kh [fw * in, out] += sum over oh of runs(oh, kh)^T
//                             * dy row oh [ow_size, out];
//   dx = the stride-1 convolution of dy, padded by (fh - 1 - pad_top,
//        fw - 1 - pad_left), by the filter flipped in space with its
//        channel axes swapped: no column matrix and no scatter-add.
// The GEMMs are small (an output row by a window) and many, so the method
// runs on a GEMM path that runs small strided blocks at full speed, and
// sums each one's terms in registers.
#ifndef PSRT_KERNELS_CONV_DIRECT_H_
#define PSRT_KERNELS_CONV_DIRECT_H_

#include <cstdint>

#include "kernels/gemm.h"
#include "kernels/window.h"

namespace psrt {
namespace kernels {
namespace internal {

// A convolution as the direct and Winograd methods (conv_winograd.h) run
// it: input images [in_h, in_w, in_c] go into a zero-padded buffer whose
// row pad_top, column pad_left holds the image's first pixel; output images
// are [out_h, out_w, out_c]; the filter is [fh, fw, in_c, out_c]. The direct
// method's buffer is [height(), width(), in_c] (columns or rows that no
// window reads are left out).
struct ConvGeometry {
  int64_t in_h, in_w, in_c;
  int64_t out_h, out_w, out_c;
  int64_t fh, fw, sh, sw;
  int64_t pad_top, pad_left;

  int64_t height() const { return (out_h - 1) * sh + fh; }
  int64_t width() const { return (out_w - 1) * sw + fw; }
  int64_t padded_size() const { return height() * width() * in_c; }
  int64_t run() const { return fw * in_c; }  // One window row.
  int64_t in_image() const { return in_h * in_w * in_c; }
  int64_t out_image() const { return out_h * out_w * out_c; }
};

// The forward convolution of s.
ConvGeometry ForwardGeometry(const Conv2DShape& s);
// dx as a forward convolution: of dy, stride 1, by the flipped filter
// (FlipFilter). Its padding puts output row h's window over dy rows
// h + pad_top - kh.
ConvGeometry DxGeometry(const Conv2DShape& s);

// Copies image into a padded buffer [height, width, in_c] at row pad_top,
// column pad_left, cropped to the buffer; the border is left as it is (the
// callers zero it once and reuse the buffer from image to image).
void PadImage(const ConvGeometry& g, const float* image, int64_t height,
              int64_t width, float* padded);

// Whether the direct method runs this forward, and this backward (which
// needs stride 1, for dx), on GEMM path `path`: the blocked paths (AVX-512,
// AVX2) run the small strided GEMMs at full speed; Eigen repacks its
// operands per call.
bool DirectConvForwardApplies(GemmPath path, const Conv2DShape& s);
bool DirectConvBackwardApplies(GemmPath path, const Conv2DShape& s);

// Floats of scratch memory each thread passes to the forward and backward.
int64_t DirectConvForwardScratch(const Conv2DShape& s);
int64_t DirectConvBackwardScratch(const Conv2DShape& s);

// y for images [begin, end) of the batch, with `path`'s GEMMs. Overwrites
// their y.
void DirectConvForward(GemmPath path, const Conv2DShape& s, const float* x,
                       const float* filter, int64_t begin, int64_t end,
                       float* scratch, float* y);

// The filter of dx's convolution: flipped[kh][kw][o][i] =
// filter[fh - 1 - kh][fw - 1 - kw][i][o]. Overwrites flipped
// (filter_size() floats).
void FlipFilter(const Conv2DShape& s, const float* filter, float* flipped);

// The backward for images [begin, end), with `path`'s GEMMs: adds their
// filter gradient into dfilter and overwrites their dx; either may be null
// to skip it. flipped is FlipFilter's output (unused without dx).
void DirectConvBackward(GemmPath path, const Conv2DShape& s, const float* x,
                        const float* flipped, const float* dy, int64_t begin,
                        int64_t end, float* scratch, float* dx, float* dfilter);

}  // namespace internal
}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_CONV_DIRECT_H_
