// The activations on the CPU (activation.h): their values where Keras's
// definitions give them in closed form, their slopes at the kinks as
// TensorFlow's gradients take them, and every kind's gradient against
// finite differences (away from its kinks).
#include "kernels/activation.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_context.h"
#include "tests/kernels/gradient_check.h"

namespace psrt {
namespace kernels {
namespace testing {
namespace {

std::vector<float> Forward(const ActivationSpec& spec, const std::vector<float>& x) {
  CpuContext ctx(1);
  std::vector<float> y = Garbage(x.size());
  ActivationForward(ctx, spec, x.data(), static_cast<int64_t>(x.size()), y.data());
  return y;
}

// The slope at each x (dy = 1).
std::vector<float> Slopes(const ActivationSpec& spec, const std::vector<float>& x) {
  CpuContext ctx(1);
  const std::vector<float> ones(x.size(), 1.0f);
  std::vector<float> dx = Garbage(x.size());
  ActivationBackward(ctx, spec, x.data(), ones.data(), static_cast<int64_t>(x.size()), dx.data());
  return dx;
}

ActivationSpec Spec(Activation kind) {
  ActivationSpec spec;
  spec.kind = kind;
  return spec;
}

TEST(ActivationTest, ReluWithCapSlopeAndThreshold) {
  ActivationSpec relu6 = Spec(Activation::kRelu);
  relu6.max_value = 6;
  const std::vector<float> x = {-2, 0, 3, 6, 7};
  EXPECT_THAT(Forward(relu6, x), ElementsAre(0, 0, 3, 6, 6));
  // TensorFlow's Relu6Grad: 1 strictly between 0 and 6.
  EXPECT_THAT(Slopes(relu6, x), ElementsAre(0, 0, 1, 0, 0));
  ActivationSpec leaky = Spec(Activation::kRelu);
  leaky.negative_slope = 0.3f;
  leaky.threshold = 1;
  EXPECT_THAT(Forward(leaky, {-1, 1, 2}), ElementsAre(FloatNear(-0.6f, 1e-6f), 1, 2));
  EXPECT_THAT(Slopes(leaky, {-1, 1, 2}), ElementsAre(FloatNear(0.3f, 1e-7f), FloatNear(0.3f, 1e-7f), 1));
}

TEST(ActivationTest, SmoothKindsInClosedForm) {
  const std::vector<float> x = {-3.5f, -1, 0, 0.5f, 2};
  std::vector<float> sigmoid, tanh, swish, gelu;
  for (float v : x) {
    const double s = 1 / (1 + std::exp(-double(v)));
    sigmoid.push_back(static_cast<float>(s));
    tanh.push_back(static_cast<float>(std::tanh(double(v))));
    swish.push_back(static_cast<float>(v * s));
    gelu.push_back(static_cast<float>(0.5 * v * (1 + std::erf(v / std::sqrt(2.0)))));
  }
  EXPECT_THAT(Forward(Spec(Activation::kSigmoid), x), Pointwise(FloatNear(1e-6f), sigmoid));
  EXPECT_THAT(Forward(Spec(Activation::kTanh), x), Pointwise(FloatNear(1e-6f), tanh));
  EXPECT_THAT(Forward(Spec(Activation::kSwish), x), Pointwise(FloatNear(1e-6f), swish));
  EXPECT_THAT(Forward(Spec(Activation::kGelu), x), Pointwise(FloatNear(1e-6f), gelu));
}

// Keras 3's hard sigmoid is relu6(x + 3) / 6 and its hard swish x times it;
// Keras 2's hard sigmoid is clip(0.2 x + 0.5, 0, 1).
TEST(ActivationTest, HardSigmoidAndSwishOfBothKerases) {
  const std::vector<float> x = {-4, -3, -1.5f, 0, 1.5f, 3, 4};
  std::vector<float> keras3, swish;
  for (float v : x) {
    const float h = std::min(std::max(v + 3, 0.0f), 6.0f) / 6;
    keras3.push_back(h);
    swish.push_back(v * h);
  }
  EXPECT_THAT(Forward(Spec(Activation::kHardSigmoid), x), Pointwise(FloatNear(1e-6f), keras3));
  EXPECT_THAT(Forward(Spec(Activation::kHardSwish), x), Pointwise(FloatNear(1e-6f), swish));
  // Slopes: 1/6 strictly inside (-3, 3); the swish's 0 below, 1 above.
  EXPECT_THAT(Slopes(Spec(Activation::kHardSigmoid), x),
              Pointwise(FloatNear(1e-6f), {0.f, 0.f, 1 / 6.f, 1 / 6.f, 1 / 6.f, 0.f, 0.f}));
  EXPECT_THAT(Slopes(Spec(Activation::kHardSwish), x),
              Pointwise(FloatNear(1e-6f), {0.f, 0.f, 0.f, 0.5f, 1.f, 1.f, 1.f}));
  ActivationSpec keras2 = Spec(Activation::kHardSigmoid);
  keras2.hard_slope = 0.2f;
  EXPECT_THAT(Forward(keras2, {-3, -1, 0, 2, 3}),
              Pointwise(FloatNear(1e-6f), {0.f, 0.3f, 0.5f, 0.9f, 1.f}));
}

TEST(ActivationTest, GradientsMatchFiniteDifferences) {
  ActivationSpec capped = Spec(Activation::kRelu);
  capped.max_value = 1.5f;
  capped.negative_slope = 0.1f;
  capped.threshold = -0.5f;
  for (const ActivationSpec& spec :
       {capped, Spec(Activation::kSigmoid), Spec(Activation::kTanh), Spec(Activation::kSwish),
        Spec(Activation::kHardSigmoid), Spec(Activation::kHardSwish), Spec(Activation::kGelu)}) {
    SCOPED_TRACE(static_cast<int>(spec.kind));
    CpuContext ctx(2);
    // Away from the kinks (the ReLU's at -0.5 and 1.5, the hard ones' at
    // -3 and 3), where a central difference straddles none.
    std::vector<float> x = RandomVector(300, 81, -4, 4);
    for (float& v : x) {
      for (float kink : {-3.0f, -0.5f, 1.5f, 3.0f}) {
        if (std::abs(v - kink) < 0.05f) v = kink + 0.1f;
      }
    }
    const std::vector<float> weights = RandomVector(x.size(), 82);
    std::vector<float> y(x.size());
    auto loss = [&] {
      ActivationForward(ctx, spec, x.data(), static_cast<int64_t>(x.size()), y.data());
      return Dot(y, weights);
    };
    std::vector<float> dx = Garbage(x.size());
    ActivationBackward(ctx, spec, x.data(), weights.data(), static_cast<int64_t>(x.size()),
                       dx.data());
    ExpectGradientsMatch({&x}, loss, {dx});
  }
}

TEST(ActivationTest, InPlace) {
  CpuContext ctx(1);
  std::vector<float> x = {-1, 0.5f, 2};
  const std::vector<float> want = Forward(Spec(Activation::kSwish), x);
  ActivationForward(ctx, Spec(Activation::kSwish), x.data(), 3, x.data());
  EXPECT_EQ(x, want);
}

}  // namespace
}  // namespace testing
}  // namespace kernels
}  // namespace psrt
