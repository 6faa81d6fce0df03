// ReadCheckpointForShard and ListRestorableCheckpoints: a checkpoint of K
// shards restored onto K' (ps/checkpoint.h, "Resharding"). The end-to-end
// test, real ps tasks resuming 2 -> 3 -> 1 exactly, is in
// tests/integration/ctr_test.cc.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/byte_source.h"
#include "common/placement.h"
#include "common/safetensors.h"
#include "common/splitmix.h"
#include "common/training_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps/checkpoint.h"
#include "ps/embedding_table.h"
#include "ps/parameter_shard.h"

namespace psrt {
namespace {

constexpr int kDim = 2;
constexpr int kIds = 300;

std::string NewDir(const std::string& name) {
  const std::string dir = testing::TempDir() + "/checkpoint_reshard_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// A ps shard of `num_shards` that restores from `dir`.
ParameterShard::Options ShardOf(const std::string& dir, int shard, int num_shards) {
  ParameterShard::Options options;
  options.threads = 1;
  options.checkpoint_dir = dir;
  options.shard = shard;
  options.num_shards = num_shards;
  return options;
}

// The model: "w" [6, 2] (cut into parts by a 16-byte threshold), "b" [3]
// (cut too), "s" [1] (whole), and table "emb" of kIds rows; Adagrad, so a
// slot beside every value and row, and moving averages.
struct Model {
  proto::TrainingConfig config;
  proto::ModelLayout layout;
  std::vector<VariableDef> variables = {{"w", {6, 2}}, {"b", {3}}, {"s", {1}}};
  proto::TableMeta table;

  Model() {
    config.set_mode(proto::SYNC);
    config.set_num_replicas(1);
    config.set_replicas_to_aggregate(1);
    config.set_optimizer(proto::ADAGRAD);
    config.set_learning_rate(0.1f);
    config.set_moving_average_decay(0.9f);
    config.set_run_id("run-a");
    SetOptimizerDefaults(&config);
    for (const VariableDef& v : variables) {
      proto::VariableMeta& meta = *layout.add_variables();
      meta.set_name(v.name);
      meta.set_dtype(proto::DT_FLOAT);
      for (int64_t d : v.shape) meta.add_shape(d);
    }
    layout.set_placement("round_robin");
    layout.set_partition_threshold_bytes(16);
    table.set_name("emb");
    table.set_dim(kDim);
    table.set_seed(7);
  }

  Placement Placed(int shards) const {
    PlacementOptions options;
    options.partition_threshold_bytes = 16;
    absl::StatusOr<Placement> placement = ComputePlacement(variables, shards, options);
    EXPECT_TRUE(placement.ok()) << placement.status();
    return *placement;
  }
};

// Element e of variable v, its slot and its average: distinct numbers.
float Value(int v, int64_t e) { return 100.0f * v + e; }
float Slot(int v, int64_t e) { return 0.5f + Value(v, e); }
float Average(int v, int64_t e) { return -Value(v, e); }
// Row `id`: values id, id + 0.25; slot id + 1000, id + 1000.25.
uint64_t IdOf(int i) { return uint64_t{0x9e3779b97f4a7c15} * (i + 1); }

// Writes checkpoint `step` of Model() as `shards` shards would save it;
// `by_residue`: as psrt's format 2 did, the rows split by residues of the
// hash and no layout.
void WriteShards(const Model& model, const std::string& dir, int shards, int64_t step,
                 bool with_layout = true, bool by_residue = false) {
  const Placement placement = model.Placed(shards);
  for (int k = 0; k < shards; ++k) {
    std::vector<float> values, slot, average;
    ShardStateView view;
    view.config = model.config;
    if (with_layout) view.layout = model.layout;
    view.version = step + k;  // As async shards' may differ.
    for (int s : placement.shard_slices[k]) {
      const VariableSlice& slice = placement.slices[s];
      proto::VariableMeta& meta = view.variables.emplace_back();
      meta.set_name(slice.name);
      meta.set_dtype(proto::DT_FLOAT);
      for (int64_t d : slice.shape) meta.add_shape(d);
      for (int64_t e = slice.byte_offset / 4; e < (slice.byte_offset + slice.num_bytes) / 4; ++e) {
        values.push_back(Value(slice.variable, e));
        slot.push_back(Slot(slice.variable, e));
        average.push_back(Average(slice.variable, e));
      }
    }
    view.num_elements = static_cast<int64_t>(values.size());
    view.values = values.data();
    view.slots = {{"Adagrad", slot.data()}};
    view.average = average.data();
    absl::StatusOr<std::unique_ptr<EmbeddingTable>> table =
        EmbeddingTable::Create("emb", kDim, 7, model.config);
    ASSERT_TRUE(table.ok()) << table.status();
    for (int i = 0; i < kIds; ++i) {
      const uint64_t id = IdOf(i);
      const int owner = by_residue ? static_cast<int>(SplitMix64(id) % shards)
                                   : TableShardOf(id, shards);
      if (owner != k) continue;
      const float row[] = {float(i), i + 0.25f, i + 1000.0f, i + 1000.25f};
      ASSERT_TRUE((*table)->Insert(id, row).ok());
    }
    view.tables.push_back({model.table, table->get()});
    absl::StatusOr<std::string> path = WriteShardCheckpoint({dir, k, shards}, step, view, 5);
    ASSERT_TRUE(path.ok()) << path.status();
  }
}

// `state` holds shard k's slices of `placement`, element for element, with
// their slots and averages.
void ExpectSlicesOf(const ShardState& state, const Placement& placement, int k) {
  ASSERT_EQ(state.variables.size(), placement.shard_slices[k].size());
  ASSERT_EQ(state.slots.size(), 1u);
  ASSERT_EQ(state.average.num_elements(), state.values.num_elements());
  int64_t offset = 0;
  for (size_t i = 0; i < state.variables.size(); ++i) {
    const VariableSlice& slice = placement.slices[placement.shard_slices[k][i]];
    EXPECT_EQ(state.variables[i].name(), slice.name);
    for (int64_t e = slice.byte_offset / 4; e < (slice.byte_offset + slice.num_bytes) / 4;
         ++e, ++offset) {
      ASSERT_EQ(state.values.data()[offset], Value(slice.variable, e)) << slice.name;
      ASSERT_EQ(state.slots[0].second.data()[offset], Slot(slice.variable, e));
      ASSERT_EQ(state.average.data()[offset], Average(slice.variable, e));
    }
  }
  EXPECT_EQ(offset, state.values.num_elements());
}

// Each new shard holds its slices of every variable, element for element,
// and the rows whose ids hash into its range, with their slots.
TEST(CheckpointReshardTest, EveryShardOfAnotherCountGetsItsSlicesAndRows) {
  const Model model;
  const std::string dir = NewDir("counts");
  WriteShards(model, dir, 2, 40);
  for (int to : {1, 3, 5}) {
    SCOPED_TRACE(absl::StrCat("2 -> ", to, " shards"));
    const Placement placement = model.Placed(to);
    std::map<uint64_t, int> index;  // Id -> i.
    for (int i = 0; i < kIds; ++i) index[IdOf(i)] = i;
    int rows = 0;
    for (int k = 0; k < to; ++k) {
      EXPECT_EQ(ListRestorableCheckpoints({dir, k, to}), std::vector<int64_t>{40});
      absl::StatusOr<ShardState> state = ReadCheckpointForShard({dir, k, to}, 40);
      ASSERT_TRUE(state.ok()) << state.status();
      EXPECT_EQ(state->resharded_from, 2);
      EXPECT_EQ(state->step, 40);
      // The newest version of the files read (sync shards have one): those
      // of both old shards when all is read.
      if (to == 1) EXPECT_EQ(state->version, 41);
      EXPECT_TRUE(state->version == 40 || state->version == 41) << state->version;
      EXPECT_EQ(state->config.run_id(), "run-a");
      EXPECT_EQ(state->layout.SerializeAsString(), model.layout.SerializeAsString());
      ExpectSlicesOf(*state, placement, k);
      ASSERT_EQ(state->tables.size(), 1u);
      const ShardState::Table& table = state->tables[0];
      for (size_t r = 0; r < table.ids.size(); ++r) {
        const uint64_t id = table.ids[r];
        EXPECT_EQ(TableShardOf(id, to), k);
        ASSERT_EQ(index.count(id), 1u) << id;
        const int i = index.at(id);
        EXPECT_EQ(table.values.data()[r * kDim], float(i));
        EXPECT_EQ(table.values.data()[r * kDim + 1], i + 0.25f);
        EXPECT_EQ(table.slots[0].second.data()[r * kDim + 1], i + 1000.25f);
        ++rows;
      }
    }
    EXPECT_EQ(rows, kIds);
  }
}

// A shard restores resharded state at start, and names it in its status
// (so that the chief sees the step), and its own files win once it has some.
TEST(CheckpointReshardTest, AShardRestoresAnotherCountsCheckpointAtStart) {
  const Model model;
  const std::string dir = NewDir("at_start");
  WriteShards(model, dir, 2, 40);
  const ParameterShard::Options options = ShardOf(dir, 1, 3);
  {
    ParameterShard shard(options);
    ASSERT_TRUE(shard.RestoreLatest().ok());
    const proto::StatusResponse status = shard.GetStatus();
    EXPECT_TRUE(status.initialized());
    EXPECT_EQ(status.restored_step(), 40);
    EXPECT_EQ(status.version(), 41);
    EXPECT_EQ(std::vector<int64_t>(status.checkpoint_steps().begin(),
                                   status.checkpoint_steps().end()),
              std::vector<int64_t>{40});
    // Its next save is a file of its own count, with the layout in it.
    absl::StatusOr<std::string> saved = shard.Save(40, -1, 5);
    EXPECT_EQ(saved.status().code(), absl::StatusCode::kAborted);  // Not confirmed yet.
    proto::InitHeader confirm;
    *confirm.mutable_config() = model.config;
    for (const auto& v : status.variables()) *confirm.add_variables() = v;
    *confirm.add_tables() = model.table;
    *confirm.mutable_layout() = model.layout;
    // The chief sends its initial values; a restored shard keeps its own.
    int64_t elements = 0;
    for (const auto& v : status.variables()) {
      int64_t n = 1;
      for (int64_t d : v.shape()) n *= d;
      elements += n;
    }
    const std::vector<float> initial(elements, 0.0f);
    SpanByteSource data({reinterpret_cast<const char*>(initial.data()),
                         initial.size() * sizeof(float)});
    absl::StatusOr<bool> initialized = shard.Init(confirm, &data);
    ASSERT_TRUE(initialized.ok()) << initialized.status();
    EXPECT_FALSE(*initialized);
    saved = shard.Save(41, -1, 5);
    ASSERT_TRUE(saved.ok()) << saved.status();
    absl::StatusOr<ShardState> own = ReadShardCheckpoint({dir, 1, 3}, 41);
    ASSERT_TRUE(own.ok()) << own.status();
    EXPECT_EQ(own->layout.SerializeAsString(), model.layout.SerializeAsString());
  }
  ParameterShard again(options);
  ASSERT_TRUE(again.RestoreLatest().ok());
  EXPECT_EQ(again.GetStatus().restored_step(), 41);
}

// A job resumed with another placement: each shard's part is cut anew as
// the chief's layout places it, from the files of the count that saved
// the checkpoint, whether that is the shard's own or another; a layout of
// another model is refused.
TEST(CheckpointReshardTest, ACheckpointIsCutAnewForAnotherPlacement) {
  const Model model;  // Saved round robin, parts of 16 bytes.
  const std::string dir = NewDir("recut");
  WriteShards(model, dir, 2, 40);
  proto::ModelLayout contiguous = model.layout;
  contiguous.set_placement("contiguous");
  contiguous.set_partition_threshold_bytes(8);
  std::vector<VariableDef> variables = model.variables;
  PlacementOptions options;
  options.strategy = PlacementStrategy::kContiguous;
  options.partition_threshold_bytes = 8;
  for (int to : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("2 -> ", to, " shards"));
    absl::StatusOr<Placement> placement = ComputePlacement(variables, to, options);
    ASSERT_TRUE(placement.ok()) << placement.status();
    int64_t elements = 0;
    for (int k = 0; k < to; ++k) {
      absl::StatusOr<ShardState> state = ReadCheckpointForShard({dir, k, to}, 40, &contiguous);
      ASSERT_TRUE(state.ok()) << state.status();
      EXPECT_EQ(state->resharded_from, to == 2 ? 0 : 2);
      EXPECT_EQ(state->layout.SerializeAsString(), contiguous.SerializeAsString());
      ExpectSlicesOf(*state, *placement, k);
      elements += state->values.num_elements();
    }
    EXPECT_EQ(elements, 6 * 2 + 3 + 1);
  }
  proto::ModelLayout other = contiguous;
  other.mutable_variables(0)->set_shape(0, 5);
  const absl::Status refused = ReadCheckpointForShard({dir, 0, 2}, 40, &other).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("another model than the chief's"), std::string::npos)
      << refused;

