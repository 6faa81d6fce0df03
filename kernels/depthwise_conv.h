// Depthwise convolution (Keras's DepthwiseConv2D; the first half of a
// SeparableConv2D), forward and backward over NHWC floats. Same conventions
// as conv.h: an explicit CpuContext, caller-owned outputs; the math is
// written once (depthwise_functors.h) for these and the CUDA versions
// (layers_cuda.h).
#ifndef PSRT_KERNELS_DEPTHWISE_CONV_H_
#define PSRT_KERNELS_DEPTHWISE_CONV_H_

#include "kernels/cpu_context.h"
#include "kernels/window.h"
#include "kernels/workspace.h"

namespace psrt {
namespace kernels {

// y [shape.output_size()] = x [input_size()] convolved channel by channel
// with filter [filter_size()] (DepthwiseConv2DShape). Overwrites y.
// REQUIRES: a shape of positive sizes with out_height(), out_width() > 0.
// (`workspace` is the device ops' one signature: unused.)
void DepthwiseConv2DForward(const CpuContext& ctx, const DepthwiseConv2DShape& shape,
                            const float* x, const float* filter, float* y,
                            Workspace* workspace = nullptr);
// From x, the filter and dy: overwrites dx (skipped when null) and dfilter.
// The filter's gradient is summed in a fixed order of partial sums, kept in
// `workspace` (slot 0): the same bits whatever the threads.
void DepthwiseConv2DBackward(const CpuContext& ctx, const DepthwiseConv2DShape& shape,
                             const float* x, const float* filter, const float* dy, float* dx,
                             float* dfilter, Workspace* workspace);

}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_DEPTHWISE_CONV_H_
