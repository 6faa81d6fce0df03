// ParameterShard's replicas ("Replicas" in ps/parameter_shard.h): two copies
// of one shard in this process, each the other's ReplicaPeer, one of which
// can be made unreachable as a dead ps task is.
#include <atomic>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
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

// The other copy, called in this process; unreachable while `down`.
class LocalPeer final : public ReplicaPeer {
 public:
  absl::StatusOr<proto::ReplicateResponse> Call(const proto::ReplicateHeader& header,
                                                const std::vector<absl::Span<const char>>& data,
                                                absl::Duration) override {
    if (down.load() || target == nullptr) return absl::UnavailableError("connection refused");
    ++calls;
    std::vector<char> bytes;
    for (absl::Span<const char> piece : data) bytes.insert(bytes.end(), piece.begin(), piece.end());
    SpanByteSource source(absl::Span<const char>(bytes.data(), bytes.size()));
    return target->Replicate(header, &source);
  }
  const std::string& name() const override { return name_; }

  ParameterShard* target = nullptr;
  std::atomic<bool> down{false};
  std::atomic<int> calls{0};

 private:
  const std::string name_ = "the other copy";
};

// A primary and its backup, each the other's peer.
struct Pair {
  Pair() {
    // Each copy calls the other holding its own lock: a cycle to Abseil's
    // detector here, never in psrt_ps, whose copies are in two processes.
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
    ParameterShard::Options primary_options;
    primary_options.peer = to_backup;
    ParameterShard::Options backup_options;
    backup_options.peer = to_primary;
    backup_options.starts_as_backup = true;
    primary = std::make_unique<ParameterShard>(primary_options);
    backup = std::make_unique<ParameterShard>(backup_options);
    to_backup->target = backup.get();
    to_primary->target = primary.get();
  }
  // The primary's task dies: neither copy reaches the other.
  void KillPrimary() {
    to_primary->down = true;
    to_backup->down = true;
  }

  std::shared_ptr<LocalPeer> to_backup = std::make_shared<LocalPeer>();
  std::shared_ptr<LocalPeer> to_primary = std::make_shared<LocalPeer>();
  std::unique_ptr<ParameterShard> primary, backup;
};

std::vector<float> Values(ParameterShard* shard) {
  auto read = shard->Read(false);
  EXPECT_TRUE(read.ok()) << read.status();
  if (!read.ok()) return {};
  const Tensor& values = read->snapshot->values;
  return std::vector<float>(values.data(), values.data() + kSize);
}

TEST(ShardReplicationTest, TheBackupHoldsEachSyncVersionBeforeItIsPulled) {
  Pair pair;
  InitShard(pair.primary.get(), Config(proto::SYNC, 2, 2, 0.5f), {1, 2, 3, 4});
  EXPECT_TRUE(pair.backup->GetStatus().initialized());  // Filled at Init.
  EXPECT_TRUE(pair.backup->GetStatus().backup());
  for (int64_t v = 0; v < 3; ++v) {
    ASSERT_TRUE(PushFrom(pair.primary.get(), 0, v, {1, 2, 3, 4}, 11, v + 1).ok());
    ASSERT_TRUE(PushFrom(pair.primary.get(), 1, v, {3, 2, 1, 0}, 22, v + 1).ok());
    EXPECT_EQ(pair.backup->GetStatus().version(), v + 1);
  }
  EXPECT_EQ(Values(pair.backup.get()), Values(pair.primary.get()));
  EXPECT_EQ(pair.backup->GetStatus().incarnation(), pair.primary->GetStatus().incarnation());
  // A worker that reaches the backup while the primary answers is sent back.
  auto refused = PushFrom(pair.backup.get(), 0, 3, {1, 1, 1, 1}, 11, 4);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_TRUE(pair.backup->GetStatus().backup());
}

