// ReadShardCheckpoint against checkpoints whose own metadata is wrong (the
// format and the happy path are covered by the integration checkpoint test
// and export_checkpoint_test).
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "common/byte_source.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "ps/checkpoint.h"
#include "ps/parameter_shard.h"

namespace psrt {
namespace {

ShardCheckpointId NewCheckpointDir(const std::string& name) {
  ShardCheckpointId id;
  id.dir = testing::TempDir() + "/shard_checkpoint_" + name;
  std::filesystem::remove_all(id.dir);
  std::filesystem::create_directories(id.dir);
  return id;
}

// The model of the checkpoints below: one variable "w" of shape [2], SGD,
// sync, one replica.
proto::InitHeader Model() {
  proto::InitHeader model;
  proto::TrainingConfig& config = *model.mutable_config();
  config.set_mode(proto::SYNC);
  config.set_num_replicas(1);
  config.set_replicas_to_aggregate(1);
  config.set_optimizer(proto::SGD);
  config.set_learning_rate(0.1f);
  proto::VariableMeta& meta = *model.add_variables();
  meta.set_name("w");
  meta.set_dtype(proto::DT_FLOAT);
  meta.add_shape(2);
  return model;
}

// Writes checkpoint `step` of `model` (Model() by default), keeping the
// `keep` latest; with `slots` of the model's optimizer.
std::string WriteCheckpoint(
    const ShardCheckpointId& id, int64_t step, int keep = 5,
    const proto::InitHeader& model = Model(),
    const std::vector<std::pair<std::string, const float*>>& slots = {}) {
  const std::vector<float> values = {1, 2};
  ShardStateView view;
  view.config = model.config();
  view.slots = slots;
  view.variables = {model.variables(0)};
  view.version = step;
  view.num_elements = 2;
  view.values = values.data();
  absl::StatusOr<std::string> path = WriteShardCheckpoint(id, step, view, keep);
  EXPECT_TRUE(path.ok()) << path.status();
  return path.value_or("");
}

// Rewrites a checkpoint's variable list (its "header" metadata), keeping the
// file otherwise intact and its checksum valid.
void ReplaceInHeader(const std::string& path, const std::string& from,
                     const std::string& to) {
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  std::string& header = file->metadata["header"];
  ASSERT_NE(header.find(from), std::string::npos) << header;
  header = absl::StrReplaceAll(header, {{from, to}});
  ASSERT_TRUE(WriteSafetensors(path, NamedTensorsOf(*file), file->metadata).ok());
}

// Found by fuzz/checkpoint_fuzzer.cc: a negative dimension in the header
// crashed psrt_ps (a failed CHECK sizing the values) instead of being
// refused, so the restore at start could not fall back to an older
// checkpoint.
TEST(ShardCheckpointTest, RefusesANegativeDimensionAndRestoresTheOlderOne) {
  const ShardCheckpointId id = NewCheckpointDir("negative");
  WriteCheckpoint(id, 1);
  ReplaceInHeader(WriteCheckpoint(id, 2), "shape: 2", "shape: -2");

  absl::StatusOr<ShardState> state = ReadShardCheckpoint(id, 2);
  EXPECT_EQ(state.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(state.status().message().find("variable \"w\""), absl::string_view::npos)
      << state.status();

  ParameterShard::Options options;
  options.threads = 1;
  options.checkpoint_dir = id.dir;
  ParameterShard shard(options);
  ASSERT_TRUE(shard.RestoreLatest().ok());
  EXPECT_EQ(shard.GetStatus().restored_step(), 1);
}

// A shard of a model with fewer slices than shards holds nothing: it is
// initialized empty, takes every replica's empty push and moves its version
// with the others, and saves and restores its (empty) state.
TEST(ShardCheckpointTest, AShardHoldingNoVariablesTrainsSavesAndRestores) {
  const ShardCheckpointId id = NewCheckpointDir("empty");
  ParameterShard::Options options;
  options.threads = 1;
  options.checkpoint_dir = id.dir;
  proto::InitHeader empty = Model();
  empty.clear_variables();
  empty.mutable_config()->set_num_replicas(2);
  empty.mutable_config()->set_replicas_to_aggregate(2);
  {
    ParameterShard shard(options);
    ASSERT_TRUE(shard.RestoreLatest().ok());
    SpanByteSource no_values(absl::Span<const char>{});
    absl::StatusOr<bool> initialized = shard.Init(empty, &no_values);
    ASSERT_TRUE(initialized.ok()) << initialized.status();
    EXPECT_TRUE(*initialized);
    for (int replica = 0; replica < 2; ++replica) {
      proto::PushHeader push;
      push.set_replica(replica);
      push.set_version(0);
      SpanByteSource no_bytes(absl::Span<const char>{});
      absl::StatusOr<proto::PushResponse> pushed = shard.Push(push, &no_bytes);
      ASSERT_TRUE(pushed.ok()) << pushed.status();
      EXPECT_EQ(pushed->version(), replica);  // The second completes version 1.
    }
    EXPECT_EQ(shard.GetStatus().version(), 1);
    // A push that carries a tensor to a shard that holds none is refused.
    proto::PushHeader stray;
    stray.set_replica(0);
    stray.set_version(1);
    *stray.add_variables() = Model().variables(0);
    const std::vector<float> two = {1, 2};
    SpanByteSource bytes({reinterpret_cast<const char*>(two.data()), sizeof(float) * 2});
    EXPECT_EQ(shard.Push(stray, &bytes).status().code(), absl::StatusCode::kInvalidArgument);
    ASSERT_TRUE(shard.Save(1, -1, 5).ok());
  }
  ParameterShard again(options);
  ASSERT_TRUE(again.RestoreLatest().ok());
  const proto::StatusResponse status = again.GetStatus();
  EXPECT_EQ(status.restored_step(), 1);
  EXPECT_EQ(status.version(), 1);
  EXPECT_EQ(status.variables_size(), 0);
}

// A job resumed with another number of shards (ps tasks x stripes) is
// told so, naming a file it found, instead of starting afresh beside the
// checkpoints it was meant to resume from; a shard count that has files of
// its own restores them as ever.
TEST(ShardCheckpointTest, CheckpointsOfAnotherShardCountAreNamed) {
  ShardCheckpointId id = NewCheckpointDir("other_count");
  id.shard = 1;
  id.num_shards = 4;
  WriteCheckpoint(id, 7);
  ParameterShard::Options options;
  options.threads = 1;
  options.checkpoint_dir = id.dir;
  options.shard = 0;
  options.num_shards = 6;
  ParameterShard six(options);
  const absl::Status status = six.RestoreLatest();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("model.ckpt-7.ps-1-of-4.safetensors"), std::string::npos)
      << status;
  EXPECT_NE(status.message().find("this job has 6"), std::string::npos) << status;

  options.shard = 1;
  options.num_shards = 4;
  ParameterShard four(options);
  ASSERT_TRUE(four.RestoreLatest().ok());
  EXPECT_EQ(four.GetStatus().restored_step(), 7);
  // No checkpoint at all: a fresh start.
  options.checkpoint_dir = NewCheckpointDir("other_count_empty").dir;
  ParameterShard fresh(options);
  EXPECT_TRUE(fresh.RestoreLatest().ok());
}

// A huge variable whose tensor is not in the file is refused before
// anything is allocated for it.
TEST(ShardCheckpointTest, RefusesAHugeVariableWithoutAllocatingIt) {
  const ShardCheckpointId id = NewCheckpointDir("huge");
  ReplaceInHeader(WriteCheckpoint(id, 3), "shape: 2", "shape: 549755813888");  // 2^39.
  absl::StatusOr<ShardState> state = ReadShardCheckpoint(id, 3);
  EXPECT_EQ(state.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(state.status().message().find("missing or has the wrong shape"),
            absl::string_view::npos)
      << state.status();
}

// After a rollback (training resumed from 20 while 40 exists), retention
// goes by save order: the checkpoint just written is kept, the abandoned
// newer step is pruned first.
TEST(ShardCheckpointTest, RetentionAfterARollbackKeepsTheNewSaves) {
  const ShardCheckpointId id = NewCheckpointDir("rollback");
  for (int64_t step : {10, 20, 40}) WriteCheckpoint(id, step, /*keep=*/2);
  EXPECT_EQ(ListShardCheckpoints(id), (std::vector<int64_t>{40, 20}));
  WriteCheckpoint(id, 30, /*keep=*/2);  // Rolled back to 20, trained on.
  EXPECT_EQ(ListShardCheckpoints(id), (std::vector<int64_t>{40, 30}));
  WriteCheckpoint(id, 35, /*keep=*/2);
  EXPECT_EQ(ListShardCheckpoints(id), (std::vector<int64_t>{35, 30}));
  // keep=1 used to delete the file it had just written, and say OK.
  WriteCheckpoint(id, 50, /*keep=*/1);
  WriteCheckpoint(id, 45, /*keep=*/1);
  EXPECT_EQ(ListShardCheckpoints(id), (std::vector<int64_t>{45}));
  EXPECT_TRUE(ReadShardCheckpoint(id, 45).ok());
}

// Files the index misses (a lost index) are listed, each step once even
// where two names parse to it.
TEST(ShardCheckpointTest, ListsFilesTheIndexMissesEachStepOnce) {
  const ShardCheckpointId id = NewCheckpointDir("unindexed");
  for (int64_t step : {3, 7}) WriteCheckpoint(id, step);
  ASSERT_TRUE(std::filesystem::remove(id.dir + "/checkpoint.ps-0-of-1"));
  std::filesystem::copy_file(id.dir + "/model.ckpt-7.ps-0-of-1.safetensors",
                             id.dir + "/model.ckpt-07.ps-0-of-1.safetensors");
  EXPECT_EQ(ListShardCheckpoints(id), (std::vector<int64_t>{7, 3}));
}

// A checkpoint whose checksum was stripped (here: its key renamed, the
// header's length kept) cannot be verified, so it is not restored.
TEST(ShardCheckpointTest, RefusesAFileWithoutAChecksum) {
  const ShardCheckpointId id = NewCheckpointDir("no_checksum");
  const std::string path = WriteCheckpoint(id, 3);
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t key = bytes.find("\"psrt_crc32\"");
  ASSERT_NE(key, std::string::npos);
  bytes.replace(key, 12, "\"psrt_crcXX\"");
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  absl::StatusOr<ShardState> state = ReadShardCheckpoint(id, 3);
  EXPECT_EQ(state.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(state.status().message().find("carries no checksum"), absl::string_view::npos)
      << state.status();
}

// Found by fuzz/checkpoint_fuzzer.cc: a file whose metadata holds another
// step than its name was restored, and the shard then reported that step.
TEST(ShardCheckpointTest, RefusesAFileWhoseStepIsNotItsName) {
  const ShardCheckpointId id = NewCheckpointDir("renamed");
  const std::string path = WriteCheckpoint(id, 4);
  const std::string renamed = id.dir + "/model.ckpt-5.ps-0-of-1.safetensors";
  std::filesystem::rename(path, renamed);
  absl::StatusOr<ShardState> state = ReadShardCheckpoint(id, 5);
  EXPECT_EQ(state.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(state.status().message().find("holds step 4, not 5"), absl::string_view::npos)
      << state.status();
  EXPECT_TRUE(ReadShardCheckpoint(id, 4).status().code() == absl::StatusCode::kNotFound);
}

// Found by fuzz/checkpoint_fuzzer.cc: a variable of another dtype than
// float was restored, and the chief could then not confirm the state.
TEST(ShardCheckpointTest, RefusesAVariableThatIsNotFloat) {
  const ShardCheckpointId id = NewCheckpointDir("dtype");
  ReplaceInHeader(WriteCheckpoint(id, 6), "dtype: DT_FLOAT", "dtype: DT_INVALID");
  absl::StatusOr<ShardState> state = ReadShardCheckpoint(id, 6);
  EXPECT_EQ(state.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(state.status().message().find("\"w\" has dtype DT_INVALID"),
            absl::string_view::npos)
      << state.status();
}

// Issue 11's hang: the chief's Restore(40) reached ps/1 after the chief had
// given up on checkpoint 40 (ps/0 found it corrupt), restored 20 everywhere
// and confirmed it; ps/1 then sat at 40, not ready, and the job waited for
// good. A request of an abandoned recovery round must change nothing.
TEST(ShardCheckpointTest, ALateRestoreOfAnAbandonedRecoveryRoundIsRefused) {
  const ShardCheckpointId id = NewCheckpointDir("late_restore");
  WriteCheckpoint(id, 20);
  WriteCheckpoint(id, 40);
  ParameterShard::Options options;
  options.threads = 1;
  options.checkpoint_dir = id.dir;
  ParameterShard shard(options);

  // Round 2 (round 1 tried checkpoint 40 and failed elsewhere): restore 20
  // and confirm it.
  ASSERT_TRUE(shard.Restore(20, /*recovery_epoch=*/2).ok());
  proto::InitHeader confirm = Model();
  confirm.set_recovery_epoch(2);
  const std::vector<float> unused = {0, 0};
  SpanByteSource data({reinterpret_cast<const char*>(unused.data()), 8});
  ASSERT_TRUE(shard.Init(confirm, &data).ok());
  ASSERT_TRUE(shard.GetStatus().ready());
  const int64_t incarnation = shard.incarnation();

  // Round 1's Restore(40) lands now.
  const absl::Status late = shard.Restore(40, /*recovery_epoch=*/1);
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  EXPECT_NE(late.message().find("recovery round 1 refused"), absl::string_view::npos) << late;
  EXPECT_NE(late.message().find("taken round 2"), absl::string_view::npos) << late;
  proto::StatusResponse status = shard.GetStatus();
  EXPECT_TRUE(status.ready());
  EXPECT_EQ(status.restored_step(), 20);
  EXPECT_EQ(status.version(), 20);
  EXPECT_EQ(status.recovery_epoch(), 2);
  EXPECT_EQ(shard.incarnation(), incarnation);
  // So does a late confirmation of round 1.
  confirm.set_recovery_epoch(1);
  EXPECT_EQ(shard.Init(confirm, &data).status().code(), absl::StatusCode::kFailedPrecondition);

  // A newer round goes through.
  ASSERT_TRUE(shard.Restore(40, /*recovery_epoch=*/3).ok());
  status = shard.GetStatus();
  EXPECT_EQ(status.restored_step(), 40);
  EXPECT_FALSE(status.ready());
  EXPECT_EQ(status.recovery_epoch(), 3);
}

// A job resumed from its checkpoint with other flags trains with them: the
// restored state takes the chief's learning rate and number of workers and
// keeps its optimizer's slots; another optimizer is refused, naming both,
// and so is any change once the state trains.
TEST(ShardCheckpointTest, ARestoredStateTakesTheChiefsNewFlagsButNotAnotherOptimizer) {
  const ShardCheckpointId id = NewCheckpointDir("new_flags");
  proto::InitHeader momentum = Model();
  momentum.mutable_config()->set_optimizer(proto::MOMENTUM);
  momentum.mutable_config()->set_momentum(0.9f);
  const std::vector<float> accumulator = {5, 7};
  WriteCheckpoint(id, 20, 5, momentum, {{"Momentum", accumulator.data()}});
  ParameterShard::Options options;
  options.threads = 1;
  options.checkpoint_dir = id.dir;
  const std::vector<float> unused = {0, 0};
  SpanByteSource data({reinterpret_cast<const char*>(unused.data()), 8});

  ParameterShard refusing(options);
  ASSERT_TRUE(refusing.Restore(20).ok());
  proto::InitHeader adam = momentum;
  adam.mutable_config()->set_optimizer(proto::ADAM);
  adam.mutable_config()->set_beta1(0.9f);
  adam.mutable_config()->set_beta2(0.999f);
  adam.mutable_config()->set_epsilon(1e-8f);
  const absl::Status refused = refusing.Init(adam, &data).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("trained with --optimizer=momentum, the chief asks for adam"),
            absl::string_view::npos)
      << refused;
  EXPECT_EQ(refusing.GetStatus().config().optimizer(), proto::MOMENTUM);
  EXPECT_FALSE(refusing.GetStatus().ready());

  ParameterShard shard(options);
  ASSERT_TRUE(shard.Restore(20).ok());
  proto::InitHeader resumed = momentum;
  resumed.mutable_config()->set_learning_rate(0.05f);
  resumed.mutable_config()->set_num_replicas(2);
  resumed.mutable_config()->set_replicas_to_aggregate(2);
  ASSERT_TRUE(shard.Init(resumed, &data).ok());
  const proto::StatusResponse status = shard.GetStatus();
  EXPECT_TRUE(status.ready());
  EXPECT_FLOAT_EQ(status.config().learning_rate(), 0.05f);
  EXPECT_EQ(status.config().num_replicas(), 2);
  absl::StatusOr<std::string> saved = shard.Save(30, 20, 5);
  ASSERT_TRUE(saved.ok()) << saved.status();
  absl::StatusOr<ShardState> state = ReadShardCheckpoint(id, 30);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_FLOAT_EQ(state->config.learning_rate(), 0.05f);
  EXPECT_EQ(state->config.replicas_to_aggregate(), 2);
  ASSERT_EQ(state->slots.size(), 1u);
  EXPECT_EQ(state->slots[0].first, "Momentum");
  EXPECT_EQ(state->slots[0].second.data()[0], 5);
  EXPECT_EQ(state->slots[0].second.data()[1], 7);

  // Training now: the flags are the job's until it restarts.
  proto::InitHeader changed = resumed;
  changed.mutable_config()->set_learning_rate(0.2f);
  const absl::Status live = shard.Init(changed, &data).status();
  EXPECT_EQ(live.code(), absl::StatusCode::kFailedPrecondition) << live;
  EXPECT_NE(live.message().find("learning_rate: 0.05 -> 0.2"), absl::string_view::npos) << live;
  EXPECT_TRUE(shard.Init(resumed, &data).ok());
}

}  // namespace
}  // namespace psrt
