// Helpers of the GPU tests (GPU against CPU):
// - PSRT_SKIP_WITHOUT_GPU, the one way a GPU test leaves a machine without a
//   GPU: it skips, or, with PSRT_REQUIRE_GPU=1 in the environment
//   (scripts/gpu_first_run.sh sets it on a GPU machine), it fails, saying
//   why no GPU was seen, so that a run that tested nothing on the GPU cannot
//   pass as green.
// - NearInNorm, the comparison of a GPU result with the CPU's: the relative
//   error of the whole array in the 2-norm. The two sum in other orders (and
//   the GPU with atomics), so single elements that are sums of thousands of
//   terms with cancellation differ by more than any element-wise bound that
//   a bug would exceed; the norm of the difference does not.
#ifndef PSRT_TESTS_GPU_TEST_UTIL_H_
#define PSRT_TESTS_GPU_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace psrt {
namespace testing {

inline bool GpuRequired() {
  const char* required = std::getenv("PSRT_REQUIRE_GPU");
  return required != nullptr && std::strcmp(required, "1") == 0;
}

// ||actual - expected||_2 / ||expected||_2 (0 when both are 0).
inline double RelativeErrorInNorm(const float* actual, const float* expected, size_t n) {
  double diff2 = 0, ref2 = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(actual[i]) - expected[i];
    diff2 += d * d;
    ref2 += static_cast<double>(expected[i]) * expected[i];
  }
  return diff2 == 0 ? 0 : std::sqrt(diff2) / std::max(std::sqrt(ref2), 1e-30);
}

// Success when ||actual - expected||_2 <= relative * ||expected||_2 (and
// every value is finite); else a message with the relative error and the
// worst element.
inline ::testing::AssertionResult NearInNorm(const float* actual, const float* expected, size_t n,
                                             double relative) {
  double worst = -1;
  size_t worst_at = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(actual[i])) {
      return ::testing::AssertionFailure()
             << "element " << i << " is " << actual[i] << " (expected " << expected[i] << ")";
    }
    const double d = std::abs(static_cast<double>(actual[i]) - expected[i]);
    if (d > worst) {
      worst = d;
      worst_at = i;
    }
  }
  const double error = RelativeErrorInNorm(actual, expected, n);
  if (error <= relative) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "relative error " << error << " > " << relative << " over " << n
         << " elements; worst at " << worst_at << ": " << actual[worst_at] << " against "
         << expected[worst_at];
}

inline ::testing::AssertionResult NearInNorm(const std::vector<float>& actual,
                                             const std::vector<float>& expected, double relative) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure() << actual.size() << " elements, want " << expected.size();
  }
  return NearInNorm(actual.data(), expected.data(), actual.size(), relative);
}

}  // namespace testing
}  // namespace psrt

// In a test body or SetUp: when `visible_gpus` is 0, skips the test, or
// fails it under PSRT_REQUIRE_GPU=1 with `why` (anything that streams into
// a gtest message) after "no GPU visible: ".
#define PSRT_SKIP_WITHOUT_GPU(visible_gpus, why)                           \
  do {                                                                     \
    if ((visible_gpus) == 0) {                                             \
      if (::psrt::testing::GpuRequired()) {                                \
        GTEST_FAIL() << "PSRT_REQUIRE_GPU=1, but no GPU visible: " << why; \
      }                                                                    \
      GTEST_SKIP() << "no GPU visible: " << why;                           \
    }                                                                      \
  } while (0)

#endif  // PSRT_TESTS_GPU_TEST_UTIL_H_
