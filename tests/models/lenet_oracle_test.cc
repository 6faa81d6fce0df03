// LeNet's loss and gradients against PyTorch (float64) on a fixed batch:
// tests/data/oracle_lenet.safetensors, written by scripts/gen_oracle.py.
// The parameters and images are not stored: both sides generate them with
// the same hash (SplitMix64 of (seed, index), as the script documents).
// Gradients of the two large weight tensors are stored at every
// (n / 4096)-th element. Agreement is "within 1e-4 relative", measured as
// in tests/kernels/oracle_test.cc, with each element's tolerance floored at
// 1e-5 of its tensor's largest magnitude: conv2 runs by Winograd's method on
// the AVX2 and AVX-512 paths, whose rounding (kernels/conv_winograd.h) puts
// errors of a few 1e-6 of that magnitude on conv1's gradients.
#include <map>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "models/lenet.h"
#include "models/model.h"
#include "tests/models/model_test_util.h"

namespace psrt {
namespace {

using testing::ExpectCloseToOracle;
using testing::OracleHashed;

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
      params[v].data()[i] = OracleHashed(1000 + v, i, -scales[v], scales[v]);
    }
  }
  const Tensor& images = *fixture.at("images");
  ASSERT_EQ(images.shape(), (Shape{3, 784}));
  for (int64_t i = 0; i < images.num_elements(); ++i) {
    ASSERT_EQ(images.data()[i], OracleHashed(999, i, 0.0, 1.0)) << i;
  }
  std::vector<int32_t> labels;
  for (float l : fixture.at("labels")->flat()) labels.push_back(int32_t(l));

  std::vector<Tensor> grads;
  const float loss = (*lenet)->ComputeGradients(params, images, labels, &grads);
  constexpr double kFloor = 1e-5;
  ExpectCloseToOracle({loss}, *fixture.at("loss"), "loss", kFloor);
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
    ExpectCloseToOracle(ours, *fixture.at("grad/" + name), name, kFloor);
  }
}

}  // namespace
}  // namespace psrt
