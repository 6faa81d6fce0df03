// 2-D convolution (TensorFlow's conv2d): NHWC images, HWIO filters, strides
// and SAME/VALID padding as window.h defines them, with an optional bias
// per output channel (as conv2d then bias_add): each thread adds it to a
// block of its images' output just made, and sums its gradient from a block
// of dy just before the method reads the block, so that the output (and dy)
// cross between the core and memory once, not again for a BiasAdd pass.
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

// Forward: y = conv2d(x, filter) + bias (bias [out_channels], or null for
// none). Overwrites y. Uses `workspace`.
// REQUIRES: y overlaps none of x, filter and bias; all sizes positive.
void Conv2DForward(const CpuContext& ctx, const Conv2DShape& shape,
                   const float* x, const float* filter, const float* bias,
                   float* y, Workspace* workspace);

// Backward of Conv2DForward: given dy = dL/dy, computes dx = dL/dx,
// dfilter = dL/dfilter and dbias = dL/dbias (the sums of dy over its
// pixels). Overwrites them; any may be null to skip it (a first layer needs
// no dx, a convolution without bias no dbias). Uses `workspace`.
// REQUIRES: the outputs overlap none of the inputs.
void Conv2DBackward(const CpuContext& ctx, const Conv2DShape& shape,
                    const float* x, const float* filter, const float* dy,
                    float* dx, float* dfilter, float* dbias,
                    Workspace* workspace);

namespace internal {

// Conv2DForward and Conv2DBackward with the GEMMs of a chosen path (those
// above use BestGemmPath()): the direct method of conv_direct.h on the
// blocked paths (but for the backward of strided convolutions), im2col and
// one GEMM per chunk of images otherwise. For tests, which run both.
// REQUIRES: GemmPathSupported(path); as above.
void Conv2DForwardOnPath(GemmPath path, const CpuContext& ctx,
                         const Conv2DShape& shape, const float* x,
                         const float* filter, const float* bias, float* y,
                         Workspace* workspace);
void Conv2DBackwardOnPath(GemmPath path, const CpuContext& ctx,
                          const Conv2DShape& shape, const float* x,
                          const float* filter, const float* dy, float* dx,
                          float* dfilter, float* dbias, Workspace* workspace);

}  // namespace internal
}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_CONV_H_
