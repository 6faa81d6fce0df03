// The small layer ops: channel concatenation (Inception's module output),
// zero padding, per-channel affine maps, products, dropout and
// TensorFlow's l2_loss. Same conventions as ops.h: raw
// row-major floats, an explicit CpuContext, caller-owned outputs, and the
// math in functors shared with the CUDA versions (layers_cuda.h).
#ifndef PSRT_KERNELS_LAYER_OPS_H_
#define PSRT_KERNELS_LAYER_OPS_H_

#include <cstdint>

#include "absl/types/span.h"
#include "kernels/cpu_context.h"
#include "kernels/window.h"

namespace psrt {
namespace kernels {

// Forward: y[p, :] = [inputs[0][p, :], inputs[1][p, :], ...] for every
// pixel p < pixels, where inputs[i] is [pixels, channels[i]] and y is
// [pixels, sum(channels)]: concatenation along C of NHWC tensors. Overwrites y.
// REQUIRES: inputs.size() == channels.size() >= 1; y overlaps no input.
void ConcatChannelsForward(const CpuContext& ctx, int64_t pixels,
                           absl::Span<const float* const> inputs,
                           absl::Span<const int64_t> channels, float* y);

// Backward: splits dy [pixels, sum(channels)] into dinputs[i] [pixels,
// channels[i]]. Overwrites each dinputs[i]; a null one is skipped.
void ConcatChannelsBackward(const CpuContext& ctx, int64_t pixels,
                            const float* dy, absl::Span<const int64_t> channels,
                            absl::Span<float* const> dinputs);

// Training-mode (inverted) dropout: y[i] = x[i] / keep_prob where element i
// is kept, else 0. The mask is a pure function of (seed, the draw of i)
// (see functor::DropoutKeep), so a step passes a fresh seed and the
// backward recomputes the mask from it. Inference is the identity: do not
// call. Overwrites y; y may equal x.
// REQUIRES: 0 < keep_prob <= 1.
void DropoutForward(const CpuContext& ctx, const float* x, int64_t n,
                    float keep_prob, uint64_t seed, float* y,
                    const DropoutNoise& noise = {});

// dx = dy masked and scaled like the forward with the same seed.
// Overwrites dx; dx may equal dy.
void DropoutBackward(const CpuContext& ctx, const float* dy, int64_t n,
                     float keep_prob, uint64_t seed, float* dx,
                     const DropoutNoise& noise = {});

// Zero padding (Keras's ZeroPadding2D): y [shape.output_size()] is x
// [shape.input_size()] with shape's border of zeros. Overwrites y.
// REQUIRES: the sizes and paddings are non-negative; y overlaps no input.
void ZeroPad2DForward(const CpuContext& ctx, const Pad2DShape& shape, const float* x, float* y);
// dx = dy without the border. Overwrites dx.
void ZeroPad2DBackward(const CpuContext& ctx, const Pad2DShape& shape, const float* dy,
                       float* dx);

// y[p, c] = x[p, c] * scale[c] + offset[c] over [pixels, channels]
// (Keras's Rescaling and Normalization; its gradient is dx = dy * scale,
// the same op with offset 0). Overwrites y; y may equal x.
void ChannelAffineForward(const CpuContext& ctx, const float* x, const float* scale,
                          const float* offset, int64_t pixels, int64_t channels, float* y);

// The element-wise product of a [batch * pixels, channels] and b, either
// alike or [batch, channels] broadcast over each image's pixels
// (`broadcast`: Keras's Multiply in squeeze-and-excitation; MultiplyShape).
// Overwrites y; y may equal a.
void MultiplyForward(const CpuContext& ctx, const MultiplyShape& shape, const float* a,
                     const float* b, float* y);
// da = dy * b and db = dy * a (summed over each image's pixels when b is
// broadcast). Overwrites da and db; a null one is skipped.
void MultiplyBackward(const CpuContext& ctx, const MultiplyShape& shape, const float* a,
                      const float* b, const float* dy, float* da, float* db);

// Returns sum(x^2) / 2 (tf.nn.l2_loss), accumulated in double.
float L2LossForward(const CpuContext& ctx, const float* x, int64_t n);

// dx = dloss * x, the gradient of dloss * L2LossForward(x). Overwrites dx;
// dx may equal x.
void L2LossBackward(const CpuContext& ctx, const float* x, int64_t n,
                    float dloss, float* dx);

}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_LAYER_OPS_H_
