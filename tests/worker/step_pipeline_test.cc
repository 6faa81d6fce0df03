// StepPipeline against real shards in this process: a shard's values are
// usable as soon as it arrives, each shard's push leaves only once all its
// variables are ready (and before the others'), and a failed pull releases
// the compute waiting for it.
#include "worker/training/step_pipeline.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/local_ps.h"

namespace psrt {
namespace {

// Three variables on three stripes of one task: contiguous placement puts
// one variable on each.
const std::vector<VariableDef> kVariables = {{"a", {1000}}, {"b", {1000}}, {"c", {1000}}};

PlacementOptions Contiguous() {
  PlacementOptions options;
  options.strategy = PlacementStrategy::kContiguous;
  return options;
}

TEST(StepPipelineTest, PushesEachShardOnceItsGradientsAreReadyLastLayersFirst) {
  LocalPs ps(0, /*stripes=*/3);
  auto client = NewClient({&ps}, 0, kVariables, absl::Seconds(60), 3, nullptr, Contiguous());
  ASSERT_TRUE(client->WaitForServers(absl::Seconds(10)).ok());
  ASSERT_TRUE(client->Init(SyncConfig(1), Filled(kVariables, 2.0f)).ok());
  for (int k = 0; k < 3; ++k) {
    ASSERT_EQ(client->placement().shard_slices[k].size(), 1u);
    ASSERT_EQ(client->placement().slices[client->placement().shard_slices[k][0]].variable, k);
  }

  StepPipeline pipeline(client.get(), client->placement(), 3);
  std::vector<Tensor> params = Filled(kVariables, 0.0f);
  pipeline.StartPull(0, &params, 0);
  pipeline.WaitForVariables(0, 1);
  EXPECT_EQ(params[0].data()[999], 2.0f);
  auto pulled = pipeline.WaitForPull();
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->version, 0);
  EXPECT_EQ(params[2].data()[0], 2.0f);

  // One replica: a shard's version moves as soon as its push lands.
  std::vector<Tensor> grads = Filled(kVariables, 1.0f);
  pipeline.StartPush(&grads);
  EXPECT_TRUE(pipeline.push_started());
  pipeline.MarkReady(2, 3);  // The backward pass finished the last layer.
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (ps.shard(2).GetStatus().version() != 1 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(ps.shard(2).GetStatus().version(), 1);
  // The first layers' shards wait for their gradients.
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(ps.shard(1).GetStatus().version(), 0);
  EXPECT_EQ(ps.shard(0).GetStatus().version(), 0);
  grads[0].data()[0] = 3.0f;  // Written before its shard is ready: sent.
  pipeline.MarkReady(0, 2);
  auto pushed = pipeline.FinishPush();
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_TRUE(pushed->accepted);
  EXPECT_FALSE(pipeline.push_started());

  pipeline.StartPull(1, &params, 0);
  pulled = pipeline.WaitForPull();
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->version, 1);
  EXPECT_EQ(params[0].data()[0], 2.0f - 0.5f * 3.0f);
  EXPECT_EQ(params[1].data()[1], 1.5f);
  EXPECT_EQ(params[2].data()[2], 1.5f);
  EXPECT_TRUE(client->Shutdown().ok());
}

TEST(StepPipelineTest, AFailedPullReleasesTheComputeAndReportsTheError) {
  auto ps = std::make_unique<LocalPs>(0, /*stripes=*/3);
  auto client = NewClient({ps.get()}, 0, kVariables, /*retry_timeout=*/absl::Seconds(1), 3,
                          nullptr, Contiguous());
  ASSERT_TRUE(client->WaitForServers(absl::Seconds(10)).ok());
  ASSERT_TRUE(client->Init(SyncConfig(1), Filled(kVariables, 2.0f)).ok());
  ps.reset();  // The task dies.

  StepPipeline pipeline(client.get(), client->placement(), 3);
  std::vector<Tensor> params = Filled(kVariables, 0.0f);
  pipeline.StartPull(0, &params, 0);
  pipeline.WaitForVariables(0, 3);  // Returns: the pull has ended.
  auto pulled = pipeline.WaitForPull();
  EXPECT_EQ(pulled.status().code(), absl::StatusCode::kUnavailable) << pulled.status();
  EXPECT_EQ(params[0].data()[0], 0.0f);
  EXPECT_GT(pipeline.TakeBlockedTime(), absl::ZeroDuration());
  EXPECT_EQ(pipeline.TakeBlockedTime(), absl::ZeroDuration());
}

}  // namespace
}  // namespace psrt
