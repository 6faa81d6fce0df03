// Helpers shared by the model tests: random batches and a gradient check
// of a whole model on sampled coordinates.
#ifndef PSRT_TESTS_MODELS_MODEL_TEST_UTIL_H_
#define PSRT_TESTS_MODELS_MODEL_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "models/model.h"

namespace psrt {
namespace testing {

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
// misses is therefore retried with a step 4 times smaller, which such a
// kink rarely survives.
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
    if (params[v].rank() == 1) {
      for (float& b : params[v].flat()) b += dist(rng);
    }
  }
  std::vector<Tensor> grads, scratch;
  model->ComputeGradients(params, images, labels, &grads);
  ASSERT_EQ(grads.size(), params.size());
  int checked = 0;
  for (size_t v = 0; v < params.size(); ++v) {
    ASSERT_EQ(grads[v].shape(), params[v].shape());
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
      EXPECT_NEAR(analytic, numeric, 1e-3 + 2e-2 * std::abs(numeric))
          << model->variables()[v].name << " element " << j;
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

}  // namespace testing
}  // namespace psrt

#endif  // PSRT_TESTS_MODELS_MODEL_TEST_UTIL_H_
