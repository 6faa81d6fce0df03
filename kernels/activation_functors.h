// The math of the activations (activation.h), written once for the CPU and
// the GPU like functors.h: Value and Slope of each kind, and the functors
// that run them over an array. The kind is a template parameter, so that
// each loop (a CPU loop, a CUDA kernel) has no branch on it and vectorizes.
#ifndef PSRT_KERNELS_ACTIVATION_FUNCTORS_H_
#define PSRT_KERNELS_ACTIVATION_FUNCTORS_H_

#include <cmath>
#include <cstdint>

#include "kernels/activation.h"
#include "kernels/functors.h"

namespace psrt {
namespace kernels {
namespace functor {

PSRT_HOST_DEVICE inline float TanhF(float v) {
#if defined(__CUDA_ARCH__)
  return tanhf(v);
#else
  return std::tanh(v);
#endif
}
PSRT_HOST_DEVICE inline float ErfF(float v) {
#if defined(__CUDA_ARCH__)
  return erff(v);
#else
  return std::erf(v);
#endif
}
PSRT_HOST_DEVICE inline float SigmoidF(float v) { return 1.0f / (1.0f + ExpF(-v)); }
PSRT_HOST_DEVICE inline float ClipF(float v, float lo, float hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

// f(x) and f'(x) of activation K (activation.h, with its kinks).
template <Activation K>
struct ActivationMath;

template <>
struct ActivationMath<Activation::kRelu> {
  // Selects of values computed unconditionally, not branches, which the
  // CPU build (-fno-trapping-math, kernels/CMakeLists.txt) turns into vector
  // blends and the GPU into predicated moves.
  PSRT_HOST_DEVICE static float Value(const ActivationSpec& a, float x) {
    const float below = a.negative_slope * (x - a.threshold);
    const float v = x >= a.threshold ? x : below;
    return x >= a.max_value ? a.max_value : v;
  }
  PSRT_HOST_DEVICE static float Slope(const ActivationSpec& a, float x) {
    const float inside = x < a.max_value ? 1.0f : 0.0f;
    return x <= a.threshold ? a.negative_slope : inside;
  }
};

template <>
struct ActivationMath<Activation::kSigmoid> {
  PSRT_HOST_DEVICE static float Value(const ActivationSpec&, float x) { return SigmoidF(x); }
  PSRT_HOST_DEVICE static float Slope(const ActivationSpec&, float x) {
    const float s = SigmoidF(x);
    return s * (1.0f - s);
  }
};

template <>
struct ActivationMath<Activation::kTanh> {
  PSRT_HOST_DEVICE static float Value(const ActivationSpec&, float x) { return TanhF(x); }
  PSRT_HOST_DEVICE static float Slope(const ActivationSpec&, float x) {
    const float t = TanhF(x);
    return 1.0f - t * t;
  }
};

template <>
struct ActivationMath<Activation::kSwish> {
  PSRT_HOST_DEVICE static float Value(const ActivationSpec&, float x) { return x * SigmoidF(x); }
  PSRT_HOST_DEVICE static float Slope(const ActivationSpec&, float x) {
    const float s = SigmoidF(x);
    return s + x * s * (1.0f - s);
  }
};

template <>
struct ActivationMath<Activation::kHardSigmoid> {
  PSRT_HOST_DEVICE static float Value(const ActivationSpec& a, float x) {
    return ClipF(a.hard_slope * x + 0.5f, 0.0f, 1.0f);
  }
  PSRT_HOST_DEVICE static float Slope(const ActivationSpec& a, float x) {
    const float z = a.hard_slope * x + 0.5f;
    return z > 0.0f && z < 1.0f ? a.hard_slope : 0.0f;
  }
};

template <>
struct ActivationMath<Activation::kHardSwish> {
  using Hard = ActivationMath<Activation::kHardSigmoid>;
  PSRT_HOST_DEVICE static float Value(const ActivationSpec& a, float x) {
    return x * Hard::Value(a, x);
  }
  PSRT_HOST_DEVICE static float Slope(const ActivationSpec& a, float x) {
    return Hard::Value(a, x) + x * Hard::Slope(a, x);
  }
};

template <>
struct ActivationMath<Activation::kGelu> {
  PSRT_HOST_DEVICE static float Value(const ActivationSpec&, float x) {
    return 0.5f * x * (1.0f + ErfF(x * 0.70710678118654752f));
  }
  PSRT_HOST_DEVICE static float Slope(const ActivationSpec&, float x) {
    // Phi(x) + x phi(x), phi the standard normal density.
    return 0.5f * (1.0f + ErfF(x * 0.70710678118654752f)) +
           x * 0.39894228040143268f * ExpF(-0.5f * x * x);
  }
};

// y[i] = f(x[i]). y may alias x.
template <Activation K>
struct ActivationFn {
  ActivationSpec a;
  const float* x;
  float* y;
  PSRT_HOST_DEVICE void operator()(int64_t i) const { y[i] = ActivationMath<K>::Value(a, x[i]); }
};

// dx[i] = dy[i] * f'(x[i]). dx may alias dy.
template <Activation K>
struct ActivationGrad {
  ActivationSpec a;
  const float* x;
  const float* dy;
  float* dx;
  PSRT_HOST_DEVICE void operator()(int64_t i) const {
    dx[i] = dy[i] * ActivationMath<K>::Slope(a, x[i]);
  }
};

// Calls run(F{spec, args...}) with F the functor template `Fn` of
// spec.kind: the one switch on the kind, outside every loop.
template <template <Activation> class Fn, class Run, class... Args>
void DispatchActivation(const ActivationSpec& spec, const Run& run, Args... args) {
  switch (spec.kind) {
    case Activation::kRelu: return run(Fn<Activation::kRelu>{spec, args...});
    case Activation::kSigmoid: return run(Fn<Activation::kSigmoid>{spec, args...});
    case Activation::kTanh: return run(Fn<Activation::kTanh>{spec, args...});
    case Activation::kSwish: return run(Fn<Activation::kSwish>{spec, args...});
    case Activation::kHardSigmoid: return run(Fn<Activation::kHardSigmoid>{spec, args...});
    case Activation::kHardSwish: return run(Fn<Activation::kHardSwish>{spec, args...});
    case Activation::kGelu: return run(Fn<Activation::kGelu>{spec, args...});
  }
}

}  // namespace functor
}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_ACTIVATION_FUNCTORS_H_
