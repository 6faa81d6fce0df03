// ParameterShard under hostile or broken input and failing machines:
// non-finite results, floods of pulls, full disks, a checkpoint still
// loading, a chief that vanished.
#include <signal.h>
#include <sys/resource.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "ps/parameter_shard.h"
#include "tests/ps/shard_test_util.h"

namespace psrt {
namespace {

using shard_test::Bytes;
using shard_test::Config;
using shard_test::InitShard;
using shard_test::kSize;
using shard_test::Meta;
using shard_test::PullNow;
using shard_test::PushFrom;

// Finite gradients whose mean overflows float: nothing of the version is
// applied, the push that completed it fails, and the version moves on.
TEST(ParameterShardTest, AnOverflowingSyncMeanIsNeverApplied) {
  ParameterShard shard{ParameterShard::Options()};
  InitShard(&shard, Config(proto::SYNC, 2, 2), {1, 2, 3, 4});
  ASSERT_TRUE(PushFrom(&shard, 0, 0, {3e38f, 1, 1, 1}).ok());
  auto completing = PushFrom(&shard, 1, 0, {3e38f, 1, 1, 1});
  EXPECT_EQ(completing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(completing.status().message().find("mean gradient of version 0 for \"w\""),
            std::string::npos)
      << completing.status();
  auto pulled = PullNow(&shard, 1);  // Nobody waits forever for version 1.
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->second, (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(shard.GetStatus().nonfinite_pushes_dropped(), 1);
  // The next version trains normally.
  ASSERT_TRUE(PushFrom(&shard, 0, 1, {1, 1, 1, 1}).ok());
  ASSERT_TRUE(PushFrom(&shard, 1, 1, {3, 3, 3, 3}).ok());
  EXPECT_EQ(PullNow(&shard, 2)->second, (std::vector<float>{-1, 0, 1, 2}));
}

// A huge but finite gradient would drive Adagrad's accumulator to Inf (and
// Adam's to NaN): refused, or dropped and counted with skip; the values and
// the optimizer's state stay as they were.
TEST(ParameterShardTest, AGradientThatWouldOverflowTheOptimizerIsNeverApplied) {
  for (proto::OptimizerType rule : {proto::ADAGRAD, proto::ADAM}) {
    for (bool skip : {false, true}) {
      SCOPED_TRACE(absl::StrCat(proto::OptimizerType_Name(rule), skip ? " skip" : " reject"));
      ParameterShard::Options options;
      options.skip_nonfinite_gradients = skip;
      ParameterShard shard(options);
      proto::TrainingConfig config = Config(proto::ASYNC, 1, 1, 0.1f);
      config.set_optimizer(rule);
      config.set_initial_accumulator_value(0.1f);  // TensorFlow's defaults.
      config.set_beta1(0.9f);
      config.set_beta2(0.999f);
      config.set_epsilon(1e-8f);
      InitShard(&shard, config, {1, 2, 3, 4});
      auto huge = PushFrom(&shard, 0, 0, {1, 1e30f, 1, 1});
      if (skip) {
        ASSERT_TRUE(huge.ok()) << huge.status();
        EXPECT_FALSE(huge->accepted());
        EXPECT_EQ(shard.GetStatus().nonfinite_pushes_dropped(), 1);
      } else {
        EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
        EXPECT_NE(huge.status().message().find("optimizer state NaN or Inf"), std::string::npos)
            << huge.status();
      }
      EXPECT_EQ(shard.GetStatus().version(), 0);
      EXPECT_EQ(PullNow(&shard, 0)->second, (std::vector<float>{1, 2, 3, 4}));
      // The state is untouched: an ordinary step still moves every value.
      ASSERT_TRUE(PushFrom(&shard, 0, 0, {1, 1, 1, 1}).ok());
      // (Held in a variable: a range-for over PullNow(...)->second would
      // read a destroyed temporary.)
      absl::StatusOr<std::pair<int64_t, std::vector<float>>> after = PullNow(&shard, 1);
      ASSERT_TRUE(after.ok()) << after.status();
      for (float v : after->second) EXPECT_TRUE(std::isfinite(v)) << v;
      EXPECT_LT(after->second[1], 2.0f);
    }
  }
}

TEST(ParameterShardTest, NonFiniteInitialValuesAreRefused) {
  ParameterShard shard{ParameterShard::Options()};
  proto::InitHeader header;
  *header.mutable_config() = Config(proto::SYNC, 1, 1);
  *header.add_variables() = Meta("a", {2});
  *header.add_variables() = Meta("b", {2});
  std::vector<float> values = {1, 2, 3, std::numeric_limits<float>::infinity()};
  auto refused = shard.Init(header, Bytes(values).get());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("initial value of \"b\""), std::string::npos)
      << refused.status();
  EXPECT_FALSE(shard.GetStatus().initialized());
}

// A flood of pulls that can never be answered: at most max_waiting_pulls
// wait, the rest are refused at once; pushes go on; a cancelled pull is
// freed and answered Cancelled.
TEST(ParameterShardTest, AFloodOfPullsIsBounded) {
  ParameterShard::Options options;
  options.max_waiting_pulls = 100;
  ParameterShard shard(options);
  InitShard(&shard, Config(proto::ASYNC, 1, 1));
  std::atomic<int> exhausted{0}, cancelled{0}, done{0};
  std::vector<int64_t> ids;
  for (int i = 0; i < 20000; ++i) {
    ParameterShard::PullOptions pull;
    pull.min_version = int64_t{1} << 40;
    pull.deadline = absl::InfiniteFuture();
    const int64_t id = shard.Pull(pull, [&](absl::StatusOr<ParameterShard::PullReply> reply) {
      exhausted += absl::IsResourceExhausted(reply.status());
      cancelled += absl::IsCancelled(reply.status());
      ++done;
    });
    if (id != 0) ids.push_back(id);
  }
  EXPECT_EQ(ids.size(), 100u);
  EXPECT_EQ(exhausted.load(), 19900);
  EXPECT_EQ(shard.GetStatus().waiting_pulls(), 100);
  ASSERT_TRUE(PushFrom(&shard, 0, 0, {1, 1, 1, 1}).ok());
  shard.CancelPull(ids[7]);
  shard.CancelPull(ids[7]);  // Once only.
  EXPECT_EQ(cancelled.load(), 1);
  EXPECT_EQ(shard.GetStatus().waiting_pulls(), 99);
  shard.Shutdown(0);  // Training over: the others are answered.
  EXPECT_EQ(done.load(), 20000);
  EXPECT_EQ(shard.GetStatus().waiting_pulls(), 0);
}

// Two shards of one job whose saves fail on one of them (its disk is full:
// here a file size limit): the step every shard saved is kept by both, so
// they still share a checkpoint to restore. (Each used to prune its own
// newest `keep`, and the two kept sets stopped overlapping.)
TEST(ParameterShardTest, SavesFailingOnOneShardStillLeaveACommonCheckpoint) {
  std::vector<std::unique_ptr<ParameterShard>> shards;
  for (int k = 0; k < 2; ++k) {
    ParameterShard::Options options;
    options.checkpoint_dir = testing::TempDir() + "/diverging";
    if (k == 0) std::filesystem::remove_all(options.checkpoint_dir);
    std::filesystem::create_directories(options.checkpoint_dir);
    options.shard = k;
    options.num_shards = 2;
    shards.push_back(std::make_unique<ParameterShard>(options));
    InitShard(shards.back().get(), Config(proto::ASYNC, 1, 1));
  }
  struct sigaction ignore = {}, old_action;
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGXFSZ, &ignore, &old_action), 0);
  struct rlimit old_limit;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  int64_t complete = -1;  // What the chief tracks: the newest saved everywhere.
  for (int64_t step : {10, 20, 30, 40, 50}) {
    ASSERT_TRUE(shards[0]->Save(step, -1, /*keep=*/2, complete).ok());
    struct rlimit full = old_limit;
    full.rlim_cur = step >= 30 ? 100 : old_limit.rlim_cur;  // Shard 1's disk fills up.
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &full), 0);
    const bool saved = shards[1]->Save(step, -1, /*keep=*/2, complete).ok();
    ::setrlimit(RLIMIT_FSIZE, &old_limit);
    EXPECT_EQ(saved, step < 30) << step;
    if (saved) complete = step;
  }
  ::sigaction(SIGXFSZ, &old_action, nullptr);
  const auto held = [&](int k) {
    const auto steps = shards[k]->GetStatus().checkpoint_steps();
    return std::vector<int64_t>(steps.begin(), steps.end());
  };
  EXPECT_EQ(held(0), (std::vector<int64_t>{50, 40, 20}));
  EXPECT_EQ(held(1), (std::vector<int64_t>{20, 10}));
  EXPECT_TRUE(shards[0]->Restore(20, 1).ok());
  EXPECT_TRUE(shards[1]->Restore(20, 1).ok());
}

