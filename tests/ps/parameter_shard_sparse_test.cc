// ParameterShard with embedding tables (ps/shard_tables.h): rows pushed
// with the dense gradients, taken, dropped and applied with them; rows
// pulled after the values.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "common/training_config.h"
#include "gtest/gtest.h"
#include "ps/checkpoint.h"
#include "ps/embedding_table.h"
#include "ps/parameter_shard.h"
#include "tests/ps/shard_test_util.h"

namespace psrt {
namespace {

using shard_test::Config;
using shard_test::kSize;
using shard_test::Meta;

constexpr int kDim = 2;

// The model: variable "w" and table "emb" (kDim, seed 7).
proto::InitHeader ModelWithTable(const proto::TrainingConfig& config) {
  proto::InitHeader header;
  *header.mutable_config() = config;
  *header.add_variables() = Meta("w", {kSize});
  proto::TableMeta* table = header.add_tables();
  table->set_name("emb");
  table->set_dim(kDim);
  table->set_seed(7);
  return header;
}

// Init, as the chief does it: true when it initialized the shard, false
// when it confirmed what the shard holds.
absl::StatusOr<bool> InitModel(ParameterShard* shard, const proto::TrainingConfig& config) {
  const std::vector<float> zeros(kSize, 0.0f);
  return shard->Init(ModelWithTable(config), shard_test::Bytes(zeros).get());
}

void InitWithTable(ParameterShard* shard, const proto::TrainingConfig& config) {
  auto initialized = InitModel(shard, config);
  ASSERT_TRUE(initialized.ok()) << initialized.status();
}

// A push of dense gradient `dense` and gradient rows `rows` (kDim each) for
// `ids` of table `table`.
absl::StatusOr<proto::PushResponse> PushRows(ParameterShard* shard, int replica, int64_t version,
                                             const std::vector<float>& dense,
                                             const std::vector<uint64_t>& ids,
                                             const std::vector<float>& rows,
                                             const std::string& table = "emb",
                                             int64_t num_ids = -1, int64_t step = -1) {
  proto::PushHeader header;
  header.set_replica(replica);
  header.set_version(version);
  if (step >= 0) {  // A worker's step: a retry of it is known as one.
    header.set_worker_incarnation(7);
    header.set_step(step);
  }
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

TEST(ParameterShardSparseTest, SyncOfOneReplicaAppliesEachPushsRows) {
  const proto::TrainingConfig config = Config(proto::SYNC, 2, 1, 0.5f);
  ParameterShard shard({});
  InitWithTable(&shard, config);
  const std::vector<float> a0 = InitialRow(8, config);
  ASSERT_EQ(PushRows(&shard, 0, 0, {0, 0, 0, 0}, {8}, {2, 4})->version(), 1);
  // The backup's push of version 0 is stale now: its rows are dropped.
  EXPECT_FALSE(PushRows(&shard, 1, 0, {0, 0, 0, 0}, {8}, {100, 100})->accepted());
  ASSERT_EQ(PushRows(&shard, 1, 1, {0, 0, 0, 0}, {8}, {2, 4})->version(), 2);
  const std::vector<float> rows = *PullRows(&shard, {8});
  EXPECT_FLOAT_EQ(rows[0], a0[0] - 2.0f);
  EXPECT_FLOAT_EQ(rows[1], a0[1] - 4.0f);
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
  // A rows-only pull of ids never pushed gives their initial rows without
  // making them.
  EXPECT_EQ(*PullRows(&shard, {6}, /*sparse_only=*/true), InitialRow(6, config));
  EXPECT_EQ(shard.GetStatus().tables(0).rows(), 1);
}

// --sparse_async with --sync_replicas (Persia's hybrid): every push's rows
// are applied on arrival, each at full weight, the stale push's too and a
// retried push's once, while the dense gradients are averaged per version.
TEST(ParameterShardSparseTest, SparseAsyncTakesEveryPushsRowsOnArrival) {
  proto::TrainingConfig config = Config(proto::SYNC, 3, 2, 0.5f);
  config.set_sparse_async(true);
  ParameterShard shard({});
  InitWithTable(&shard, config);
  const std::vector<float> a0 = InitialRow(10, config);
  ASSERT_EQ(PushRows(&shard, 0, 0, {2, 2, 2, 2}, {10}, {1, 2})->version(), 0);
  std::vector<float> row = *PullRows(&shard, {10}, /*sparse_only=*/true);
  EXPECT_FLOAT_EQ(row[0], a0[0] - 0.5f);  // At once, before the version completes.
  EXPECT_FLOAT_EQ(row[1], a0[1] - 1.0f);
  ASSERT_EQ(PushRows(&shard, 1, 0, {4, 4, 4, 4}, {10}, {3, 4})->version(), 1);
  // The backup's push is stale: its dense gradient is dropped, its rows
  // taken; sent again (a retry), they are not taken twice.
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto late = PushRows(&shard, 2, 0, {9, 9, 9, 9}, {10}, {5, 6}, "emb", -1, /*step=*/0);
    ASSERT_TRUE(late.ok()) << late.status();
    EXPECT_FALSE(late->accepted()) << attempt;  // The same answer both times.
  }
  // Replica 1 sends its push of version 1 twice (no incarnation to know the
  // second by): its rows are taken once.
  ASSERT_TRUE(PushRows(&shard, 1, 1, {0, 0, 0, 0}, {11}, {2, 2})->accepted());
  ASSERT_TRUE(PushRows(&shard, 1, 1, {0, 0, 0, 0}, {11}, {2, 2}).ok());
  EXPECT_FLOAT_EQ((*PullRows(&shard, {11}, /*sparse_only=*/true))[0],
                  InitialRow(11, config)[0] - 1.0f);
  row = *PullRows(&shard, {10}, /*sparse_only=*/true);
  EXPECT_FLOAT_EQ(row[0], a0[0] - 0.5f * (1 + 3 + 5));
  EXPECT_FLOAT_EQ(row[1], a0[1] - 0.5f * (2 + 4 + 6));
  // The dense variable: the mean of the two accepted gradients, once.
  proto::PullRequest request;
  request.set_min_version(1);
  auto options = shard.PullOptionsFor(request);
  ASSERT_TRUE(options.ok()) << options.status();
  absl::Notification done;
  std::vector<float> w(kSize);
  shard.Pull(*options, [&](absl::StatusOr<ParameterShard::PullReply> reply) {
    ASSERT_TRUE(reply.ok()) << reply.status();
    const float* values = reply->snapshot->values.data();
    w.assign(values, values + kSize);
    done.Notify();
  });
  done.WaitForNotification();
  EXPECT_EQ(w, std::vector<float>(kSize, -0.5f * 3));
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
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
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
  // And a pull of an unknown table is refused at once, naming it (not once
  // the version it would wait for comes).
  proto::PullRequest request;
  request.set_min_version(100);
  request.add_sparse()->set_table("nope");
  auto options = shard.PullOptionsFor(request);
  EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(options.status().message().find("\"nope\""), std::string::npos) << options.status();
}

TEST(ParameterShardSparseTest, TablesAreCheckedByALaterInit) {
  const proto::TrainingConfig config = Config(proto::SYNC, 1, 1);
  ParameterShard shard({});
  InitWithTable(&shard, config);
  proto::InitHeader other;
  *other.mutable_config() = config;
  *other.add_variables() = Meta("w", {kSize});
  const std::vector<float> zeros(kSize, 0.0f);
  EXPECT_EQ(shard.Init(other, shard_test::Bytes(zeros).get()).status().code(),
            absl::StatusCode::kFailedPrecondition);
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

// Checkpoints of tables (ps/checkpoint.h).

std::string NewDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/sparse_checkpoint_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string CheckpointFile(const std::string& dir, int64_t step) {
  return absl::StrCat(dir, "/model.ckpt-", step, ".ps-0-of-1.safetensors");
}

// Sync with 2 replicas, Adagrad on w and on the rows (one slot each).
proto::TrainingConfig AdagradConfig() {
  proto::TrainingConfig config = Config(proto::SYNC, 2, 2, 0.5f);
  config.set_optimizer(proto::ADAGRAD);
  SetOptimizerDefaults(&config);
  return config;
}

ParameterShard::Options CheckpointOptions(const std::string& dir) {
  ParameterShard::Options options;
  options.threads = 1;
  options.checkpoint_dir = dir;
  return options;
}

// Version `version` of training: both replicas push dense gradients and
// rows of ids old (seen before) and new, one of them shared.
void Step(ParameterShard* shard, int64_t version) {
  for (int replica = 0; replica < 2; ++replica) {
    const std::vector<uint64_t> ids = {static_cast<uint64_t>(version % 3),
                                       static_cast<uint64_t>(100 + 10 * version + replica),
                                       (uint64_t{1} << 63) | static_cast<uint64_t>(replica)};
    std::vector<float> rows;
    for (size_t i = 0; i < ids.size() * kDim; ++i) {
      rows.push_back(0.1f * (i + 1) * (replica + 1) - 0.05f * version);
    }
    const std::vector<float> dense = {0.1f * version, -0.2f, 0.3f * replica, 0.05f};
    auto pushed = PushRows(shard, replica, version, dense, {ids}, rows);
    ASSERT_TRUE(pushed.ok()) << pushed.status();
    ASSERT_TRUE(pushed->accepted());
  }
}

// A restarted shard restores the checkpoint, the chief confirms it, and from
// then on it trains exactly as the shard that was never interrupted: its
// checkpoints are byte for byte the same, values, rows and slots.
TEST(ParameterShardSparseTest, ACheckpointRestoresTheTablesExactlyAndTrainingGoesOn) {
  const proto::TrainingConfig config = AdagradConfig();
  const std::string dir_a = NewDir("uninterrupted"), dir_b = NewDir("restarted");
  ParameterShard uninterrupted(CheckpointOptions(dir_a));
  InitWithTable(&uninterrupted, config);
  for (int64_t v = 0; v < 3; ++v) Step(&uninterrupted, v);
  ASSERT_TRUE(PullRows(&uninterrupted, {500, 7}, true, 3).ok());  // Rows only looked up.
  const int64_t rows = uninterrupted.GetStatus().tables(0).rows();
  absl::StatusOr<std::string> saved = uninterrupted.Save(3, 3, 5);
  ASSERT_TRUE(saved.ok()) << saved.status();

  absl::StatusOr<ShardState> state = ReadShardCheckpoint({dir_a, 0, 1}, 3);
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(state->tables.size(), 1u);
  EXPECT_EQ(state->tables[0].meta.name(), "emb");
  EXPECT_EQ(static_cast<int64_t>(state->tables[0].ids.size()), rows);
  EXPECT_EQ(state->tables[0].values.shape(), (Shape{rows, kDim}));
  ASSERT_EQ(state->tables[0].slots.size(), 1u);
  EXPECT_EQ(state->tables[0].slots[0].first, "Adagrad");
  EXPECT_EQ(ReadSafetensors(*saved)->metadata.at("format"), "psrt-shard-checkpoint-3");

  std::filesystem::copy_file(*saved, CheckpointFile(dir_b, 3));
  ParameterShard::Options options = CheckpointOptions(dir_b);
  options.restore_at_start = true;
  ParameterShard restarted(options);
  ASSERT_TRUE(restarted.RestoreLatest().ok());
  proto::StatusResponse status = restarted.GetStatus();
  EXPECT_EQ(status.restored_step(), 3);
  EXPECT_EQ(status.version(), 3);
  ASSERT_EQ(status.tables_size(), 1);
  EXPECT_EQ(status.tables(0).rows(), rows);
  EXPECT_FALSE(status.ready());
  // The chief confirms the restored tables with the same Init.
  absl::StatusOr<bool> confirmed = InitModel(&restarted, config);
  ASSERT_TRUE(confirmed.ok()) << confirmed.status();
  EXPECT_FALSE(*confirmed);
  // What it holds is saved again byte for byte.
  ASSERT_TRUE(restarted.Save(3, 3, 5).ok());
  EXPECT_EQ(ReadBytes(CheckpointFile(dir_b, 3)), ReadBytes(*saved));

  for (int64_t v = 3; v < 6; ++v) {
    Step(&uninterrupted, v);
    Step(&restarted, v);
  }
  EXPECT_EQ(PullRows(&restarted, {0, 1, 2, 130, 500, 9}, false, 6).value(),
            PullRows(&uninterrupted, {0, 1, 2, 130, 500, 9}, false, 6).value());
  EXPECT_EQ(shard_test::PullNow(&restarted, 6)->second,
            shard_test::PullNow(&uninterrupted, 6)->second);
  ASSERT_TRUE(uninterrupted.Save(6, 6, 5).ok());
  ASSERT_TRUE(restarted.Save(6, 6, 5).ok());
  EXPECT_EQ(ReadBytes(CheckpointFile(dir_b, 6)), ReadBytes(CheckpointFile(dir_a, 6)));
}

// Saves taken while the replicas push hold one version of everything:
// each is byte for byte the checkpoint of a shard trained to its version
// alone.
TEST(ParameterShardSparseTest, ASaveDuringTrainingHoldsOneVersionOfValuesAndRows) {
  const proto::TrainingConfig config = AdagradConfig();
  const std::string dir = NewDir("during"), replay_dir = NewDir("replay");
  ParameterShard shard(CheckpointOptions(dir));
  InitWithTable(&shard, config);
  constexpr int64_t kVersions = 40;
  std::thread trainer([&] {
    for (int64_t v = 0; v < kVersions; ++v) {
      Step(&shard, v);
      absl::SleepFor(absl::Milliseconds(3));  // Spreads the versions over the saves.
    }
  });
  std::vector<int64_t> steps;
  for (int64_t step = 1000; steps.empty() || shard.GetStatus().version() < kVersions; ++step) {
    ASSERT_TRUE(shard.Save(step, -1, 1000).ok());
    steps.push_back(step);
  }
  trainer.join();
  for (int64_t step : steps) {
    absl::StatusOr<ShardState> state = ReadShardCheckpoint({dir, 0, 1}, step);
    ASSERT_TRUE(state.ok()) << state.status();
    ParameterShard replay(CheckpointOptions(replay_dir));
    InitWithTable(&replay, config);
    for (int64_t v = 0; v < state->version; ++v) Step(&replay, v);
    ASSERT_TRUE(replay.Save(step, state->version, 1).ok());
    EXPECT_EQ(ReadBytes(CheckpointFile(replay_dir, step)), ReadBytes(CheckpointFile(dir, step)))
        << "step " << step << ", version " << state->version;
  }
}

// A checkpoint of a shard without tables is written as before tables
// (format 1), and such files, old ones included, restore with no tables.
TEST(ParameterShardSparseTest, ACheckpointWithoutTablesRestoresAsBefore) {
  const std::string dir = NewDir("dense");
  {
    ParameterShard shard(CheckpointOptions(dir));
    shard_test::InitShard(&shard, Config(proto::SYNC, 1, 1));
    ASSERT_TRUE(shard_test::PushFrom(&shard, 0, 0, {1, 2, 3, 4}).ok());
    absl::StatusOr<std::string> saved = shard.Save(1, 1, 5);
    ASSERT_TRUE(saved.ok()) << saved.status();
    absl::StatusOr<SafetensorsFile> file = ReadSafetensors(*saved);
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ(file->metadata.at("format"), "psrt-shard-checkpoint-1");
    EXPECT_EQ(file->metadata.count("table_slots"), 0u);
    EXPECT_TRUE(file->integers.empty());
  }
  // A seed of the checkpoint fuzzer, written by psrt before tables: the
  // index's length (2 bytes), the index, then the file of step 7.
  const std::string seed =
      ReadBytes(std::string(PSRT_SOURCE_DIR) + "/fuzz/corpus/checkpoint/sync_momentum");
  ASSERT_GT(seed.size(), 2u);
  const size_t index_length = static_cast<unsigned char>(seed[0]) |
                              static_cast<unsigned char>(seed[1]) << 8;
  std::ofstream(CheckpointFile(dir, 7), std::ios::binary) << seed.substr(2 + index_length);

  for (int64_t step : {1, 7}) {
    SCOPED_TRACE(step);
    ParameterShard shard(CheckpointOptions(dir));
    ASSERT_TRUE(shard.Restore(step).ok());
    const proto::StatusResponse status = shard.GetStatus();
    EXPECT_EQ(status.restored_step(), step);
    EXPECT_EQ(status.tables_size(), 0);
    // Confirmed by an Init without tables; one with tables is another model.
    proto::InitHeader init;
    *init.mutable_config() = status.config();
    *init.mutable_variables() = status.variables();
    int64_t elements = 0;
    for (const auto& meta : status.variables()) {
      elements += NumElements({meta.shape().begin(), meta.shape().end()});
    }
    const std::vector<float> ignored(elements);
    *init.add_tables() = ModelWithTable(status.config()).tables(0);
    EXPECT_EQ(shard.Init(init, shard_test::Bytes(ignored).get()).status().code(),
              absl::StatusCode::kFailedPrecondition);
    init.clear_tables();
    absl::StatusOr<bool> confirmed = shard.Init(init, shard_test::Bytes(ignored).get());
    ASSERT_TRUE(confirmed.ok()) << confirmed.status();
    EXPECT_FALSE(*confirmed);
  }
}

// A checkpoint whose table data is inconsistent (re-signed, so that only
// the restore's own checks see it) or corrupt is refused with an error
// naming the table (or the file, where only its checksum can tell), and the
// restore at start falls back to the checkpoint before.
TEST(ParameterShardSparseTest, BadTableDataIsRefusedNamingTheTable) {
  const proto::TrainingConfig config = AdagradConfig();
  const std::string dir = NewDir("bad");
  std::string good;
  {
    ParameterShard shard(CheckpointOptions(dir));
    InitWithTable(&shard, config);
    Step(&shard, 0);
    ASSERT_TRUE(shard.Save(1, 1, 5).ok());
    Step(&shard, 1);
    ASSERT_TRUE(shard.Save(2, 2, 5).ok());
    good = ReadBytes(CheckpointFile(dir, 2));
  }
  // Rewrites checkpoint 2 changed by `change`, with a valid checksum.
  auto rewrite = [&](const std::function<void(SafetensorsFile*)>& change) {
    std::ofstream(CheckpointFile(dir, 2), std::ios::binary | std::ios::trunc) << good;
    absl::StatusOr<SafetensorsFile> file = ReadSafetensors(CheckpointFile(dir, 2));
    ASSERT_TRUE(file.ok()) << file.status();
    change(&*file);
    ASSERT_TRUE(WriteSafetensors(CheckpointFile(dir, 2), NamedTensorsOf(*file), file->metadata)
                    .ok());
  };
  auto find = [](SafetensorsFile* file, const std::string& name) -> Tensor* {
    for (auto& [n, tensor] : file->tensors) {
      if (n == name) return &tensor;
    }
    ADD_FAILURE() << name;
    return nullptr;
  };
  struct Case {
    std::string what;
    std::function<void(SafetensorsFile*)> change;
    std::string error;
  };
  const std::vector<Case> cases = {
      {"a row fewer of values than ids",
       [&](SafetensorsFile* file) {
         Tensor* values = find(file, "emb/values");
         Tensor fewer({values->dim(0) - 1, kDim});
         std::memcpy(fewer.data(), values->data(), fewer.num_bytes());
         *values = std::move(fewer);
       },
       "table \"emb\": tensor \"emb/values\" has shape"},
      {"a slot missing",
       [&](SafetensorsFile* file) {
         auto& tensors = file->tensors;
         tensors.erase(std::remove_if(tensors.begin(), tensors.end(),
                                      [](const auto& t) { return t.first == "emb/Adagrad"; }),
                       tensors.end());
       },
       "table \"emb\": tensor \"emb/Adagrad\" is missing"},
      {"the slots unnamed",
       [&](SafetensorsFile* file) { file->metadata["table_slots"] = ""; },
       "table \"emb\": optimizer slot \"Adagrad\" missing"},
      {"no ids",
       [&](SafetensorsFile* file) { file->integers.clear(); },
       "table \"emb\": tensor \"emb/ids\" is missing"},
      {"an id twice",
       [&](SafetensorsFile* file) {
         std::vector<uint64_t>& ids = file->integers.at(0).second.values;
         ids[1] = ids[0];
       },
       "table emb: id"},
      {"a NaN value",
       [&](SafetensorsFile* file) {
         find(file, "emb/values")->data()[3] = std::numeric_limits<float>::quiet_NaN();
       },
       "table \"emb\": tensor \"emb/values\" holds NaN"},
      {"another dimension",
       [&](SafetensorsFile* file) {
         std::string& header = file->metadata["header"];
         const size_t at = header.find("dim: 2");
         ASSERT_NE(at, std::string::npos) << header;
         header.replace(at, 6, "dim: 3");
       },
       "table \"emb\": tensor \"emb/values\" has shape"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    rewrite(c.change);
    ParameterShard shard(CheckpointOptions(dir));
    const absl::Status restored = shard.Restore(2);
    EXPECT_EQ(restored.code(), absl::StatusCode::kInvalidArgument) << restored;
    EXPECT_NE(restored.message().find(c.error), std::string::npos) << restored;
    ASSERT_TRUE(shard.RestoreLatest().ok());
    EXPECT_EQ(shard.GetStatus().restored_step(), 1);
  }
  // A flipped bit in the rows: only the checksum sees it.
  std::string flipped = good;
  flipped[flipped.size() - 5] ^= 1;
  std::ofstream(CheckpointFile(dir, 2), std::ios::binary | std::ios::trunc) << flipped;
  ParameterShard shard(CheckpointOptions(dir));
  const absl::Status corrupt = shard.Restore(2);
  EXPECT_EQ(corrupt.code(), absl::StatusCode::kDataLoss) << corrupt;
  EXPECT_NE(corrupt.message().find(CheckpointFile(dir, 2)), std::string::npos) << corrupt;
  // And a truncated one.
  std::ofstream(CheckpointFile(dir, 2), std::ios::binary | std::ios::trunc)
      << good.substr(0, good.size() - 8);
  EXPECT_EQ(shard.Restore(2).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(shard.RestoreLatest().ok());
  EXPECT_EQ(shard.GetStatus().restored_step(), 1);
  EXPECT_EQ(shard.GetStatus().tables(0).name(), "emb");
}

}  // namespace
}  // namespace psrt
