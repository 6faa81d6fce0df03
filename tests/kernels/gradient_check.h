// Test helpers shared by the kernel tests: random inputs, NaN-filled output
// buffers, and the gradient checker (after Caffe's: one checker for every
// op, comparing each claimed derivative with a central difference).
//
// The tests live in psrt::kernels::testing (in an unnamed namespace inside
// it), where these helpers and the gMock matchers they use are in scope.
#ifndef PSRT_TESTS_KERNELS_GRADIENT_CHECK_H_
#define PSRT_TESTS_KERNELS_GRADIENT_CHECK_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace psrt {
namespace kernels {
namespace testing {

// The gMock matchers every kernel test uses.
using ::testing::ElementsAre;
using ::testing::FloatNear;
using ::testing::Pointwise;

inline std::vector<float> RandomVector(int64_t n, uint64_t seed,
                                       float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// An output buffer full of NaN: an op that claims to overwrite must not
// read it.
inline std::vector<float> Garbage(int64_t n) {
  return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
}

inline double Dot(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += double(a[i]) * b[i];
  return sum;
}

// The gradient checker. `loss` evaluates a scalar function of the `inputs`
// (usually sum(op output * fixed random weights), so that the analytic
// gradient is the op's backward with those weights as the upstream
// gradient); `analytic[i]` is the claimed dL/d(inputs[i]). Every element is
// checked against the central difference (L(x + h) - L(x - h)) / 2h, within
// tolerance * max(1, |numeric|).
inline void ExpectGradientsMatch(
    const std::vector<std::vector<float>*>& inputs,
    const std::function<double()>& loss,
    const std::vector<std::vector<float>>& analytic, float step = 1e-2f,
    float tolerance = 2e-3f) {
  ASSERT_EQ(inputs.size(), analytic.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<float>& x = *inputs[i];
    ASSERT_EQ(x.size(), analytic[i].size()) << "input " << i;
    for (size_t j = 0; j < x.size(); ++j) {
      const float saved = x[j];
      x[j] = saved + step;
      const double plus = loss();
      x[j] = saved - step;
      const double minus = loss();
      x[j] = saved;
      const double numeric = (plus - minus) / (2.0 * step);
      const double scale = std::max(1.0, std::abs(numeric));
      EXPECT_NEAR(analytic[i][j], numeric, tolerance * scale)
          << "input " << i << ", element " << j;
    }
  }
}

}  // namespace testing
}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_TESTS_KERNELS_GRADIENT_CHECK_H_
