// The optimizer update rules beyond plain SGD and momentum (functors.h),
// written once as functors for the parameter server's CPU loop and for a
// CUDA grid-stride kernel. Each follows TensorFlow's (1.x) kernel of the same
// name in tensorflow/core/kernels/training_ops.cc; the formulas are in the
// comments. All slots have the variable's layout.
#ifndef PSRT_KERNELS_OPTIMIZER_FUNCTORS_H_
#define PSRT_KERNELS_OPTIMIZER_FUNCTORS_H_

#include <cstdint>

#include "kernels/functors.h"  // MomentumUpdateT, SqrtF

namespace psrt {
namespace kernels {
namespace functor {

// ApplyMomentum with use_nesterov (MomentumUpdateT, functors.h):
//   accum = momentum * accum + grad
//   var  -= lr * (grad + momentum * accum)
using NesterovMomentumUpdate = MomentumUpdateT<true>;

// ApplyAdagrad: accum += grad^2; var -= lr * grad / sqrt(accum).
struct AdagradUpdate {
  float lr;
  const float* grad;
  float* accum;
  float* var;
  PSRT_HOST_DEVICE void operator()(int64_t i) const {
    const float g = grad[i];
    const float a = accum[i] + g * g;
    accum[i] = a;
    var[i] -= lr * g / SqrtF(a);
  }
};

// ApplyRMSProp: ms = rho * ms + (1 - rho) * grad^2;
//   mom = momentum * mom + lr * grad / sqrt(ms + epsilon); var -= mom.
struct RmsPropUpdate {
  float lr;
  float rho;
  float momentum;
  float epsilon;
  const float* grad;
  float* ms;
  float* mom;
  float* var;
  PSRT_HOST_DEVICE void operator()(int64_t i) const {
    const float g = grad[i];
    const float m = rho * ms[i] + (1.0f - rho) * g * g;
    ms[i] = m;
    const float step = momentum * mom[i] + lr * g / SqrtF(m + epsilon);
    mom[i] = step;
    var[i] -= step;
  }
};

// ApplyAdam with lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t) computed by
// the caller for update number t (1-based):
//   m = beta1 * m + (1 - beta1) * grad; v = beta2 * v + (1 - beta2) * grad^2
//   var -= lr_t * m / (sqrt(v) + epsilon)
struct AdamUpdate {
  float lr_t;
  float beta1;
  float beta2;
  float epsilon;
  const float* grad;
  float* m;
  float* v;
  float* var;
  PSRT_HOST_DEVICE void operator()(int64_t i) const {
    const float g = grad[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    var[i] -= lr_t * mi / (SqrtF(vi) + epsilon);
  }
};

// ApplyFtrl (FTRL-proximal, McMahan et al. 2013) with learning_rate_power
// -0.5, TensorFlow's default:
//   accum_new = accum + grad^2
//   linear += grad - (sqrt(accum_new) - sqrt(accum)) / lr * var
//   quadratic = sqrt(accum_new) / lr + 2 * l2
//   var = |linear| > l1 ? (sign(linear) * l1 - linear) / quadratic : 0
//   accum = accum_new
struct FtrlUpdate {
  float lr;
  float l1;
  float l2;
  const float* grad;
  float* accum;
  float* linear;
  float* var;
  PSRT_HOST_DEVICE void operator()(int64_t i) const {
    const float g = grad[i];
    const float a = accum[i];
    const float a_new = a + g * g;
    const float root_new = SqrtF(a_new);
    const float l = linear[i] + g - (root_new - SqrtF(a)) / lr * var[i];
    linear[i] = l;
    const float quadratic = root_new / lr + 2.0f * l2;
    var[i] = l > l1 ? (l1 - l) / quadratic : (l < -l1 ? (-l1 - l) / quadratic : 0.0f);
    accum[i] = a_new;
  }
};

// ExponentialMovingAverage: average -= (1 - decay) * (average - value).
struct MovingAverageUpdate {
  float decay;
  const float* value;
  float* average;
  PSRT_HOST_DEVICE void operator()(int64_t i) const {
    average[i] -= (1.0f - decay) * (average[i] - value[i]);
  }
};

}  // namespace functor
}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_OPTIMIZER_FUNCTORS_H_
