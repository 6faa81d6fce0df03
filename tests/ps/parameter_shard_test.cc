#include "ps/parameter_shard.h"

#include <atomic>
#include <cmath>
#include <filesystem>
#include <limits>
#include <thread>

#include "absl/synchronization/notification.h"
#include "common/wire_dtype.h"
#include "gtest/gtest.h"
#include "tests/ps/shard_test_util.h"

namespace psrt {
namespace {

using shard_test::Bytes;
using shard_test::Config;
using shard_test::InitShard;
using shard_test::kSize;
using shard_test::Meta;
using shard_test::PullNow;
using shard_test::PullOnTheWire;
using shard_test::PushFrom;

TEST(ParameterShardTest, SyncAveragesTheFirstRGradientsOfAVersion) {
  ParameterShard shard({});
  InitShard(&shard, Config(proto::SYNC, 3, 2));
  auto r0 = PushFrom(&shard, 0, 0, {1, 2, 3, 4});
  ASSERT_TRUE(r0.ok());
  EXPECT_TRUE(r0->accepted());
  EXPECT_EQ(r0->version(), 0);  // Waiting for a second gradient.
  auto r1 = PushFrom(&shard, 1, 0, {3, 2, 1, 0});
  ASSERT_TRUE(r1.ok());
  EXPECT_EQ(r1->version(), 1);
  auto pulled = PullNow(&shard, 1);
  ASSERT_TRUE(pulled.ok());
  EXPECT_EQ(pulled->first, 1);
  // w = 0 - 1.0 * mean = -(2, 2, 2, 2).
  EXPECT_EQ(pulled->second, (std::vector<float>{-2, -2, -2, -2}));

  // The backup worker's gradient for version 0 arrives late: stale, dropped.
  auto late = PushFrom(&shard, 2, 0, {100, 100, 100, 100});
  ASSERT_TRUE(late.ok());
  EXPECT_FALSE(late->accepted());
  EXPECT_EQ(shard.GetStatus().stale_pushes_dropped(), 1);
  EXPECT_EQ(PullNow(&shard, 1)->second, (std::vector<float>{-2, -2, -2, -2}));
}

TEST(ParameterShardTest, SyncRetriedPushIsNotCountedTwice) {
  ParameterShard shard({});
  InitShard(&shard, Config(proto::SYNC, 2, 2));
  ASSERT_TRUE(PushFrom(&shard, 0, 0, {1, 1, 1, 1}).ok());
  auto retry = PushFrom(&shard, 0, 0, {1, 1, 1, 1});
  ASSERT_TRUE(retry.ok());
  EXPECT_TRUE(retry->accepted());
  EXPECT_EQ(retry->version(), 0);  // Still waiting for replica 1.
  auto r1 = PushFrom(&shard, 1, 0, {3, 3, 3, 3});
  EXPECT_EQ(r1->version(), 1);
  EXPECT_EQ(PullNow(&shard, 1)->second, (std::vector<float>{-2, -2, -2, -2}));
}

TEST(ParameterShardTest, SyncVersionsAdvanceInLockstep) {
  ParameterShard shard({});
  InitShard(&shard, Config(proto::SYNC, 2, 2, 0.5f));
  for (int64_t v = 0; v < 5; ++v) {
    ASSERT_EQ(PushFrom(&shard, 0, v, {1, 1, 1, 1})->version(), v);
    ASSERT_EQ(PushFrom(&shard, 1, v, {1, 1, 1, 1})->version(), v + 1);
    auto future = PushFrom(&shard, 0, v + 2, {1, 1, 1, 1});
    EXPECT_EQ(future.status().code(), absl::StatusCode::kAborted);
  }
  auto pulled = PullNow(&shard, 5);
  EXPECT_EQ(pulled->first, 5);
  EXPECT_EQ(pulled->second, (std::vector<float>{-2.5, -2.5, -2.5, -2.5}));
}

TEST(ParameterShardTest, PullWaitsForTheNextVersion) {
  ParameterShard shard({});
  InitShard(&shard, Config(proto::SYNC, 2, 2));
  std::atomic<bool> answered{false};
  absl::Notification done;
  int64_t got_version = -1;
  shard.Pull({.min_version = 1, .moving_average = false, .deadline = absl::Now() + absl::Seconds(10)},
             [&](absl::StatusOr<ParameterShard::PullReply> reply) {
               ASSERT_TRUE(reply.ok());
               got_version = reply->header.version();
               answered = true;
               done.Notify();
             });
  ASSERT_TRUE(PushFrom(&shard, 0, 0, {1, 1, 1, 1}).ok());
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(answered);  // One of two gradients: still version 0.
  ASSERT_TRUE(PushFrom(&shard, 1, 0, {1, 1, 1, 1}).ok());
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(got_version, 1);
}

TEST(ParameterShardTest, WaitingPullFailsAtItsDeadline) {
  ParameterShard shard({});
  InitShard(&shard, Config(proto::SYNC, 2, 2));
  ASSERT_TRUE(PushFrom(&shard, 0, 0, {1, 1, 1, 1}).ok());
  const absl::Time start = absl::Now();
  auto pulled = PullNow(&shard, 1, absl::Milliseconds(200));
  const absl::Duration waited = absl::Now() - start;
  EXPECT_EQ(pulled.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(pulled.status().message().find("1 of 2"), absl::string_view::npos)
      << pulled.status();
  EXPECT_NE(pulled.status().message().find("none yet from replica(s) 1"),
            absl::string_view::npos)
      << pulled.status();
  EXPECT_GE(waited, absl::Milliseconds(190));
  EXPECT_LT(waited, absl::Seconds(3));
}

TEST(ParameterShardTest, ShutdownByTheChiefReleasesWaitingPulls) {
  ParameterShard shard({});
  InitShard(&shard, Config(proto::SYNC, 2, 2));
  absl::Notification done;
  bool training_done = false;
  shard.Pull({.min_version = 1, .moving_average = false, .deadline = absl::Now() + absl::Seconds(10)},
             [&](absl::StatusOr<ParameterShard::PullReply> reply) {
               training_done = reply.ok() && reply->header.training_done();
               done.Notify();
             });
  shard.Shutdown(1);  // A non-chief finishing does not end training.
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  shard.Shutdown(0);
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_TRUE(training_done);
  auto push = PushFrom(&shard, 1, 0, {1, 1, 1, 1});
  EXPECT_TRUE(push->training_done());
  EXPECT_FALSE(push->accepted());
  // Both replicas said goodbye: returns without waiting for the grace period.
  const absl::Time start = absl::Now();
  EXPECT_TRUE(shard.WaitUntilFinished(absl::Seconds(30)).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(ParameterShardTest, AsyncAppliesEveryConcurrentPushExactlyOnce) {
  // Gradients are small integers and the learning rate 1, so float sums are
  // exact: any lost or doubled update shows up in the final values.
  constexpr int kThreads = 8;
  constexpr int kPushesPerThread = 500;
  ParameterShard shard({});
  InitShard(&shard, Config(proto::ASYNC, kThreads, 1));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const float g = static_cast<float>(t + 1);
      for (int i = 0; i < kPushesPerThread; ++i) {
        auto r = PushFrom(&shard, t, 0, {g, 2 * g, 0, -g});
        ASSERT_TRUE(r.ok());
        ASSERT_TRUE(r->accepted());
      }
    });
  }
  // Concurrent pulls must see consistent snapshots (all lanes in ratio).
  std::thread puller([&] {
    for (int i = 0; i < 200; ++i) {
      auto pulled = PullNow(&shard, 0);
      ASSERT_TRUE(pulled.ok());
      EXPECT_EQ(pulled->second[1], 2 * pulled->second[0]);
      EXPECT_EQ(pulled->second[3], -pulled->second[0]);
    }
  });
  for (auto& t : threads) t.join();
  puller.join();
  const float sum = kPushesPerThread * kThreads * (kThreads + 1) / 2.0f;
  auto pulled = PullNow(&shard, 0);
  EXPECT_EQ(pulled->first, kThreads * kPushesPerThread);
  EXPECT_EQ(pulled->second, (std::vector<float>{-sum, -2 * sum, 0, sum}));
  EXPECT_EQ(shard.GetStatus().pushes_applied(), kThreads * kPushesPerThread);
}

TEST(ParameterShardTest, RejectsBadPushesAndLeavesStateUntouched) {
  ParameterShard shard({});
  InitShard(&shard, Config(proto::SYNC, 2, 2), {5, 5, 5, 5});
  proto::PushHeader header;
  header.set_replica(0);
  *header.add_variables() = Meta("w", {2, 2});
  std::vector<float> grad = {1, 1, 1, 1};
  auto wrong_shape = shard.Push(header, Bytes(grad).get());
  EXPECT_EQ(wrong_shape.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_shape.status().message().find("[2,2]"), absl::string_view::npos);

  header.mutable_variables(0)->set_name("v");
  header.mutable_variables(0)->clear_shape();
  header.mutable_variables(0)->add_shape(kSize);
  auto unknown = shard.Push(header, Bytes(grad).get());
  EXPECT_NE(unknown.status().message().find("\"v\""), absl::string_view::npos);

  header.mutable_variables(0)->set_name("w");
  std::vector<float> short_grad = {1, 1, 1};
  auto short_data = shard.Push(header, Bytes(short_grad).get());
  EXPECT_EQ(short_data.status().code(), absl::StatusCode::kInvalidArgument);

  header.set_replica(7);
  EXPECT_EQ(shard.Push(header, Bytes(grad).get()).status().code(),
            absl::StatusCode::kInvalidArgument);

  header.set_replica(0);
  header.mutable_variables(0)->set_dtype(proto::DT_INVALID);
  EXPECT_EQ(shard.Push(header, Bytes(grad).get()).status().code(),
            absl::StatusCode::kInvalidArgument);

  auto pulled = PullNow(&shard, 0);
  EXPECT_EQ(pulled->first, 0);
  EXPECT_EQ(pulled->second, (std::vector<float>{5, 5, 5, 5}));
  EXPECT_EQ(shard.GetStatus().pushes_applied(), 0);
}

TEST(ParameterShardTest, InitValidatesAndIsIdempotent) {
  ParameterShard shard({});
  proto::InitHeader header;
  *header.mutable_config() = Config(proto::SYNC, 2, 3);  // R > W.
  *header.add_variables() = Meta("w", {kSize});
  std::vector<float> values(kSize, 1.0f);
  auto bad = shard.Init(header, Bytes(values).get());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("replicas_to_aggregate"), absl::string_view::npos);