  // A ps shard restores the files' slices at start, and the chief's Init
  // with the other layout cuts them anew; its next save records that
  // layout. Once confirmed, another placement is refused (a state being
  // trained cannot change its slices on one shard alone).
  ParameterShard shard(ShardOf(dir, 0, 2));
  ASSERT_TRUE(shard.RestoreLatest().ok());
  absl::StatusOr<Placement> placement = ComputePlacement(variables, 2, options);
  ASSERT_TRUE(placement.ok()) << placement.status();
  // The chief's Init of shard 0 as `layout` places it (initial values 0),
  // of recovery round `epoch`.
  auto init = [&](const proto::ModelLayout& layout, const Placement& placed, int64_t epoch = 2) {
    proto::InitHeader header;
    *header.mutable_config() = model.config;
    *header.add_tables() = model.table;
    *header.mutable_layout() = layout;
    header.set_recovery_epoch(epoch);
    int64_t elements = 0;
    for (int s : placed.shard_slices[0]) {
      const VariableSlice& slice = placed.slices[s];
      proto::VariableMeta& meta = *header.add_variables();
      meta.set_name(slice.name);
      meta.set_dtype(proto::DT_FLOAT);
      for (int64_t d : slice.shape) meta.add_shape(d);
      elements += NumElements(slice.shape);
    }
    const std::vector<float> initial(elements, 0.0f);
    SpanByteSource data({reinterpret_cast<const char*>(initial.data()),
                         initial.size() * sizeof(float)});
    return shard.Init(header, &data);
  };
  // The chief's round 2 restores the checkpoint; an Init of an older round,
  // refused, cuts nothing.
  ASSERT_TRUE(shard.Restore(40, /*recovery_epoch=*/2).ok());
  const int64_t restored = shard.GetStatus().incarnation();
  EXPECT_EQ(init(contiguous, *placement, /*epoch=*/1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard.GetStatus().incarnation(), restored);
  absl::StatusOr<bool> initialized = init(contiguous, *placement);
  ASSERT_TRUE(initialized.ok()) << initialized.status();
  EXPECT_NE(shard.GetStatus().incarnation(), restored);
  EXPECT_FALSE(*initialized);  // The checkpoint's values, not the chief's zeros.
  ASSERT_TRUE(shard.Save(41, -1, 5).ok());
  absl::StatusOr<ShardState> saved = ReadShardCheckpoint({dir, 0, 2}, 41);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->layout.SerializeAsString(), contiguous.SerializeAsString());
  ExpectSlicesOf(*saved, *placement, 0);
  EXPECT_EQ(init(model.layout, model.Placed(2)).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// A shard that cannot cut its checkpoint anew (another shard's file is not
// in its directory) refuses the chief's Init, saying what to do, and keeps
// the state it restored.
TEST(CheckpointReshardTest, ACutThatLacksAFileIsRefusedNamingTheWayOut) {
  const Model model;
  const std::string dir = NewDir("recut_missing");
  WriteShards(model, dir, 2, 40);
  // Shard 1 restores its own file; placed contiguously it would hold "b",
  // which shard 0's file holds.
  std::filesystem::remove(dir + "/model.ckpt-40.ps-0-of-2.safetensors");
  ParameterShard shard(ShardOf(dir, 1, 2));
  ASSERT_TRUE(shard.RestoreLatest().ok());
  const proto::StatusResponse restored = shard.GetStatus();
  ASSERT_EQ(restored.restored_step(), 40);
  proto::InitHeader init;
  *init.mutable_config() = model.config;
  *init.add_tables() = model.table;
  *init.mutable_layout() = model.layout;
  init.mutable_layout()->set_placement("contiguous");
  const std::vector<float> none;
  SpanByteSource data({reinterpret_cast<const char*>(none.data()), 0});
  const absl::Status refused = shard.Init(init, &data).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kNotFound) << refused;
  EXPECT_THAT(std::string(refused.message()),
              ::testing::AllOf(::testing::HasSubstr("ps-0-of-2"),
                               ::testing::HasSubstr("one directory that holds every shard's"),
                               ::testing::HasSubstr("--placement=round_robin "
                                                    "--partition_threshold_bytes=16")));
  EXPECT_EQ(shard.GetStatus().incarnation(), restored.incarnation());
  EXPECT_FALSE(shard.GetStatus().ready());
}

TEST(CheckpointReshardTest, ACheckpointWithoutALayoutRestoresOntoItsOwnCountOnly) {
  const Model model;
  const std::string dir = NewDir("no_layout");
  WriteShards(model, dir, 2, 40, /*with_layout=*/false);
  EXPECT_TRUE(ReadCheckpointForShard({dir, 1, 2}, 40).ok());
  absl::StatusOr<ShardState> state = ReadCheckpointForShard({dir, 0, 3}, 40);
  EXPECT_EQ(state.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(state.status().message().find("records no model layout"), std::string::npos)
      << state.status();
  EXPECT_NE(state.status().message().find("ps-0-of-2"), std::string::npos) << state.status();
  // A ps of the new count stops, saying why, rather than start afresh.
  ParameterShard shard(ShardOf(dir, 0, 3));
  const absl::Status restored = shard.RestoreLatest();
  EXPECT_EQ(restored.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(restored.message().find("records no model layout"), std::string::npos) << restored;
}

TEST(CheckpointReshardTest, FilesOfDifferentRunsAreNotMixed) {
  Model model;
  const std::string dir = NewDir("two_runs");
  WriteShards(model, dir, 2, 40);
  const std::string other = NewDir("two_runs_other");
  model.config.set_run_id("run-b");
  WriteShards(model, other, 2, 40);
  std::filesystem::copy_file(other + "/model.ckpt-40.ps-1-of-2.safetensors",
                             dir + "/model.ckpt-40.ps-1-of-2.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  absl::StatusOr<ShardState> state = ReadCheckpointForShard({dir, 0, 1}, 40);
  EXPECT_EQ(state.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(state.status().message().find("run-b"), std::string::npos) << state.status();
}

TEST(CheckpointReshardTest, ACheckpointMissingAFileIsNotRestorableOntoAnotherCount) {
  const Model model;
  const std::string dir = NewDir("missing");
  WriteShards(model, dir, 2, 40);
  std::filesystem::remove(dir + "/model.ckpt-40.ps-1-of-2.safetensors");
  EXPECT_TRUE(ListRestorableCheckpoints({dir, 0, 3}).empty());
  EXPECT_EQ(ReadCheckpointForShard({dir, 0, 3}, 40).status().code(), absl::StatusCode::kNotFound);
}

// Format 2 split the rows by residues of the hash and recorded no layout:
// restored onto its own count, a shard gathers the rows the ranges give it
// from every shard's file; onto another count, it is refused as a
// checkpoint without a layout.
TEST(CheckpointReshardTest, TablesOfTheOlderHashAreGatheredFromEveryFile) {
  const Model model;
  const std::string dir = NewDir("format2");
  WriteShards(model, dir, 2, 40, /*with_layout=*/false, /*by_residue=*/true);
  for (int k = 0; k < 2; ++k) {
    const std::string path = absl::StrCat(dir, "/model.ckpt-40.ps-", k, "-of-2.safetensors");
    absl::StatusOr<SafetensorsFile> file = ReadSafetensors(path);
    ASSERT_TRUE(file.ok()) << file.status();
    ASSERT_EQ(file->metadata["format"], "psrt-shard-checkpoint-3");
    file->metadata["format"] = "psrt-shard-checkpoint-2";
    ASSERT_TRUE(WriteSafetensors(path, NamedTensorsOf(*file), file->metadata).ok());
  }
  int rows = 0;
  for (int k = 0; k < 2; ++k) {
    absl::StatusOr<ShardState> own = ReadCheckpointForShard({dir, k, 2}, 40);
    ASSERT_TRUE(own.ok()) << own.status();
    const ShardState::Table& table = own->tables[0];
    for (size_t r = 0; r < table.ids.size(); ++r) {
      EXPECT_EQ(TableShardOf(table.ids[r], 2), k);
      // Each row with its slot, whichever file it came from.
      EXPECT_EQ(table.slots[0].second.data()[r * kDim] - table.values.data()[r * kDim], 1000.0f);
    }
    rows += static_cast<int>(table.ids.size());
  }
  EXPECT_EQ(rows, kIds);
  // A ps of the same count restores it at start.
  ParameterShard shard(ShardOf(dir, 0, 2));
  ASSERT_TRUE(shard.RestoreLatest().ok());
  EXPECT_EQ(shard.GetStatus().restored_step(), 40);
  EXPECT_EQ(ReadCheckpointForShard({dir, 0, 3}, 40).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Without every shard's file, its rows cannot be gathered: the error says why.
  std::filesystem::remove(dir + "/model.ckpt-40.ps-1-of-2.safetensors");
  const absl::Status alone = ReadCheckpointForShard({dir, 0, 2}, 40).status();
  EXPECT_EQ(alone.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(alone.message().find("every shard's file"), std::string::npos) << alone;
}

}  // namespace
}  // namespace psrt
