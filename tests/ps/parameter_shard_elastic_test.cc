// ParameterShard with elastic workers (TrainingConfig.max_workers): each
// version waits for the members at it, as the chief's SetMembers lists them.
#include <vector>

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

proto::TrainingConfig Elastic(int max_workers) {
  proto::TrainingConfig config = Config(proto::SYNC, max_workers, 1);
  config.set_max_workers(max_workers);
  config.set_min_workers(1);
  return config;
}

proto::MembersRequest Members(std::vector<std::pair<int, int64_t>> members) {
  proto::MembersRequest request;
  for (auto [replica, from] : members) {
    request.add_replicas(replica);
    request.add_from_versions(from);
  }
  return request;
}

const std::vector<float> kOnes(kSize, 1.0f);
const std::vector<float> kThrees(kSize, 3.0f);

TEST(ParameterShardElasticTest, TheChiefAloneUntilTheListNamesOthers) {
  ParameterShard shard({});
  InitShard(&shard, Elastic(4));
  // Replica 1 is no member yet: its push is dropped, and the chief's
  // completes the version alone.
  auto dropped = PushFrom(&shard, 1, 0, kThrees);
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_FALSE(dropped->accepted());
  auto chief = PushFrom(&shard, 0, 0, kOnes);
  ASSERT_TRUE(chief.ok()) << chief.status();
  EXPECT_TRUE(chief->accepted());
  EXPECT_EQ(chief->version(), 1);
  EXPECT_EQ(PullNow(&shard, 1)->second, std::vector<float>(kSize, -1.0f));
  EXPECT_EQ(shard.GetStatus().stale_pushes_dropped(), 1);
}

TEST(ParameterShardElasticTest, AJoinerCountsFromItsVersionOn) {
  ParameterShard shard({});
  InitShard(&shard, Elastic(4));
  auto listed = shard.SetMembers(Members({{0, 0}, {2, 1}}));
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->version(), 0);
  // Version 0: the chief alone (replica 2 joins at 1).
  ASSERT_EQ(PushFrom(&shard, 0, 0, kOnes)->version(), 1);
  // Version 1 waits for both, and averages them.
  ASSERT_EQ(PushFrom(&shard, 0, 1, kOnes)->version(), 1);
  ASSERT_EQ(PushFrom(&shard, 2, 1, kThrees)->version(), 2);
  EXPECT_EQ(PullNow(&shard, 2)->second, std::vector<float>(kSize, -3.0f));  // -1 - (1+3)/2
}

TEST(ParameterShardElasticTest, AMemberDroppedNoLongerHoldsTheVersionBack) {
  ParameterShard shard({});
  InitShard(&shard, Elastic(3));
  ASSERT_TRUE(shard.SetMembers(Members({{0, 0}, {1, 0}, {2, 0}})).ok());
  ASSERT_EQ(PushFrom(&shard, 0, 0, kOnes)->version(), 0);
  ASSERT_EQ(PushFrom(&shard, 1, 0, kThrees)->version(), 0);
  // Replica 2 is gone: the list without it completes version 0 with the
  // mean of the two gradients that came.
  auto listed = shard.SetMembers(Members({{0, 0}, {1, 0}}));
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->version(), 1);
  EXPECT_EQ(PullNow(&shard, 1)->second, std::vector<float>(kSize, -2.0f));
  // Its late push is dropped.
  EXPECT_FALSE(PushFrom(&shard, 2, 1, kOnes)->accepted());
}

TEST(ParameterShardElasticTest, ListsWithoutTheChiefOrOutOfRangeAreRefused) {
  ParameterShard shard({});
  InitShard(&shard, Elastic(2));
  EXPECT_EQ(shard.SetMembers(Members({{1, 0}})).status().code(),
            absl::StatusCode::kInvalidArgument);  // Without the chief.
  EXPECT_EQ(shard.SetMembers(Members({{0, 0}, {2, 0}})).status().code(),
            absl::StatusCode::kInvalidArgument);  // Above max_workers.
  proto::MembersRequest uneven = Members({{0, 0}});
  uneven.add_replicas(1);
  EXPECT_EQ(shard.SetMembers(uneven).status().code(), absl::StatusCode::kInvalidArgument);

  ParameterShard fixed({});
  InitShard(&fixed, Config(proto::SYNC, 2, 2));
  const absl::Status not_elastic = fixed.SetMembers(Members({{0, 0}})).status();
  EXPECT_EQ(not_elastic.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(not_elastic.message().find("--max_workers"), absl::string_view::npos);
  ParameterShard empty({});
  EXPECT_EQ(empty.SetMembers(Members({{0, 0}})).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace psrt