// A ps serves while it loads its checkpoint at start: until then nothing
// may initialize, push, pull or save (UNAVAILABLE, which clients retry), so
// a chief cannot initialize a shard whose checkpoint is about to land.
TEST(ParameterShardTest, NothingTouchesAShardWhileItRestoresAtStart) {
  ParameterShard::Options options;
  options.checkpoint_dir = testing::TempDir() + "/restoring";
  std::filesystem::remove_all(options.checkpoint_dir);
  std::filesystem::create_directories(options.checkpoint_dir);
  {
    ParameterShard first(options);
    InitShard(&first, Config(proto::ASYNC, 1, 1), {1, 2, 3, 4});
    ASSERT_TRUE(first.Save(5, -1, 2).ok());
  }
  options.restore_at_start = true;
  ParameterShard shard(options);
  EXPECT_TRUE(shard.GetStatus().restoring());
  proto::InitHeader header;
  *header.mutable_config() = Config(proto::ASYNC, 1, 1);
  *header.add_variables() = Meta("w", {kSize});
  std::vector<float> fresh(kSize, 9.0f);
  EXPECT_EQ(shard.Init(header, Bytes(fresh).get()).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(PushFrom(&shard, 0, 0, {1, 1, 1, 1}).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(PullNow(&shard, 0).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(shard.Save(6, -1, 2).status().code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(shard.RestoreLatest().ok());
  EXPECT_FALSE(shard.GetStatus().restoring());
  EXPECT_EQ(shard.GetStatus().restored_step(), 5);
  auto confirmed = shard.Init(header, Bytes(fresh).get());  // Keeps the checkpoint.
  ASSERT_TRUE(confirmed.ok()) << confirmed.status();
  EXPECT_FALSE(*confirmed);
  EXPECT_EQ(PullNow(&shard, 0)->second, (std::vector<float>{1, 2, 3, 4}));
}

// A shard holding a model exits (WaitUntilFinished fails) when the chief
// has been silent for chief_timeout without ending training; other
// replicas' pushes do not count as the chief's.
TEST(ParameterShardTest, AShardGivesUpOnAChiefThatVanished) {
  ParameterShard shard{ParameterShard::Options()};
  // No model yet: nothing to lose, the shard waits for a chief.
  absl::Notification waited;
  std::thread waiter([&] {
    EXPECT_TRUE(shard.WaitUntilFinished(absl::ZeroDuration(), absl::Milliseconds(1)).ok());
    waited.Notify();
  });
  EXPECT_FALSE(waited.WaitForNotificationWithTimeout(absl::Milliseconds(300)));
  shard.Shutdown(-1);  // An operator ends it.
  waiter.join();

  ParameterShard held{ParameterShard::Options()};
  InitShard(&held, Config(proto::ASYNC, 2, 1));
  const absl::Time start = absl::Now();
  std::thread others([&] {
    for (int i = 0; i < 10; ++i) {
      EXPECT_TRUE(PushFrom(&held, 1, 0, {1, 1, 1, 1}).ok());
      absl::SleepFor(absl::Milliseconds(50));
    }
  });
  ASSERT_TRUE(PushFrom(&held, 0, 0, {1, 1, 1, 1}).ok());
  absl::Status vanished = held.WaitUntilFinished(absl::Seconds(30), absl::Milliseconds(200));
  others.join();
  EXPECT_EQ(vanished.code(), absl::StatusCode::kDeadlineExceeded) << vanished;
  EXPECT_NE(vanished.message().find("chief (replica 0)"), std::string::npos) << vanished;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));

  // A chief waiting in a pull (for a slow worker) is alive all along.
  ParameterShard waiting{ParameterShard::Options()};
  InitShard(&waiting, Config(proto::ASYNC, 1, 1));
  ParameterShard::PullOptions pull;
  pull.replica = 0;
  pull.min_version = int64_t{1} << 40;
  pull.deadline = absl::Now() + absl::Milliseconds(800);
  const absl::Time pulled = absl::Now();
  waiting.Pull(pull, [](absl::StatusOr<ParameterShard::PullReply>) {});
  absl::Status gone = waiting.WaitUntilFinished(absl::Seconds(30), absl::Milliseconds(200));
  EXPECT_EQ(gone.code(), absl::StatusCode::kDeadlineExceeded) << gone;
  EXPECT_GE(absl::Now() - pulled, absl::Milliseconds(800));
}

}  // namespace
}  // namespace psrt
