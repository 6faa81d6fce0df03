// ParameterShard's entries for a worker's own model (allreduce mode):
// ApplyGradient is exactly one sync step of a single replica's push, with
// the optimizer, its slots, the moving averages and the version; Read gets
// what a pull that does not wait gets.
#include <cmath>
#include <string>
#include <vector>

#include "common/byte_source.h"
#include "gtest/gtest.h"
#include "ps/parameter_shard.h"
#include "tests/ps/shard_test_util.h"

namespace psrt {
namespace {

using shard_test::Config;
using shard_test::InitShard;
using shard_test::kSize;
using shard_test::PullNow;
using shard_test::PushFrom;

std::vector<float> Values(ParameterShard* shard, bool moving_average) {
  absl::StatusOr<ParameterShard::PullReply> reply = shard->Read(moving_average);
  EXPECT_TRUE(reply.ok()) << reply.status();
  if (!reply.ok()) return {};
  const float* v = reply->snapshot->values.data();
  return std::vector<float>(v, v + kSize);
}

TEST(ParameterShardLocalTest, ApplyGradientIsOneSyncStepOfOneReplica) {
  proto::TrainingConfig config = Config(proto::SYNC, 1, 1, /*learning_rate=*/0.1f);
  config.set_optimizer(proto::MOMENTUM);
  config.set_momentum(0.9f);
  config.set_moving_average_decay(0.99f);
  ParameterShard pushed({}), applied({});
  InitShard(&pushed, config, {1, -2, 3, 0.5f});
  InitShard(&applied, config, {1, -2, 3, 0.5f});
  const std::vector<std::vector<float>> grads = {
      {0.3f, -1, 2, 0.125f}, {1e-3f, 7, -0.5f, 3}, {-2, 0, 0.25f, 1}};
  for (size_t step = 0; step < grads.size(); ++step) {
    ASSERT_TRUE(PushFrom(&pushed, 0, step, grads[step]).ok());
    absl::StatusOr<proto::PushResponse> response = applied.ApplyGradient(grads[step]);
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_TRUE(response->accepted());
    EXPECT_EQ(response->version(), static_cast<int64_t>(step) + 1);
  }
  // Bit for bit: the same optimizer step (momentum slots included) and the
  // same moving averages.
  EXPECT_EQ(Values(&applied, false), PullNow(&pushed, 3)->second);
  EXPECT_EQ(Values(&applied, true), Values(&pushed, true));
  EXPECT_NE(Values(&applied, true), Values(&applied, false));
  EXPECT_EQ(applied.Read(false)->header.version(), 3);
  EXPECT_EQ(applied.GetStatus().version(), 3);
}

// An elastic ring's regroup: one shard's whole state (optimizer slots,
// moving averages and version included) exported into a fresh one, which
// then trains on bit for bit as the first.
TEST(ParameterShardLocalTest, AnExportedStateCarriesOnBitForBitWhereItIsImported) {
  proto::TrainingConfig config = Config(proto::SYNC, 1, 1, /*learning_rate=*/0.1f);
  config.set_optimizer(proto::MOMENTUM);
  config.set_momentum(0.9f);
  config.set_moving_average_decay(0.99f);
  ParameterShard source({}), fresh({});
  proto::ReplicaState state;
  std::string data;
  EXPECT_EQ(source.ExportState(&state, &data).code(), absl::StatusCode::kFailedPrecondition);
  InitShard(&source, config, {1, -2, 3, 0.5f});
  ASSERT_TRUE(source.ApplyGradient(std::vector<float>{0.3f, -1, 2, 0.125f}).ok());
  ASSERT_TRUE(source.ApplyGradient(std::vector<float>{1e-3f, 7, -0.5f, 3}).ok());
  ASSERT_TRUE(source.ExportState(&state, &data).ok());
  // Values, the momentum slot and the moving averages.
  EXPECT_EQ(data.size(), 3 * kSize * sizeof(float));

  SpanByteSource short_data(absl::Span<const char>(data.data(), data.size() - 4));
  EXPECT_EQ(fresh.ImportState(state, &short_data).code(), absl::StatusCode::kInvalidArgument);
  SpanByteSource bytes(absl::Span<const char>(data.data(), data.size()));
  ASSERT_TRUE(fresh.ImportState(state, &bytes).ok());
  EXPECT_EQ(fresh.GetStatus().version(), 2);
  EXPECT_TRUE(fresh.GetStatus().ready());
  EXPECT_EQ(Values(&fresh, false), Values(&source, false));
  EXPECT_EQ(Values(&fresh, true), Values(&source, true));
  const std::vector<float> next = {-2, 0, 0.25f, 1};
  ASSERT_TRUE(source.ApplyGradient(next).ok());
  ASSERT_TRUE(fresh.ApplyGradient(next).ok());
  EXPECT_EQ(Values(&fresh, false), Values(&source, false)) << "the momentum slot differs";
  EXPECT_EQ(Values(&fresh, true), Values(&source, true));
  EXPECT_EQ(fresh.GetStatus().version(), 3);
}

TEST(ParameterShardLocalTest, ANonFiniteMeanIsRefusedAndNothingApplied) {
  ParameterShard shard({});
  InitShard(&shard, Config(proto::SYNC, 1, 1), {1, 2, 3, 4});
  const absl::StatusOr<proto::PushResponse> refused =
      shard.ApplyGradient(std::vector<float>{0, 0, std::nanf(""), 0});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_NE(refused.status().message().find("\"w\""), absl::string_view::npos)
      << refused.status();
  EXPECT_EQ(Values(&shard, false), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(shard.Read(false)->header.version(), 0);
  // A finite gradient whose update overflows: 4 + 3e38 is finite, twice not.
  const std::vector<float> huge = {0, 0, 0, -3e38f};
  ASSERT_TRUE(shard.ApplyGradient(huge).ok());
  EXPECT_EQ(shard.ApplyGradient(huge).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Values(&shard, false), (std::vector<float>{1, 2, 3, 4 + 3e38f}));
  EXPECT_EQ(shard.Read(false)->header.version(), 1);
}

TEST(ParameterShardLocalTest, ReadAndApplyNeedAModelAndStopWhenTrainingEnds) {
  ParameterShard shard({});
  EXPECT_EQ(shard.Read(false).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard.ApplyGradient(std::vector<float>(kSize, 1)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  InitShard(&shard, Config(proto::SYNC, 1, 1));
  EXPECT_EQ(shard.Read(true).status().code(), absl::StatusCode::kFailedPrecondition)
      << "no moving averages kept";
  shard.Shutdown(0);
  absl::StatusOr<proto::PushResponse> after = shard.ApplyGradient(std::vector<float>(kSize, 1));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_FALSE(after->accepted());
  EXPECT_TRUE(after->training_done());
  EXPECT_EQ(Values(&shard, false), std::vector<float>(kSize, 0.0f));
  EXPECT_TRUE(shard.Read(false)->header.training_done());
}

}  // namespace
}  // namespace psrt