  auto before_init = PushFrom(&shard, 0, 0, values);
  EXPECT_EQ(before_init.status().code(), absl::StatusCode::kFailedPrecondition);

  *header.mutable_config() = Config(proto::SYNC, 2, 2);
  // A shape whose element count overflows int64 is refused, not wrapped.
  proto::InitHeader huge = header;
  huge.mutable_variables(0)->clear_shape();
  for (int i = 0; i < 3; ++i) huge.mutable_variables(0)->add_shape(int64_t{1} << 40);
  std::vector<float> none;
  EXPECT_EQ(shard.Init(huge, Bytes(none).get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(*shard.Init(header, Bytes(values).get()));
  EXPECT_FALSE(*shard.Init(header, Bytes(values).get()));  // A restarted chief.
  header.mutable_variables(0)->set_name("other");
  EXPECT_EQ(shard.Init(header, Bytes(values).get()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ParameterShardTest, APulledSnapshotNeverChanges) {
  ParameterShard shard({});
  InitShard(&shard, Config(proto::ASYNC, 1, 1), {1, 2, 3, 4});
  absl::StatusOr<ParameterShard::PullReply> held;
  shard.Pull({.min_version = 0, .moving_average = false, .deadline = absl::Now() + absl::Seconds(5)},
             [&](absl::StatusOr<ParameterShard::PullReply> reply) { held = std::move(reply); });
  ASSERT_TRUE(held.ok());
  // The update finds the buffer shared with `held` and must copy first.
  ASSERT_TRUE(PushFrom(&shard, 0, 0, {1, 1, 1, 1}).ok());
  const float* old_values = held->snapshot->values.data();
  EXPECT_EQ(std::vector<float>(old_values, old_values + kSize),
            (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(PullNow(&shard, 0)->second, (std::vector<float>{0, 1, 2, 3}));
}

TEST(ParameterShardTest, LargeGradientsAreReadInBlocks) {
  // More elements than one read block, with a partial last block, in both
  // modes and with a momentum optimizer whose slots follow the blocks.
  constexpr int64_t kLarge = 40000;
  for (proto::SyncMode mode : {proto::SYNC, proto::ASYNC}) {
    ParameterShard shard({});
    proto::InitHeader init;
    *init.mutable_config() = Config(mode, 2, 2, 0.5f);
    init.mutable_config()->set_optimizer(proto::MOMENTUM);
    init.mutable_config()->set_momentum(0.5f);
    *init.add_variables() = Meta("big", {kLarge});
    std::vector<float> zeros(kLarge, 0.0f);
    ASSERT_TRUE(shard.Init(init, Bytes(zeros).get()).ok());
    std::vector<float> grad(kLarge);
    for (int64_t i = 0; i < kLarge; ++i) grad[i] = static_cast<float>(i % 7);
    proto::PushHeader header;
    *header.add_variables() = Meta("big", {kLarge});
    for (int step = 0; step < 2; ++step) {
      for (int replica = 0; replica < 2; ++replica) {
        header.set_replica(replica);
        header.set_version(mode == proto::SYNC ? step : 0);
        ASSERT_TRUE(shard.Push(header, Bytes(grad).get()).ok());
      }
    }
    absl::Notification done;
    std::vector<float> values;
    shard.Pull({.min_version = 0, .moving_average = false, .deadline = absl::Now() + absl::Seconds(5)},
               [&](absl::StatusOr<ParameterShard::PullReply> reply) {
                 const Tensor& t = reply->snapshot->values;
                 values.assign(t.data(), t.data() + t.num_elements());
                 done.Notify();
               });
    done.WaitForNotification();
    // Sync: two updates with g; accum g then 1.5g: w = -0.5 * 2.5g = -1.25g.
    // Async: four updates: accum g, 1.5g, 1.75g, 1.875g: w = -0.5*6.125g.
    const float factor = mode == proto::SYNC ? -1.25f : -3.0625f;
    for (int64_t i = 0; i < kLarge; i += 997) {
      ASSERT_FLOAT_EQ(values[i], factor * grad[i]) << i;
    }
    ASSERT_FLOAT_EQ(values[kLarge - 1], factor * grad[kLarge - 1]);
  }
}

TEST(ParameterShardTest, KeepsMovingAveragesAsTensorFlowsEma) {
  ParameterShard shard({});
  proto::TrainingConfig config = Config(proto::ASYNC, 1, 1);
  config.set_moving_average_decay(0.5f);
  InitShard(&shard, config, {0, 0, 0, 0});
  // w goes 1, 2, 3; decay_t = min(0.5, (1 + t) / (10 + t)) for t = 1, 2, 3.
  double average = 0;
  for (int t = 1; t <= 3; ++t) {
    ASSERT_TRUE(PushFrom(&shard, 0, 0, {-1, -1, -1, -1}).ok());
    const double decay = std::min(0.5, (1.0 + t) / (10.0 + t));
    average -= (1 - decay) * (average - t);
  }
  absl::StatusOr<ParameterShard::PullReply> reply;
  shard.Pull({.min_version = 0, .moving_average = true, .deadline = absl::Now() + absl::Seconds(5)},
             [&](absl::StatusOr<ParameterShard::PullReply> r) { reply = std::move(r); });
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_NEAR(reply->snapshot->values.data()[2], average, 1e-6);
  EXPECT_EQ(PullNow(&shard, 0)->second[2], 3.0f);

  ParameterShard plain({});
  InitShard(&plain, Config(proto::ASYNC, 1, 1));
  plain.Pull({.min_version = 0, .moving_average = true, .deadline = absl::Now() + absl::Seconds(5)},
             [&](absl::StatusOr<ParameterShard::PullReply> r) { reply = std::move(r); });
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kFailedPrecondition);
}

// A batch norm's moving statistic takes the replicas' mean new value as it
// is (sync), or each new value as it comes (async): no optimizer (momentum
// here), no learning rate; its moving average is its value. The variables
// around it still take the optimizer.
TEST(ParameterShardTest, MovingStatisticsTakeTheirNewValues) {
  for (const proto::SyncMode mode : {proto::SYNC, proto::ASYNC}) {
    SCOPED_TRACE(proto::SyncMode_Name(mode));
    ParameterShard shard({});
    proto::TrainingConfig config = Config(mode, 2, mode == proto::SYNC ? 2 : 1, 0.5f);
    config.set_optimizer(proto::MOMENTUM);
    config.set_momentum(0.9f);
    config.set_moving_average_decay(0.99f);
    proto::InitHeader header;
    *header.mutable_config() = config;
    *header.add_variables() = Meta("bn/gamma", {1});
    *header.add_variables() = Meta("bn/moving_mean", {1});
    *header.add_variables() = Meta("bn/moving_variance/part_0", {1});
    *header.add_variables() = Meta("dense/weights", {1});
    ASSERT_TRUE(*shard.Init(header, Bytes({1, 0, 1, 2}).get()));
    proto::PushHeader push;
    *push.mutable_variables() = header.variables();
    for (int replica = 0; replica < 2; ++replica) {
      push.set_replica(replica);
      push.set_version(0);  // Async: the second push is one version stale.
      const float mean = replica == 0 ? 0.25f : 0.75f;
      ASSERT_TRUE(shard.Push(push, Bytes({1, mean, 2 * mean, 1}).get()).ok());
    }
    auto pulled = PullNow(&shard, mode == proto::SYNC ? 1 : 2);
    ASSERT_TRUE(pulled.ok()) << pulled.status();
    if (mode == proto::SYNC) {
      EXPECT_FLOAT_EQ(pulled->second[0], 0.5f);  // 1 - 0.5 * 1.
      EXPECT_FLOAT_EQ(pulled->second[1], 0.5f);  // The mean new value.
      EXPECT_FLOAT_EQ(pulled->second[2], 1.0f);
    } else {
      EXPECT_FLOAT_EQ(pulled->second[0], -0.45f);  // Accum 1, then 1.9.
      EXPECT_FLOAT_EQ(pulled->second[1], 0.75f);   // The last one in.
      EXPECT_FLOAT_EQ(pulled->second[2], 1.5f);
    }
    absl::StatusOr<ParameterShard::PullReply> average;
    shard.Pull({.min_version = 1, .moving_average = true, .deadline = absl::Now() + absl::Seconds(5)},
               [&](absl::StatusOr<ParameterShard::PullReply> r) { average = std::move(r); });
    ASSERT_TRUE(average.ok()) << average.status();
    EXPECT_EQ(average->snapshot->values.data()[1], pulled->second[1]);
    EXPECT_EQ(average->snapshot->values.data()[2], pulled->second[2]);
    EXPECT_NE(average->snapshot->values.data()[0], pulled->second[0]);
  }
}

// A shard that holds another model names the first variable that differs;
// a model without the batch norms' moving statistics that the chief's has
// is a checkpoint of an older psrt, and the message says so.
TEST(ParameterShardTest, InitOfAnotherModelNamesTheVariable) {
  ParameterShard shard({});
  proto::InitHeader held;
  *held.mutable_config() = Config(proto::SYNC, 1, 1);
  *held.add_variables() = Meta("bn/gamma", {2});
  *held.add_variables() = Meta("dense/weights", {2});
  ASSERT_TRUE(*shard.Init(held, Bytes({1, 1, 0, 0}).get()));
  proto::InitHeader asked = held;
  asked.clear_variables();
  *asked.add_variables() = Meta("bn/gamma", {2});
  *asked.add_variables() = Meta("bn/moving_mean", {2});
  *asked.add_variables() = Meta("dense/weights", {2});
  const auto refused = shard.Init(asked, Bytes({1, 1, 0, 0, 0, 0}).get());
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find(
                "variable 1 is \"dense/weights\" [2] here, \"bn/moving_mean\" [2] in the chief's"),
            absl::string_view::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("moving statistics were variables"),
            absl::string_view::npos)
      << refused.status();
}

TEST(ParameterShardTest, BoundedStalenessHoldsAFastWorkerBack) {
  // Async, 2 replicas, staleness 1: replica 0 has pushed 2 gradients, so it
  // may start its third step only once replica 1 has pushed 2 - 1 = 1.
  ParameterShard shard({});
  InitShard(&shard, Config(proto::ASYNC, 2, 1));
  ASSERT_TRUE(PushFrom(&shard, 0, 0, {1, 1, 1, 1}).ok());
  ASSERT_TRUE(PushFrom(&shard, 0, 1, {1, 1, 1, 1}).ok());
  absl::Notification done;
  shard.Pull({.min_clock = 1, .deadline = absl::Now() + absl::Seconds(10)},
             [&](absl::StatusOr<ParameterShard::PullReply> reply) {
               EXPECT_TRUE(reply.ok());
               done.Notify();
             });
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  ASSERT_TRUE(PushFrom(&shard, 1, 2, {1, 1, 1, 1}).ok());
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));

  // A replica that has finished does not hold the others back.
  absl::Notification done2;
  shard.Pull({.min_clock = 2, .deadline = absl::Now() + absl::Seconds(10)},
             [&](absl::StatusOr<ParameterShard::PullReply>) { done2.Notify(); });
  EXPECT_FALSE(done2.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  shard.Shutdown(1);
  EXPECT_TRUE(done2.WaitForNotificationWithTimeout(absl::Seconds(5)));

  // A stalled replica makes the pull fail at its deadline, naming the step.
  auto stalled = [&] {
    absl::StatusOr<ParameterShard::PullReply> result;
    absl::Notification n;
    shard.Pull({.min_clock = 5, .deadline = absl::Now() + absl::Milliseconds(100)},
               [&](absl::StatusOr<ParameterShard::PullReply> r) {
                 result = std::move(r);
                 n.Notify();
               });
    n.WaitForNotification();
    return result.status();
  }();
  EXPECT_EQ(stalled.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(stalled.message().find("slowest replica at step 2"), absl::string_view::npos)
      << stalled;
}

TEST(ParameterShardTest, AsyncRetriedPushIsAppliedOnce) {
  ParameterShard shard({});
  InitShard(&shard, Config(proto::ASYNC, 2, 1));
  ASSERT_TRUE(PushFrom(&shard, 0, 0, {1, 1, 1, 1}, /*worker_incarnation=*/7, 1).ok());
  auto retry = PushFrom(&shard, 0, 0, {1, 1, 1, 1}, 7, 1);  // Same (worker, step).
  ASSERT_TRUE(retry.ok());
  EXPECT_TRUE(retry->accepted());
  EXPECT_EQ(retry->version(), 1);
  EXPECT_EQ(PullNow(&shard, 0)->second, (std::vector<float>{-1, -1, -1, -1}));
  // The next step, and a restarted worker (new incarnation, step 1 again).
  ASSERT_TRUE(PushFrom(&shard, 0, 1, {1, 1, 1, 1}, 7, 2).ok());
  ASSERT_TRUE(PushFrom(&shard, 0, 2, {1, 1, 1, 1}, 9, 1).ok());
  EXPECT_EQ(PullNow(&shard, 0)->second, (std::vector<float>{-3, -3, -3, -3}));
  EXPECT_EQ(shard.GetStatus().pushes_applied(), 3);
}

TEST(ParameterShardTest, NonFiniteGradientsAreRefused) {
  ParameterShard shard({});
  InitShard(&shard, Config(proto::SYNC, 2, 2), {1, 2, 3, 4});
  ASSERT_TRUE(PushFrom(&shard, 0, 0, {1, 1, 1, 1}).ok());
  auto bad = PushFrom(&shard, 1, 0, {1, std::nanf(""), 1, 1});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("\"w\" from replica 1 holds NaN or Inf"),
            absl::string_view::npos)
      << bad.status();
  auto inf = PushFrom(&shard, 1, 0, {1, 1, 1, -INFINITY});
  EXPECT_EQ(inf.status().code(), absl::StatusCode::kInvalidArgument);
  // Nothing was applied and replica 1 can still push a good gradient.
  EXPECT_EQ(shard.GetStatus().version(), 0);
  auto good = PushFrom(&shard, 1, 0, {3, 3, 3, 3});
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(good->version(), 1);
  EXPECT_EQ(PullNow(&shard, 1)->second, (std::vector<float>{-1, 0, 1, 2}));
}

TEST(ParameterShardTest, NonFiniteGradientsAreSkippedInAsyncModeOnly) {
  ParameterShard::Options options;
  options.skip_nonfinite_gradients = true;
  ParameterShard shard(options);
  proto::InitHeader header;
  *header.mutable_config() = Config(proto::SYNC, 2, 2);
  *header.add_variables() = Meta("w", {kSize});
  std::vector<float> values(kSize, 1.0f);
  auto refused = shard.Init(header, Bytes(values).get());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("--nonfinite_gradients=skip"),
            absl::string_view::npos)
      << refused.status();

  InitShard(&shard, Config(proto::ASYNC, 2, 1), {1, 2, 3, 4});
  auto bad = PushFrom(&shard, 1, 0, {1, std::nanf(""), 1, 1});
  ASSERT_TRUE(bad.ok()) << bad.status();
  EXPECT_FALSE(bad->accepted());
  EXPECT_EQ(shard.GetStatus().nonfinite_pushes_dropped(), 1);
  EXPECT_EQ(shard.GetStatus().version(), 0);
  EXPECT_EQ(PullNow(&shard, 0)->second, (std::vector<float>{1, 2, 3, 4}));
}

TEST(ParameterShardTest, RequestsExpectingAnotherIncarnationAreAborted) {
  ParameterShard shard({});
  InitShard(&shard, Config(proto::ASYNC, 1, 1));
  const int64_t incarnation = shard.incarnation();
  EXPECT_NE(incarnation, 0);
  proto::PushHeader header;
  header.set_incarnation(incarnation + 1);
  *header.add_variables() = Meta("w", {kSize});
  std::vector<float> grad(kSize, 1.0f);
  EXPECT_EQ(shard.Push(header, Bytes(grad).get()).status().code(),
            absl::StatusCode::kAborted);
  header.set_incarnation(incarnation);
  EXPECT_TRUE(shard.Push(header, Bytes(grad).get()).ok());

  absl::Notification done;
  absl::Status status;
  shard.Pull({.incarnation = incarnation + 1, .deadline = absl::Now() + absl::Seconds(5)},
             [&](absl::StatusOr<ParameterShard::PullReply> reply) {
               status = reply.status();
               done.Notify();
             });
  done.WaitForNotification();
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
}

TEST(ParameterShardTest, RestoreAbortsWaitingPullsUntilTheChiefConfirms) {
  ParameterShard::Options options;
  options.checkpoint_dir = testing::TempDir() + "/restore_aborts";
  std::filesystem::remove_all(options.checkpoint_dir);
  std::filesystem::create_directories(options.checkpoint_dir);
  ParameterShard shard(options);
  const proto::TrainingConfig config = Config(proto::SYNC, 2, 2);
  InitShard(&shard, config);
  ASSERT_TRUE(shard.Save(/*step=*/0, /*version=*/0, /*keep=*/2).ok());
  ASSERT_TRUE(PushFrom(&shard, 0, 0, {1, 1, 1, 1}).ok());
  ASSERT_TRUE(PushFrom(&shard, 1, 0, {1, 1, 1, 1}).ok());
  ASSERT_TRUE(PushFrom(&shard, 0, 1, {1, 1, 1, 1}).ok());

  absl::Notification done;
  absl::Status waited;
  shard.Pull({.min_version = 2, .deadline = absl::Now() + absl::Seconds(30)},
             [&](absl::StatusOr<ParameterShard::PullReply> reply) {
               waited = reply.status();
               done.Notify();
             });
  const int64_t before = shard.incarnation();
  ASSERT_TRUE(shard.Restore(0).ok());
  EXPECT_NE(shard.incarnation(), before);
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(waited.code(), absl::StatusCode::kAborted) << waited;

  // Not ready: pushes and pulls are Aborted, whatever version they name.
  EXPECT_FALSE(shard.GetStatus().ready());
  EXPECT_EQ(PullNow(&shard, 0).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(PushFrom(&shard, 1, 0, {1, 1, 1, 1}).status().code(),
            absl::StatusCode::kAborted);

  // The chief confirms (Init with the same variables keeps the state).
  proto::InitHeader header;
  *header.mutable_config() = config;
  *header.add_variables() = Meta("w", {kSize});
  std::vector<float> ignored(kSize, 5.0f);
  auto confirmed = shard.Init(header, Bytes(ignored).get());
  ASSERT_TRUE(confirmed.ok());
  EXPECT_FALSE(*confirmed);
  auto pulled = PullNow(&shard, 0);
  ASSERT_TRUE(pulled.ok());
  EXPECT_EQ(pulled->first, 0);
  EXPECT_EQ(pulled->second, (std::vector<float>{0, 0, 0, 0}));
  // Replica 0's push at version 1 came before the rollback: it is from the
  // future now.
  EXPECT_EQ(PushFrom(&shard, 0, 1, {1, 1, 1, 1}).status().code(),
            absl::StatusCode::kAborted);
  ASSERT_TRUE(PushFrom(&shard, 0, 0, {2, 2, 2, 2}).ok());
}

// bfloat16 on the wire: gradients are decoded and summed in float32, the
// values stay float32 on the shard, and a pull may ask for either format.
TEST(ParameterShardTest, Bf16PushesAndPullsKeepFloat32OnTheShard) {
  ParameterShard shard{ParameterShard::Options()};
  const float fine = 1.0f + 1.0f / 1024;  // Not a bfloat16: rounds to 1.
  InitShard(&shard, Config(proto::SYNC, 2, 2), {fine, 2, 3, 4});

  std::vector<float> grad = {1, 1, 1, 1};
  std::vector<uint16_t> wire(kSize);
  EncodeBf16(grad, absl::MakeSpan(wire));
  proto::PushHeader header;
  header.set_replica(0);
  proto::VariableMeta meta = Meta("w", {kSize});
  meta.set_dtype(proto::DT_BFLOAT16);
  *header.add_variables() = meta;
  // A bfloat16 push carries 2 bytes an element, not 4.
  std::vector<float> too_long(kSize, 1.0f);
  absl::StatusOr<proto::PushResponse> refused = shard.Push(header, Bytes(too_long).get());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("want 8"), std::string::npos) << refused.status();
  SpanByteSource bf16(absl::Span<const char>(reinterpret_cast<const char*>(wire.data()),
                                             wire.size() * sizeof(uint16_t)));
  ASSERT_TRUE(shard.Push(header, &bf16).ok());
  // The other replica pushes float32: formats may differ between pushes.
  ASSERT_TRUE(PushFrom(&shard, 1, 0, {3, 3, 3, 3}).ok());

  // mean(1, 3) = 2 applied in float32: the fine part of the value survives.
  auto full = PullNow(&shard, 1);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(full->second, (std::vector<float>{fine - 2, 0, 1, 2}));

  absl::StatusOr<std::vector<float>> decoded = PullOnTheWire(&shard, proto::DT_BFLOAT16);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, (std::vector<float>{-1, 0, 1, 2}));  // fine - 2 rounds to -1.
  // The shard's own values are untouched by the encoding.
  EXPECT_EQ(PullNow(&shard, 1)->second, (std::vector<float>{fine - 2, 0, 1, 2}));

  // Neither float32 nor bfloat16: refused.
  meta.set_dtype(proto::DT_INVALID);
  *header.mutable_variables(0) = meta;
  header.set_version(1);
  EXPECT_EQ(shard.Push(header, &bf16).status().code(), absl::StatusCode::kInvalidArgument);
}

// float16 on the wire: the same path as bfloat16, with its own codec; a
// gradient beyond float16's range arrives as Inf and is refused.
TEST(ParameterShardTest, Fp16PushesAndPullsKeepFloat32OnTheShard) {
  ParameterShard shard{ParameterShard::Options()};
  InitShard(&shard, Config(proto::ASYNC, 1, 1, 0.5f), {1, 2, 3, 4});
  proto::PushHeader header;
  header.set_replica(0);
  proto::VariableMeta meta = Meta("w", {kSize});
  meta.set_dtype(proto::DT_HALF);
  *header.add_variables() = meta;
  auto push = [&](std::vector<float> grad) {
    std::vector<uint16_t> wire(kSize);
    EncodeFp16(grad, absl::MakeSpan(wire));
    SpanByteSource bytes(absl::Span<const char>(reinterpret_cast<const char*>(wire.data()),
                                                wire.size() * sizeof(uint16_t)));
    return shard.Push(header, &bytes);
  };
  ASSERT_TRUE(push({2, 2, 2, 2}).ok());
  EXPECT_EQ(PullNow(&shard, 1)->second, (std::vector<float>{0, 1, 2, 3}));
  EXPECT_EQ(push({1e6f, 0, 0, 0}).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::vector<float>> decoded = PullOnTheWire(&shard, proto::DT_HALF);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, (std::vector<float>{0, 1, 2, 3}));
}

}  // namespace
}  // namespace psrt
