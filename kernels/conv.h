// 2-D convolution (TensorFlow's conv2d): NHWC images, HWIO filters, strides
// and SAME/VALID padding as window.h defines them. No bias: a layer adds one
// with BiasAddForward (y as a [pixels, out_channels] matrix) or follows with
// a batch norm.
//
// On the CPU each thread takes a contiguous share of the batch, by one of
// two methods, after the GEMM path (gemm.h):
//  - im2col + GEMM (the portable path): a few images at a time, it copies
//    their windows into the rows of a column matrix [pixels, fh * fw * in]
//    that fits in its core's cache, then multiplies by the filter seen as a
//    [fh * fw * in, out] matrix, writing NHWC output rows directly;
//  - direct (the AVX-512 and AVX2 paths, conv_direct.h): batch-reduce GEMMs on the
//    zero-padded input read in place, with no column matrix; dx is the
//    convolution of dy by the flipped filter (stride 1; strided backwards
//    take im2col).
// Buffers come from the caller's Workspace, so a training loop allocates
// them once. A 1x1 stride-1 convolution is one GEMM: the input already is
// the column matrix.
#ifndef PSRT_KERNELS_CONV_H_
#define PSRT_KERNELS_CONV_H_

#include "kernels/cpu_context.h"
#include "kernels/gemm.h"
#include "kernels/window.h"
#include "kernels/workspace.h"

namespace psrt {
namespace kernels {

// Forward: y = conv2d(x, filter). Overwrites y. Uses `workspace`.
// REQUIRES: y overlaps neither x nor filter; all sizes positive.
void Conv2DForward(const CpuContext& ctx, const Conv2DShape& shape,
                   const float* x, const float* filter, float* y,
                   Workspace* workspace);

// Backward of Conv2DForward: given dy = dL/dy, computes dx = dL/dx and
// dfilter = dL/dfilter. Overwrites both; either may be null to skip it (a
// first layer needs no dx). Uses `workspace`.
// REQUIRES: the outputs overlap none of the inputs.
void Conv2DBackward(const CpuContext& ctx, const Conv2DShape& shape,
                    const float* x, const float* filter, const float* dy,
                    float* dx, float* dfilter, Workspace* workspace);

namespace internal {

// Conv2DForward and Conv2DBackward with the GEMMs of a chosen path (those
// above use BestGemmPath()): the direct method of conv_direct.h on the
// blocked paths (but for the backward of strided convolutions), im2col and
// one GEMM per chunk of images otherwise. For tests, which run both.
// REQUIRES: GemmPathSupported(path); as above.
void Conv2DForwardOnPath(GemmPath path, const CpuContext& ctx,
                         const Conv2DShape& shape, const float* x,
                         const float* filter, float* y, Workspace* workspace);
void Conv2DBackwardOnPath(GemmPath path, const CpuContext& ctx,
                          const Conv2DShape& shape, const float* x,
                          const float* filter, const float* dy, float* dx,
                          float* dfilter, Workspace* workspace);

}  // namespace internal
}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_CONV_H_
