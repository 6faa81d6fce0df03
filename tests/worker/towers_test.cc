#include "worker/towers.h"

#include <random>

#include "gtest/gtest.h"

namespace psrt {
namespace {

std::vector<std::unique_ptr<Model>> MakeModels(const std::string& name, int n) {
  ModelOptions options;
  options.hidden_units = {32};
  options.intra_op_threads = 1;
  std::vector<std::unique_ptr<Model>> models;
  for (int i = 0; i < n; ++i) {
    auto model = NewModel(name, options);
    EXPECT_TRUE(model.ok()) << model.status();
    models.push_back(std::move(*model));
  }
  return models;
}

// The averaged tower gradients equal the single-device gradient of the whole
// batch, for uneven splits too.
TEST(TowersTest, AveragedTowerGradientsEqualTheWholeBatchGradient) {
  for (const std::string name : {"mlp", "lenet"}) {
    for (int n : {2, 3}) {
      auto single = MakeModels(name, 1);
      std::vector<Tensor> params;
      single[0]->Initialize(7, &params);
      constexpr int kBatch = 10;
      Tensor images({kBatch, 784});
      std::vector<int32_t> labels(kBatch);
      std::mt19937 rng(3);
      for (float& x : images.flat()) x = std::uniform_real_distribution<float>(0, 1)(rng);
      for (int i = 0; i < kBatch; ++i) labels[i] = i % 10;

      std::vector<Tensor> want, got;
      const float want_loss = single[0]->ComputeGradients(params, images, labels, &want);
      Towers towers(MakeModels(name, n));
      const float got_loss = towers.ComputeGradients(params, images, labels, &got);
      EXPECT_NEAR(got_loss, want_loss, 1e-5 * std::abs(want_loss)) << name << " " << n;
      ASSERT_EQ(got.size(), want.size());
      for (size_t v = 0; v < want.size(); ++v) {
        double max_diff = 0, max_abs = 0;
        for (int64_t j = 0; j < want[v].num_elements(); ++j) {
          max_diff = std::max(max_diff, double(std::abs(got[v].data()[j] - want[v].data()[j])));
          max_abs = std::max(max_abs, double(std::abs(want[v].data()[j])));
        }
        EXPECT_LE(max_diff, 1e-5 * std::max(1e-3, max_abs)) << name << " towers=" << n << " var " << v;
      }
    }
  }
}

}  // namespace
}  // namespace psrt
