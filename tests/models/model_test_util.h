// Helpers shared by the model tests: random batches, a gradient check of a
// whole model on sampled coordinates, and what the PyTorch oracle tests
// (lenet_oracle_test.cc, ctr_oracle_test.cc) share with
// scripts/gen_oracle.py.
#ifndef PSRT_TESTS_MODELS_MODEL_TEST_UTIL_H_
#define PSRT_TESTS_MODELS_MODEL_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/model.h"

namespace psrt {
namespace testing {

// A file of tests/data/keras/ (scripts/gen_keras_fixtures.py's), and a
// file's whole text ("" when it cannot be read: the test then fails on it).
inline std::string KerasFixture(const std::string& name) {
  return std::string(PSRT_SOURCE_DIR) + "/tests/data/keras/" + name;
}
inline std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

inline Tensor RandomImages(int64_t batch, int64_t size, uint64_t seed) {
  Tensor images({batch, size});
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(0.0f, 1.0f);
  for (float& x : images.flat()) x = dist(rng);
  return images;
}

inline std::vector<float> ToVector(const Tensor& t) {
  return std::vector<float>(t.flat().begin(), t.flat().end());
}

// Checks `samples` coordinates of every variable (all of them when the
// variable is smaller) against central differences of the model's loss.
// A step can carry some ReLU input or max-pool choice across its kink,
// where the difference quotient is not the derivative; a coordinate that
// misses is therefore retried with a step 4 times smaller, and then with
// the one-sided differences of that step on either side (a kink still
// inside it lies on one side).
// Moving statistics (their "gradients" are their new values) are not checked.
// Biases and batch-norm offsets are made non-zero first, so that their
// gradients are tested away from the initial point.
inline void CheckSampledGradients(Model* model, const Tensor& images,
                                  const std::vector<int32_t>& labels,
                                  uint64_t seed, int samples,
                                  float step = 1e-3f) {
  std::vector<Tensor> params;
  model->Initialize(seed, &params);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-0.2f, 0.2f);
  for (size_t v = 0; v < params.size(); ++v) {
    if (params[v].rank() == 1 && !IsMovingStatistic(model->variables()[v].name)) {
      for (float& b : params[v].flat()) b += dist(rng);
    }
  }
  std::vector<Tensor> grads, scratch;
  const double loss = model->ComputeGradients(params, images, labels, &grads);
  ASSERT_EQ(grads.size(), params.size());
  int checked = 0;
  for (size_t v = 0; v < params.size(); ++v) {
    ASSERT_EQ(grads[v].shape(), params[v].shape());
    if (IsMovingStatistic(model->variables()[v].name)) continue;  // Not a gradient.
    const int64_t n = params[v].num_elements();
    std::uniform_int_distribution<int64_t> pick(0, n - 1);
    const int count = n <= samples ? static_cast<int>(n) : samples;
    for (int s = 0; s < count; ++s) {
      const int64_t j = n <= samples ? s : pick(rng);
      float& x = params[v].data()[j];
      const float saved = x;
      auto numeric_at = [&](float h) {
        x = saved + h;
        const double plus =
            model->ComputeGradients(params, images, labels, &scratch);
        x = saved - h;
        const double minus =
            model->ComputeGradients(params, images, labels, &scratch);
        x = saved;
        return (plus - minus) / (2 * h);
      };
      const double analytic = grads[v].data()[j];
      auto close = [&](double numeric) {
        return std::abs(analytic - numeric) <= 1e-3 + 2e-2 * std::abs(numeric);
      };
      double numeric = numeric_at(step);
      if (!close(numeric)) numeric = numeric_at(step / 4);
      // A kink closer than step / 4 lies on one side of the point only: the
      // difference on the other side is the derivative.
      for (float side : {1.0f, -1.0f}) {
        if (close(numeric)) break;
        x = saved + side * step / 4;
        numeric = (model->ComputeGradients(params, images, labels, &scratch) -
                   loss) / (side * step / 4);
        x = saved;
      }
      EXPECT_NEAR(analytic, numeric, 1e-3 + 2e-2 * std::abs(numeric))
          << model->variables()[v].name << " element " << j;
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

// The script's hashed(): lo + (hi - lo) * u rounded to float, u the top 24
// bits of SplitMix64(seed + (i + 1) * golden) over 2^24.
inline float OracleHashed(uint64_t seed, int64_t i, double lo, double hi) {
  uint64_t z = seed + (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const double u = static_cast<double>(z >> 40) / 16777216.0;
  const double scaled = (hi - lo) * u;
  return static_cast<float>(lo + scaled);
}

// Agreement with a fixture's tensor within 1e-4 relative, each element's
// tolerance floored at `floor` (1e-6 unless given) of the tensor's largest
// magnitude (as tests/kernels/oracle_test.cc measures it).
inline void ExpectCloseToOracle(const std::vector<float>& ours, const Tensor& want,
                                const std::string& what, double floor = 1e-6) {
  ASSERT_EQ(static_cast<int64_t>(ours.size()), want.num_elements()) << what;
  float scale = 0;
  for (float w : want.flat()) scale = std::max(scale, std::abs(w));
  for (size_t i = 0; i < ours.size(); ++i) {
    const float w = want.data()[i];
    ASSERT_NEAR(ours[i], w, 1e-4 * std::abs(w) + floor * scale)
        << what << " element " << i;
  }
}

}  // namespace testing
}  // namespace psrt

#endif  // PSRT_TESTS_MODELS_MODEL_TEST_UTIL_H_
