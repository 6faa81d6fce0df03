// Each optimizer against values derived by hand from TensorFlow's update
// rules (tensorflow/core/kernels/training_ops.cc) and default
// hyperparameters: var = [1, -2], gradients [0.1, -0.2] then [0.3, 0.05],
// learning rate 0.1. The expected numbers were worked out once, by hand and
// in double precision, and are written here as literals.
#include "ps/optimizer.h"

#include "common/training_config.h"

#include "gtest/gtest.h"

namespace psrt {
namespace {

std::vector<float> TwoSteps(proto::TrainingConfig config, int64_t split = 1) {
  config.set_learning_rate(0.1f);
  SetOptimizerDefaults(&config);
  auto optimizer = NewOptimizer(config, 2);
  EXPECT_TRUE(optimizer.ok()) << optimizer.status();
  std::vector<float> var = {1.0f, -2.0f};
  const std::vector<std::vector<float>> grads = {{0.1f, -0.2f}, {0.3f, 0.05f}};
  for (int64_t step = 0; step < 2; ++step) {
    (*optimizer)->BeginStep(step);
    // Apply in pieces: slots must follow the element ranges.
    for (int64_t begin = 0; begin < 2; begin += split) {
      (*optimizer)->Apply(begin, absl::MakeConstSpan(grads[step]).subspan(begin, split),
                          absl::MakeSpan(var).subspan(begin, split));
    }
  }
  return var;
}

proto::TrainingConfig Config(proto::OptimizerType type) {
  proto::TrainingConfig config;
  config.set_mode(proto::ASYNC);
  config.set_num_replicas(1);
  config.set_optimizer(type);
  return config;
}

void ExpectNear(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 2e-6 * std::max(1.0, std::abs(want[i]))) << i;
  }
}

TEST(OptimizerTest, Sgd) { ExpectNear(TwoSteps(Config(proto::SGD)), {0.96, -1.985}); }

TEST(OptimizerTest, Momentum) {
  proto::TrainingConfig config = Config(proto::MOMENTUM);
  config.set_momentum(0.9f);
  ExpectNear(TwoSteps(config), {0.951, -1.967});
  ExpectNear(TwoSteps(config, /*split=*/2), {0.951, -1.967});
}

TEST(OptimizerTest, NesterovMomentum) {
  proto::TrainingConfig config = Config(proto::MOMENTUM);
  config.set_momentum(0.9f);
  config.set_use_nesterov(true);
  ExpectNear(TwoSteps(config), {0.9159, -1.9553});
}

TEST(OptimizerTest, AdagradWithTensorFlowsInitialAccumulator) {
  ExpectNear(TwoSteps(Config(proto::ADAGRAD)), {0.902766826, -1.95979308});
}

TEST(OptimizerTest, RmsPropStartsItsMeanSquareAtOne) {
  ExpectNear(TwoSteps(Config(proto::RMSPROP)), {0.956333448, -1.98450724});
}

TEST(OptimizerTest, AdamWithBiasCorrection) {
  // Step 1 moves each element by lr exactly (m / sqrt(v) = sign(g)).
  ExpectNear(TwoSteps(Config(proto::ADAM)), {0.808222296, -1.85305341});
}

TEST(OptimizerTest, FtrlProximal) {
  // TensorFlow's ApplyFtrl from var [1, -2]: the first update sets var
  // from the linear term alone, as FTRL does.
  ExpectNear(TwoSteps(Config(proto::FTRL)), {-0.050695763028362276, -0.2694845657311325});
  proto::TrainingConfig regularized = Config(proto::FTRL);
  regularized.set_l1_regularization_strength(0.05f);
  regularized.set_l2_regularization_strength(0.01f);
  ExpectNear(TwoSteps(regularized), {-0.043219397423862646, -0.2547603726701341});
  ExpectNear(TwoSteps(regularized, /*split=*/2), {-0.043219397423862646, -0.2547603726701341});
  regularized.set_l1_regularization_strength(2.0f);  // Every |linear| below l1: zeros.
  ExpectNear(TwoSteps(regularized), {0.0, 0.0});
  regularized.set_l1_regularization_strength(-1.0f);
  regularized.set_learning_rate(0.1f);
  EXPECT_FALSE(NewOptimizer(regularized, 2).ok());
}

TEST(OptimizerTest, SlotsAreNamedForCheckpoints) {
  proto::TrainingConfig config = Config(proto::ADAM);
  config.set_learning_rate(0.1f);
  SetOptimizerDefaults(&config);
  auto adam = NewOptimizer(config, 3);
  ASSERT_TRUE(adam.ok());
  auto slots = (*adam)->slots();
  ASSERT_EQ(slots.size(), 2u);
  EXPECT_EQ(slots[0].first, "Adam");
  EXPECT_EQ(slots[1].first, "Adam_1");
  EXPECT_EQ(slots[0].second->num_elements(), 3);
}

TEST(OptimizerTest, RejectsBadHyperparameters) {
  proto::TrainingConfig config = Config(proto::MOMENTUM);
  config.set_learning_rate(0.1f);
  config.set_momentum(1.5f);
  auto bad = NewOptimizer(config, 1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("momentum"), absl::string_view::npos);
  config.set_momentum(0.5f);
  config.set_learning_rate(-1);
  EXPECT_FALSE(NewOptimizer(config, 1).ok());
  config.set_learning_rate(0.1f);
  config.set_optimizer(proto::OPTIMIZER_UNSPECIFIED);
  EXPECT_NE(NewOptimizer(config, 1).status().message().find("ADAM"), absl::string_view::npos);
}

}  // namespace
}  // namespace psrt
