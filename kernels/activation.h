// Element-wise activations as Keras computes them (its Activation and ReLU
// layers): ReLU with a cap, a slope below a threshold (ReLU6, leaky),
// sigmoid, tanh, swish (SiLU), hard sigmoid, hard swish and GELU. Same
// conventions as ops.h: raw floats, an explicit CpuContext, caller-owned
// outputs; the math is written once (activation_functors.h) for the CPU
// and the CUDA versions (layers_cuda.h).
#ifndef PSRT_KERNELS_ACTIVATION_H_
#define PSRT_KERNELS_ACTIVATION_H_

#include <cstdint>
#include <limits>

#include "kernels/cpu_context.h"

namespace psrt {
namespace kernels {

enum class Activation : int32_t {
  // max_value if x >= max_value; x if threshold <= x < max_value;
  // negative_slope * (x - threshold) below (Keras's relu and ReLU layer).
  kRelu,
  kSigmoid,    // 1 / (1 + e^-x)
  kTanh,
  kSwish,      // x * sigmoid(x) (Keras's swish and silu)
  // clip(hard_slope * x + 1/2, 0, 1): Keras 3's relu6(x + 3) / 6
  // (hard_slope 1/6); Keras 2's 0.2 x + 0.5 (hard_slope 0.2).
  kHardSigmoid,
  kHardSwish,  // x * hard_sigmoid(x) (Keras's hard_swish and hard_silu)
  kGelu,       // x / 2 (1 + erf(x / sqrt(2))) (Keras's gelu, not approximate)
};

struct ActivationSpec {
  Activation kind = Activation::kRelu;
  float max_value = std::numeric_limits<float>::infinity();  // kRelu.
  float negative_slope = 0.0f;                               // kRelu.
  float threshold = 0.0f;                                    // kRelu.
  float hard_slope = 1.0f / 6;  // kHardSigmoid and kHardSwish.
};

// y = f(x). y may equal x.
void ActivationForward(const CpuContext& ctx, const ActivationSpec& spec, const float* x,
                       int64_t n, float* y);
// dx = dy * f'(x), from the forward's input x; at a kink, the slope that
// TensorFlow's gradient takes there (a ReLU's at its threshold: the piece
// below's; at its cap and at a hard sigmoid's corners: 0). dx may equal dy.
void ActivationBackward(const CpuContext& ctx, const ActivationSpec& spec, const float* x,
                        const float* dy, int64_t n, float* dx);

}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_ACTIVATION_H_
