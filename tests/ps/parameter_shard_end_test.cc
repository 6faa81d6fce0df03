// An operator's end of training (psrtctl shutdown): sync shards that are a
// version apart when it arrives end at one version (PrepareEnd, EndAt).
#include "gtest/gtest.h"
#include "ps/parameter_shard.h"
#include "tests/ps/shard_test_util.h"

namespace psrt {
namespace {

using shard_test::Config;
using shard_test::InitShard;
using shard_test::PullNow;
using shard_test::PushFrom;

const std::vector<float> kOnes = {1, 1, 1, 1};

// Before the fix, each shard ended at whatever version it had: here ps/0 at
// version 1 and ps/1 at 0 (its second push of step 0 still on the way), and
// the job's final model and checkpoint mixed two steps.
TEST(ParameterShardEndTest, ShardsAVersionApartEndAtOneVersion) {
  ParameterShard ahead({}), behind({});
  InitShard(&ahead, Config(proto::SYNC, 2, 2));
  InitShard(&behind, Config(proto::SYNC, 2, 2));
  ASSERT_TRUE(PushFrom(&ahead, 0, 0, kOnes).ok());
  ASSERT_EQ(PushFrom(&ahead, 1, 0, kOnes)->version(), 1);
  ASSERT_EQ(PushFrom(&behind, 0, 0, kOnes)->version(), 0);

  const int64_t end = std::max(ahead.PrepareEnd(absl::Seconds(30)),
                               behind.PrepareEnd(absl::Seconds(30)));
  EXPECT_EQ(end, 2);
  ahead.EndAt(end);
  behind.EndAt(end);
  EXPECT_FALSE(ahead.GetStatus().training_done());
  // The workers go on: step 0's last push, then step 1 everywhere.
  EXPECT_EQ(PushFrom(&behind, 1, 0, kOnes)->version(), 1);
  for (ParameterShard* shard : {&ahead, &behind}) {
    ASSERT_TRUE(PushFrom(shard, 0, 1, kOnes)->accepted());
    const absl::StatusOr<proto::PushResponse> last = PushFrom(shard, 1, 1, kOnes);
    ASSERT_TRUE(last.ok()) << last.status();
    EXPECT_EQ(last->version(), 2);
    EXPECT_TRUE(last->training_done());
    // Step 2 is not taken.
    const absl::StatusOr<proto::PushResponse> after = PushFrom(shard, 0, 2, kOnes);
    EXPECT_FALSE(after->accepted());
    EXPECT_EQ(after->version(), 2);
  }
  EXPECT_EQ(PullNow(&ahead, 2)->second, PullNow(&behind, 2)->second);
}

// A prepared shard completes its next version, then holds: the pushes of
// the version after it are taken but complete nothing, and are dropped if
// the operator ends there.
TEST(ParameterShardEndTest, APreparedShardHoldsAtItsNextVersion) {
  ParameterShard shard({});
  InitShard(&shard, Config(proto::SYNC, 2, 2));
  EXPECT_EQ(shard.PrepareEnd(absl::Seconds(30)), 1);
  ASSERT_TRUE(PushFrom(&shard, 0, 0, kOnes).ok());
  ASSERT_EQ(PushFrom(&shard, 1, 0, kOnes)->version(), 1);
  const std::vector<float> at_one = PullNow(&shard, 1)->second;
  ASSERT_TRUE(PushFrom(&shard, 0, 1, kOnes)->accepted());
  const absl::StatusOr<proto::PushResponse> held = PushFrom(&shard, 1, 1, kOnes);
  EXPECT_TRUE(held->accepted());
  EXPECT_EQ(held->version(), 1);
  shard.EndAt(1);
  EXPECT_TRUE(shard.GetStatus().training_done());
  EXPECT_EQ(shard.GetStatus().version(), 1);
  EXPECT_EQ(PullNow(&shard, 1)->second, at_one);
}

// An end prepared but never confirmed (the operator's tool died between
// its two calls) lets training go on once the hold lapses.
TEST(ParameterShardEndTest, AnUnconfirmedHoldLapses) {
  ParameterShard shard({});
  InitShard(&shard, Config(proto::SYNC, 2, 2));
  EXPECT_EQ(shard.PrepareEnd(absl::Milliseconds(200)), 1);
  ASSERT_TRUE(PushFrom(&shard, 0, 0, kOnes).ok());
  ASSERT_EQ(PushFrom(&shard, 1, 0, kOnes)->version(), 1);
  ASSERT_TRUE(PushFrom(&shard, 0, 1, kOnes).ok());
  ASSERT_EQ(PushFrom(&shard, 1, 1, kOnes)->version(), 1);  // Held.
  const absl::StatusOr<std::pair<int64_t, std::vector<float>>> pulled =
      PullNow(&shard, 2, absl::Seconds(10));
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->first, 2);
  EXPECT_FALSE(shard.GetStatus().training_done());
}

// Async shards have no versions to agree on: the end is at once.
TEST(ParameterShardEndTest, AnAsyncShardEndsAtOnce) {
  ParameterShard shard({});
  InitShard(&shard, Config(proto::ASYNC, 2, 1));
  ASSERT_TRUE(PushFrom(&shard, 0, 0, kOnes).ok());
  EXPECT_EQ(shard.PrepareEnd(absl::Seconds(30)), 0);  // Ended already.
  EXPECT_TRUE(shard.GetStatus().training_done());
  shard.EndAt(1);
  EXPECT_FALSE(PushFrom(&shard, 1, 1, kOnes)->accepted());
}

}  // namespace
}  // namespace psrt
