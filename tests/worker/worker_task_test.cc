#include "worker/worker_task.h"

#include "gtest/gtest.h"

namespace psrt {
namespace {

WorkerConfig DecayEvery(double epochs) {
  WorkerConfig config;
  config.decay_epochs = epochs;
  config.examples_per_step = 100;
  proto::TrainingConfig& rule = config.trainer.config;
  rule.set_mode(proto::SYNC);
  rule.set_num_replicas(1);
  rule.set_replicas_to_aggregate(1);
  rule.set_optimizer(proto::SGD);
  rule.set_learning_rate(0.1f);
  rule.mutable_schedule()->set_type(proto::LearningRateSchedule::EXPONENTIAL_DECAY);
  rule.mutable_schedule()->set_decay_rate(0.5f);
  rule.mutable_schedule()->set_decay_steps(1);  // Provisional, as the flags leave it.
  return config;
}

TEST(ResolveDecayEpochsTest, EpochsBecomeStepsOfTheTrainingSet) {
  WorkerConfig config = DecayEvery(2);
  ASSERT_TRUE(ResolveDecayEpochs(60000, &config).ok());
  EXPECT_EQ(config.trainer.config.schedule().decay_steps(), 1200);
}

// Criteo logs are streamed, their size unknown (0): decaying every step
// instead would silently ruin the run.
TEST(ResolveDecayEpochsTest, AnInputOfUnknownSizeNeedsDecaySteps) {
  WorkerConfig config = DecayEvery(1);
  const absl::Status status = ResolveDecayEpochs(0, &config);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("give --decay_steps"), absl::string_view::npos) << status;
  WorkerConfig no_decay = DecayEvery(0);
  EXPECT_TRUE(ResolveDecayEpochs(0, &no_decay).ok());
}

}  // namespace
}  // namespace psrt
