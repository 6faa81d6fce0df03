// The Winograd method of Conv2DForward / Conv2DBackward (conv.h) for
// stride-1 convolutions with 5x5 or 3x3 filters: Winograd's minimal
// filtering F(4x4, 5x5) and F(4x4, 3x3) (Lavin & Gray, "Fast Algorithms for
// Convolutional Neural Networks", 2016). Internal to kernels/; conv.cc picks
// the method, splits the batch over threads and owns the workspace.
//
// The output is cut into 4x4 tiles, each computed from an alpha x alpha tile
// d of the zero-padded input (alpha = 8 for 5x5 filters, 6 for 3x3) in a
// transformed domain of alpha^2 points (64 or 36):
//   y tile = A^T [ (G g G^T) (.) (B^T d B) ] A
// Summed over the input channels, the products at each point are one GEMM
// [tiles, in] x [in, out] on the blocked GEMM path (gemm.h), so a tile's 16
// outputs take 64 multiply-adds per channel pair instead of 400 (5x5: 6.25x
// fewer) or 36 instead of 144 (3x3: 4x fewer), plus the transforms:
// additions and small constant multiples over the channels. The points: 0,
// +-1, +-2, +-1/2 and infinity (5x5), 0, +-1, +-2 and infinity (3x3). The
// rounding: the transforms' constants (up to 8, 21/4, and 1/90) make the
// error a few times the direct method's (relative errors about 1e-6 to 1e-5
// in float, as F(2x2, 5x5)'s, measured against float64 sums over 32
// channels). F(2x2, 5x5) took 1.5-1.9x longer on LeNet's second layer
// (gemm_bench's conv_layer line), doing 1.7x the multiply-adds there
// (2.25x on whole tiles).
//
// The backward: dx is the forward of dy by the filter flipped in space with
// its channel axes swapped (as conv_direct.h's); the filter gradient, the
// adjoint of the forward, is summed at the points (per point the GEMM
// [in, tiles] x [tiles, out] of the input's transformed tiles and of dy's
// tiles transformed by A (.) A^T), then taken back to the filter by
// G^T (.) G once per batch.
//
// Thread safety: the functions keep no state; callers give each thread its
// own scratch.
#ifndef PSRT_KERNELS_CONV_WINOGRAD_H_
#define PSRT_KERNELS_CONV_WINOGRAD_H_

#include <cstdint>

#include "kernels/gemm.h"
#include "kernels/window.h"

namespace psrt {
namespace kernels {
namespace internal {

// Whether the Winograd method runs this convolution (forward and backward)
// on GEMM path `path`: a blocked path, stride 1, a 5x5 or 3x3 filter,
// enough input and output channels (16 or more) that the GEMMs at the
// points run near the path's speed, whole tiles that take at most half the
// direct method's multiply-adds (not a 3x3 filter on a 2x2 image), and an
// image whose transformed tiles take at most 16 MiB of a thread's scratch.
bool WinogradConvApplies(GemmPath path, const Conv2DShape& s);

// Floats of a filter in the transformed domain: [points, in, out] (points *
// in * out), and of the scratch memory that WinogradTransformFilter and
// WinogradFilterGradient need.
int64_t WinogradFilterFloats(const Conv2DShape& s);
int64_t WinogradFilterScratch(const Conv2DShape& s);

// points = G filter G^T at each point: [points, in, out] from the filter [fh,
// fw, in, out]; or [points, out, in] from the flipped filter (FlipFilter's
// output, [fh, fw, out, in]) that the backward's dx takes. Overwrites points.
void WinogradTransformFilter(const Conv2DShape& s, const float* filter,
                             float* scratch, float* points);

// Floats of scratch memory each thread passes to the forward and backward.
int64_t WinogradForwardScratch(const Conv2DShape& s);
int64_t WinogradBackwardScratch(const Conv2DShape& s);

// y for images [begin, end) of the batch, from the transformed filter
// (WinogradTransformFilter, not flipped). Overwrites their y.
void WinogradConvForward(GemmPath path, const Conv2DShape& s, const float* x,
                         const float* filter_points, int64_t begin, int64_t end,
                         float* scratch, float* y);

// The backward for images [begin, end): overwrites their dx, computed from
// flipped_points (WinogradTransformFilter of the flipped filter), and adds
// their filter gradient at the points into dfilter_points [points, in, out].
// Either output may be null to skip it.
void WinogradConvBackward(GemmPath path, const Conv2DShape& s, const float* x,
                          const float* flipped_points, const float* dy,
                          int64_t begin, int64_t end, float* scratch, float* dx,
                          float* dfilter_points);

// dfilter [fh, fw, in, out] = the filter gradient whose values at the
// points are dfilter_points (G^T (.) G). Overwrites dfilter.
void WinogradFilterGradient(const Conv2DShape& s, const float* dfilter_points,
                            float* scratch, float* dfilter);

}  // namespace internal
}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_CONV_WINOGRAD_H_