TEST(ShardReplicationTest, TheBackupTakesOverAndTheStepsPushesCountOnce) {
  Pair pair;
  InitShard(pair.primary.get(), Config(proto::SYNC, 2, 2, 0.5f));
  ASSERT_TRUE(PushFrom(pair.primary.get(), 0, 0, {1, 1, 1, 1}, 11, 1).ok());
  ASSERT_TRUE(PushFrom(pair.primary.get(), 1, 0, {3, 3, 3, 3}, 22, 1).ok());
  // Replica 0's push of version 1 dies with the primary.
  ASSERT_TRUE(PushFrom(pair.primary.get(), 0, 1, {2, 2, 2, 2}, 11, 2).ok());
  const std::vector<float> at_1 = Values(pair.primary.get());
  pair.KillPrimary();
  // Replica 1's push reaches the backup, which takes over at version 1.
  auto pushed = PushFrom(pair.backup.get(), 1, 1, {4, 4, 4, 4}, 22, 2);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_FALSE(pair.backup->GetStatus().backup());
  EXPECT_EQ(pair.backup->GetStatus().version(), 1);
  EXPECT_EQ(Values(pair.backup.get()), at_1);
  // Replica 1 sends its step-1 push again: taken once, not twice.
  auto resent = PushFrom(pair.backup.get(), 1, 1, {4, 4, 4, 4}, 22, 2);
  ASSERT_TRUE(resent.ok());
  EXPECT_EQ(pair.backup->GetStatus().version(), 1);
  // Replica 0 sends its lost push again: version 2, as without the fault.
  ASSERT_TRUE(PushFrom(pair.backup.get(), 0, 1, {2, 2, 2, 2}, 11, 2).ok());
  auto pulled = PullNow(pair.backup.get(), 2);
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  // w = -0.5 * 2 (version 0's mean) - 0.5 * 3 (version 1's).
  EXPECT_EQ(pulled->second, (std::vector<float>{-2.5, -2.5, -2.5, -2.5}));
  // A resend of version 0's push, its version long made: not applied again.
  ASSERT_TRUE(PushFrom(pair.backup.get(), 0, 0, {1, 1, 1, 1}, 11, 1).ok());
  EXPECT_EQ(pair.backup->GetStatus().version(), 2);
  EXPECT_EQ(PullNow(pair.backup.get(), 2)->second, (std::vector<float>{-2.5, -2.5, -2.5, -2.5}));
}

TEST(ShardReplicationTest, AReplacedPrimaryStepsDownAtItsNextVersion) {
  Pair pair;
  InitShard(pair.primary.get(), Config(proto::SYNC, 1, 1));
  ASSERT_TRUE(PushFrom(pair.primary.get(), 0, 0, {1, 1, 1, 1}, 11, 1).ok());
  // The backup cannot reach the primary (a partition, or a frozen primary),
  // and a worker that cannot either makes it take over.
  pair.to_primary->down = true;
  ASSERT_TRUE(PushFrom(pair.backup.get(), 0, 1, {1, 1, 1, 1}, 11, 2).ok());
  EXPECT_FALSE(pair.backup->GetStatus().backup());
  // The old primary's next version is refused by the new one: it steps
  // down, and the push that made the version is to be sent to the new one.
  auto late = PushFrom(pair.primary.get(), 0, 1, {1, 1, 1, 1}, 11, 2);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kUnavailable) << late.status();
  EXPECT_TRUE(pair.primary->GetStatus().backup());
  EXPECT_EQ(PullNow(pair.primary.get(), 0).status().code(), absl::StatusCode::kUnavailable);
  // The new primary fills it when it next can, and it follows again.
  pair.to_primary->down = false;
  absl::SleepFor(absl::Seconds(1.1));  // The fill's retry interval.
  ASSERT_TRUE(PushFrom(pair.backup.get(), 0, 2, {1, 1, 1, 1}, 11, 3).ok());
  EXPECT_EQ(pair.primary->GetStatus().version(), 3);
  EXPECT_EQ(Values(pair.primary.get()), Values(pair.backup.get()));
}

