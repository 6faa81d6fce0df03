// LeNet's loss and gradients against PyTorch (float64) on a fixed batch:
// tests/data/oracle_lenet.safetensors, written by scripts/gen_oracle.py.
// The parameters and images are not stored: both sides generate them with
// the same hash (SplitMix64 of (seed, index), as the script documents).
// Gradients of the two large weight tensors are stored at every
// (n / 4096)-th element. Agreement is "within 1e-4 relative", measured as
// in tests/kernels/oracle_test.cc.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "models/lenet.h"
#include "models/model.h"

namespace psrt {
namespace {

// The script's hashed(): lo + (hi - lo) * u rounded to float, u the top 24
// bits of SplitMix64(seed + (i + 1) * golden) over 2^24.
float Hashed(uint64_t seed, int64_t i, double lo, double hi) {
  uint64_t z = seed + (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const double u = static_cast<double>(z >> 40) / 16777216.0;
  const double scaled = (hi - lo) * u;
  return static_cast<float>(lo + scaled);
}

void ExpectClose(const std::vector<float>& ours, const Tensor& want,
                 const std::string& what) {
  ASSERT_EQ(static_cast<int64_t>(ours.size()), want.num_elements()) << what;
  float scale = 0;
  for (float w : want.flat()) scale = std::max(scale, std::abs(w));
  for (size_t i = 0; i < ours.size(); ++i) {
    const float w = want.data()[i];
    ASSERT_NEAR(ours[i], w, 1e-4 * (std::abs(w) + 0.01 * scale))
        << what << " element " << i;
  }
}

TEST(LenetOracleTest, LossAndGradientsMatchPyTorch) {
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(
      std::string(PSRT_SOURCE_DIR) + "/tests/data/oracle_lenet.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  std::map<std::string, const Tensor*> fixture;
  for (const auto& [name, tensor] : file->tensors) fixture[name] = &tensor;
  const int64_t samples = std::stoll(file->metadata.at("samples"));

  ModelOptions options;
  options.intra_op_threads = 2;
  absl::StatusOr<std::unique_ptr<Model>> lenet = NewLenet(options);
  ASSERT_TRUE(lenet.ok()) << lenet.status();
  // Scales of the hashed values, in variable order (the script's
  // LENET_VARIABLES).
  const double scales[] = {0.3, 0.1, 0.05, 0.1, 0.03, 0.1, 0.1, 0.1};
  std::vector<Tensor> params;
  (*lenet)->Initialize(1, &params);
  ASSERT_EQ(params.size(), 8u);
  for (size_t v = 0; v < params.size(); ++v) {
    for (int64_t i = 0; i < params[v].num_elements(); ++i) {
      params[v].data()[i] = Hashed(1000 + v, i, -scales[v], scales[v]);
    }
  }
  const Tensor& images = *fixture.at("images");
  ASSERT_EQ(images.shape(), (Shape{3, 784}));
  for (int64_t i = 0; i < images.num_elements(); ++i) {
    ASSERT_EQ(images.data()[i], Hashed(999, i, 0.0, 1.0)) << i;
  }
  std::vector<int32_t> labels;
  for (float l : fixture.at("labels")->flat()) labels.push_back(int32_t(l));

  std::vector<Tensor> grads;
  const float loss = (*lenet)->ComputeGradients(params, images, labels, &grads);
  ExpectClose({loss}, *fixture.at("loss"), "loss");
  for (size_t v = 0; v < grads.size(); ++v) {
    const std::string& name = (*lenet)->variables()[v].name;
    const int64_t n = grads[v].num_elements();
    std::vector<float> ours;
    if (n > samples) {
      for (int64_t j = 0; j < samples; ++j) {
        ours.push_back(grads[v].data()[j * (n / samples)]);
      }
    } else {
      ours.assign(grads[v].flat().begin(), grads[v].flat().end());
    }
    ExpectClose(ours, *fixture.at("grad/" + name), name);
  }
}

}  // namespace
}  // namespace psrt
