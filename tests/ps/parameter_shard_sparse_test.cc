// ParameterShard with embedding tables (ps/shard_tables.h): rows pushed
// with the dense gradients, taken, dropped and applied with them; rows
// pulled after the values.
#include <cstring>
#include <limits>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "ps/embedding_table.h"
#include "ps/parameter_shard.h"
#include "tests/ps/shard_test_util.h"

namespace psrt {
namespace {

using shard_test::Config;
using shard_test::kSize;
using shard_test::Meta;

constexpr int kDim = 2;

void InitWithTable(ParameterShard* shard, const proto::TrainingConfig& config) {
  proto::InitHeader header;
  *header.mutable_config() = config;
  *header.add_variables() = Meta("w", {kSize});
  proto::TableMeta* table = header.add_tables();
  table->set_name("emb");
  table->set_dim(kDim);
  table->set_seed(7);
  const std::vector<float> zeros(kSize, 0.0f);
  auto initialized = shard->Init(header, shard_test::Bytes(zeros).get());
  ASSERT_TRUE(initialized.ok()) << initialized.status();
}

// A push of dense gradient `dense` and gradient rows `rows` (kDim each) for
// `ids` of table `table`.
absl::StatusOr<proto::PushResponse> PushRows(ParameterShard* shard, int replica, int64_t version,
                                             const std::vector<float>& dense,
                                             const std::vector<uint64_t>& ids,
                                             const std::vector<float>& rows,
                                             const std::string& table = "emb",
                                             int64_t num_ids = -1) {
  proto::PushHeader header;
  header.set_replica(replica);
  header.set_version(version);
  *header.add_variables() = Meta("w", {kSize});
  proto::SparseSegment* segment = header.add_sparse();
  segment->set_table(table);
  segment->set_num_ids(num_ids >= 0 ? num_ids : static_cast<int64_t>(ids.size()));
  std::vector<char> bytes(dense.size() * 4 + ids.size() * 8 + rows.size() * 4);
  char* at = bytes.data();
  std::memcpy(at, dense.data(), dense.size() * 4);
  at += dense.size() * 4;
  std::memcpy(at, ids.data(), ids.size() * 8);
  at += ids.size() * 8;
  std::memcpy(at, rows.data(), rows.size() * 4);
  SpanByteSource data(absl::MakeConstSpan(bytes));
  return shard->Push(header, &data);
}

// The rows of `ids`, pulled (sparse_only: without the values).
absl::StatusOr<std::vector<float>> PullRows(ParameterShard* shard, const std::vector<uint64_t>& ids,
                                            bool sparse_only = false,
                                            int64_t min_version = 0) {
  proto::PullRequest request;
  request.set_min_version(min_version);
  request.set_sparse_only(sparse_only);
  proto::SparseIds* asked = request.add_sparse();
  asked->set_table("emb");
  asked->mutable_ids()->Add(ids.begin(), ids.end());
  ASSIGN_OR_RETURN(ParameterShard::PullOptions options, shard->PullOptionsFor(request));
  absl::Notification done;
  absl::StatusOr<ParameterShard::PullReply> reply;
  shard->Pull(options, [&](absl::StatusOr<ParameterShard::PullReply> r) {
    reply = std::move(r);
    done.Notify();
  });
  done.WaitForNotification();
  if (!reply.ok()) return reply.status();
  EXPECT_EQ(reply->num_bytes, sparse_only ? 0u : kSize * sizeof(float));
  EXPECT_EQ(reply->header.variables_size(), sparse_only ? 0 : 1);
  EXPECT_EQ(reply->header.sparse_size(), 1);
  EXPECT_EQ(reply->header.sparse(0).num_ids(), static_cast<int64_t>(ids.size()));
  if (reply->rows == nullptr) return absl::InternalError("no rows");
  return *reply->rows;
}

// The row an untouched id starts with, from a table like the shard's.
std::vector<float> InitialRow(uint64_t id, const proto::TrainingConfig& config) {
  auto table = EmbeddingTable::Create("emb", kDim, 7, config);
  std::vector<float> row(kDim);
  EXPECT_TRUE((*table)->Lookup({id}, absl::MakeSpan(row)).ok());
  return row;
}

TEST(ParameterShardSparseTest, SyncSumsEachIdsRowsOverTheAcceptedPushesAndAppliesTheMean) {
  const proto::TrainingConfig config = Config(proto::SYNC, 3, 2);
  ParameterShard shard({});
  InitWithTable(&shard, config);
  const std::vector<float> a0 = InitialRow(10, config), b0 = InitialRow(20, config),
                           c0 = InitialRow(30, config);
  ASSERT_EQ(PushRows(&shard, 0, 0, {1, 1, 1, 1}, {10, 20}, {1, 2, 3, 4})->version(), 0);
  // Nothing applied before the version completes.
  EXPECT_EQ(*PullRows(&shard, {10}), a0);
  ASSERT_EQ(PushRows(&shard, 1, 0, {3, 3, 3, 3}, {30, 10}, {5, 6, 7, 8})->version(), 1);
  // The backup's push of version 0 is stale: dropped with its rows.
  auto late = PushRows(&shard, 2, 0, {9, 9, 9, 9}, {10}, {100, 100});
  ASSERT_TRUE(late.ok());
  EXPECT_FALSE(late->accepted());
  const std::vector<float> rows = *PullRows(&shard, {10, 20, 30, 40}, false, 1);
  // SGD, learning rate 1, the mean of R = 2 pushes: id 10 got (1,2) + (7,8).
  EXPECT_FLOAT_EQ(rows[0], a0[0] - 4.0f);
  EXPECT_FLOAT_EQ(rows[1], a0[1] - 5.0f);
  EXPECT_FLOAT_EQ(rows[2], b0[0] - 1.5f);
  EXPECT_FLOAT_EQ(rows[3], b0[1] - 2.0f);
  EXPECT_FLOAT_EQ(rows[4], c0[0] - 2.5f);
  EXPECT_FLOAT_EQ(rows[5], c0[1] - 3.0f);
  // Id 40 was never pushed: its initial row.
  EXPECT_EQ(std::vector<float>(rows.begin() + 6, rows.end()), InitialRow(40, config));
  const proto::StatusResponse status = shard.GetStatus();
  ASSERT_EQ(status.tables_size(), 1);
  EXPECT_EQ(status.tables(0).name(), "emb");
  EXPECT_EQ(status.tables(0).rows(), 4);
  EXPECT_GT(status.tables(0).bytes(), 4 * kDim * 4);
}

TEST(ParameterShardSparseTest, AsyncAppliesRowsOnArrival) {
  const proto::TrainingConfig config = Config(proto::ASYNC, 2, 1, 0.5f);
  ParameterShard shard({});
  InitWithTable(&shard, config);
  const std::vector<float> a0 = InitialRow(5, config);
  ASSERT_TRUE(PushRows(&shard, 0, 0, {0, 0, 0, 0}, {5}, {2, 4})->accepted());
  ASSERT_TRUE(PushRows(&shard, 1, 0, {0, 0, 0, 0}, {5}, {2, 4})->accepted());
  const std::vector<float> rows = *PullRows(&shard, {5}, /*sparse_only=*/true);
  EXPECT_FLOAT_EQ(rows[0], a0[0] - 2.0f);
  EXPECT_FLOAT_EQ(rows[1], a0[1] - 4.0f);
}

TEST(ParameterShardSparseTest, MalformedRowsAreRefusedAndNothingChanges) {
  const proto::TrainingConfig config = Config(proto::ASYNC, 1, 1);
  ParameterShard shard({});
  InitWithTable(&shard, config);
  const std::vector<float> a0 = InitialRow(1, config);
  auto twice = PushRows(&shard, 0, 0, {1, 1, 1, 1}, {1, 1}, {1, 1, 1, 1});
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(twice.status().message().find("twice"), std::string::npos) << twice.status();
  auto unknown = PushRows(&shard, 0, 0, {1, 1, 1, 1}, {1}, {1, 1}, "nope");
  EXPECT_NE(unknown.status().message().find("\"nope\""), std::string::npos) << unknown.status();
  // More ids than the bytes hold.
  auto short_data = PushRows(&shard, 0, 0, {1, 1, 1, 1}, {1}, {1, 1}, "emb", 3);
  EXPECT_EQ(short_data.status().code(), absl::StatusCode::kInvalidArgument);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto nonfinite = PushRows(&shard, 0, 0, {1, 1, 1, 1}, {1}, {nan, 1});
  EXPECT_NE(nonfinite.status().message().find("embedding table \"emb\""), std::string::npos)
      << nonfinite.status();
  EXPECT_EQ(*PullRows(&shard, {1}), a0);
  EXPECT_EQ(shard.GetStatus().version(), 0);
  EXPECT_EQ(shard_test::PullNow(&shard, 0)->second, std::vector<float>(kSize, 0.0f));
  // And pulls of an unknown table name it.
  proto::PullRequest request;
  request.add_sparse()->set_table("nope");
  auto options = shard.PullOptionsFor(request);
  ASSERT_TRUE(options.ok());
  absl::StatusOr<ParameterShard::PullReply> reply;
  shard.Pull(*options, [&](absl::StatusOr<ParameterShard::PullReply> r) { reply = std::move(r); });
  EXPECT_NE(reply.status().message().find("\"nope\""), std::string::npos) << reply.status();
}

TEST(ParameterShardSparseTest, TablesAreCheckedByALaterInitAndRefuseCheckpoints) {
  const proto::TrainingConfig config = Config(proto::SYNC, 1, 1);
  ParameterShard::Options options;
  options.checkpoint_dir = ::testing::TempDir();
  ParameterShard shard(options);
  InitWithTable(&shard, config);
  proto::InitHeader other;
  *other.mutable_config() = config;
  *other.add_variables() = Meta("w", {kSize});
  const std::vector<float> zeros(kSize, 0.0f);
  EXPECT_EQ(shard.Init(other, shard_test::Bytes(zeros).get()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard.Save(0, -1, 1).status().code(), absl::StatusCode::kUnimplemented);
}

TEST(ParameterShardSparseTest, SparseOptimizerAndLearningRateApplyToRowsOnly) {
  proto::TrainingConfig config = Config(proto::ASYNC, 1, 1, 1.0f);
  config.set_sparse_optimizer(proto::SGD);
  config.set_sparse_learning_rate(0.25f);
  ParameterShard shard({});
  InitWithTable(&shard, config);
  const std::vector<float> a0 = InitialRow(3, config);
  ASSERT_TRUE(PushRows(&shard, 0, 0, {4, 4, 4, 4}, {3}, {4, 8})->accepted());
  const std::vector<float> rows = *PullRows(&shard, {3});
  EXPECT_FLOAT_EQ(rows[0], a0[0] - 1.0f);
  EXPECT_FLOAT_EQ(rows[1], a0[1] - 2.0f);
  EXPECT_EQ(shard_test::PullNow(&shard, 0)->second, std::vector<float>(kSize, -4.0f));
}

}  // namespace
}  // namespace psrt