TEST(ShardReplicationTest, AsyncPushesAreCopiedBeforeTheyAreAcknowledged) {
  Pair pair;
  InitShard(pair.primary.get(), Config(proto::ASYNC, 2, 1, 0.25f));
  ASSERT_TRUE(PushFrom(pair.primary.get(), 0, 0, {1, 2, 3, 4}, 11, 1).ok());
  ASSERT_TRUE(PushFrom(pair.primary.get(), 1, 0, {4, 3, 2, 1}, 22, 1).ok());
  EXPECT_EQ(pair.backup->GetStatus().version(), 2);
  EXPECT_EQ(Values(pair.backup.get()), Values(pair.primary.get()));
  pair.KillPrimary();
  // Replica 1 never heard back from its last push, and sends it again to
  // the backup: it holds it already.
  auto resent = PushFrom(pair.backup.get(), 1, 0, {4, 3, 2, 1}, 22, 1);
  ASSERT_TRUE(resent.ok()) << resent.status();
  EXPECT_TRUE(resent->accepted());
  EXPECT_EQ(pair.backup->GetStatus().version(), 2);
  ASSERT_TRUE(PushFrom(pair.backup.get(), 0, 0, {1, 1, 1, 1}, 11, 2).ok());
  EXPECT_EQ(pair.backup->GetStatus().version(), 3);
}

TEST(ShardReplicationTest, ABackupThatFellBehindIsFilledBeforeItCounts) {
  Pair pair;
  InitShard(pair.primary.get(), Config(proto::SYNC, 1, 1));
  pair.to_backup->down = true;  // The backup's task is gone a while.
  ASSERT_TRUE(PushFrom(pair.primary.get(), 0, 0, {1, 1, 1, 1}, 11, 1).ok());
  ASSERT_TRUE(PushFrom(pair.primary.get(), 0, 1, {1, 1, 1, 1}, 11, 2).ok());
  EXPECT_EQ(pair.backup->GetStatus().version(), 0);
  pair.to_backup->down = false;
  absl::SleepFor(absl::Seconds(1.1));
  ASSERT_TRUE(PushFrom(pair.primary.get(), 0, 2, {1, 1, 1, 1}, 11, 3).ok());
  EXPECT_EQ(pair.backup->GetStatus().version(), 3);
  EXPECT_EQ(Values(pair.backup.get()), Values(pair.primary.get()));
  // A backup that was never filled cannot take over.
  Pair empty;
  InitShard(empty.primary.get(), Config(proto::SYNC, 1, 1));
  ParameterShard::Options options;
  options.peer = std::make_shared<LocalPeer>();  // Never reaches anything.
  options.starts_as_backup = true;
  ParameterShard unfilled(options);
  EXPECT_EQ(PushFrom(&unfilled, 0, 0, {1, 1, 1, 1}, 11, 1).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(ShardReplicationTest, ARestartedCopyJoinsAsTheBackupOfTheOneThatServes) {
  Pair pair;
  InitShard(pair.primary.get(), Config(proto::SYNC, 1, 1));
  ASSERT_TRUE(PushFrom(pair.primary.get(), 0, 0, {1, 1, 1, 1}, 11, 1).ok());
  // The primary's task restarts empty before any worker noticed: the
  // backup, in step, takes over and fills the new process's copy.
  ParameterShard::Options options;
  options.peer = pair.to_backup;
  ParameterShard restarted(options);
  pair.to_primary->target = &restarted;
  EXPECT_TRUE(restarted.JoinReplicas());
  EXPECT_FALSE(pair.backup->GetStatus().backup());
  EXPECT_TRUE(restarted.GetStatus().backup());
  ASSERT_TRUE(PushFrom(pair.backup.get(), 0, 1, {1, 1, 1, 1}, 11, 2).ok());
  EXPECT_EQ(restarted.GetStatus().version(), 2);
  EXPECT_EQ(Values(&restarted), Values(pair.backup.get()));
  // A copy whose other copy holds nothing starts as the primary.
  Pair fresh;
  EXPECT_FALSE(fresh.primary->JoinReplicas());
  EXPECT_FALSE(fresh.primary->GetStatus().backup());
}

}  // namespace
}  // namespace psrt
