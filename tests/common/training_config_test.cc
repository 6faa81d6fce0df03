#include "common/training_config.h"

#include <cmath>

#include "gtest/gtest.h"

namespace psrt {
namespace {

TEST(LearningRateTest, ExponentialDecayAsTensorFlow) {
  proto::TrainingConfig config;
  config.set_learning_rate(0.1f);
  auto* s = config.mutable_schedule();
  s->set_type(proto::LearningRateSchedule::EXPONENTIAL_DECAY);
  s->set_decay_rate(0.5f);
  s->set_decay_steps(10);
  EXPECT_FLOAT_EQ(LearningRateAt(config, 0), 0.1f);
  EXPECT_FLOAT_EQ(LearningRateAt(config, 5), 0.1f * std::pow(0.5f, 0.5f));
  EXPECT_FLOAT_EQ(LearningRateAt(config, 20), 0.025f);
  s->set_staircase(true);
  EXPECT_FLOAT_EQ(LearningRateAt(config, 5), 0.1f);
  EXPECT_FLOAT_EQ(LearningRateAt(config, 19), 0.05f);
  EXPECT_FLOAT_EQ(LearningRateAt(config, 20), 0.025f);
}

TEST(LearningRateTest, PiecewiseConstantAndWarmup) {
  proto::TrainingConfig config;
  config.set_learning_rate(1.0f);
  auto* s = config.mutable_schedule();
  s->set_type(proto::LearningRateSchedule::PIECEWISE_CONSTANT);
  s->add_boundaries(100);
  s->add_boundaries(200);
  s->add_values(1.0f);
  s->add_values(0.5f);
  s->add_values(0.1f);
  ASSERT_TRUE(ValidateSchedule(*s).ok());
  EXPECT_FLOAT_EQ(LearningRateAt(config, 100), 1.0f);  // tf: x <= boundary.
  EXPECT_FLOAT_EQ(LearningRateAt(config, 101), 0.5f);
  EXPECT_FLOAT_EQ(LearningRateAt(config, 500), 0.1f);
  s->set_warmup_steps(10);
  EXPECT_FLOAT_EQ(LearningRateAt(config, 0), 0.1f);
  EXPECT_FLOAT_EQ(LearningRateAt(config, 4), 0.5f);
  EXPECT_FLOAT_EQ(LearningRateAt(config, 10), 1.0f);
  s->add_values(0.01f);  // One value too many.
  EXPECT_FALSE(ValidateSchedule(*s).ok());
}

// Found by fuzz/ps_requests_fuzzer.cc: an Init naming 2^31 - 1 replicas
// made the parameter server allocate 16 GB of per-replica state.
TEST(ValidateTrainingConfigTest, RefusesReplicaCountsOutOfRange) {
  proto::TrainingConfig config;
  config.set_mode(proto::ASYNC);
  config.set_optimizer(proto::SGD);
  config.set_learning_rate(0.1f);
  config.set_num_replicas(kMaxReplicas);
  EXPECT_TRUE(ValidateTrainingConfig(config).ok());
  for (int bad : {0, -1, kMaxReplicas + 1, 2147483647}) {
    config.set_num_replicas(bad);
    absl::Status status = ValidateTrainingConfig(config);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find("num_replicas"), absl::string_view::npos) << status;
  }
}

}  // namespace
}  // namespace psrt
