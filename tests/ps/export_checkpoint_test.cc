#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/placement.h"
#include "common/safetensors.h"
#include "common/training_config.h"
#include "gtest/gtest.h"
#include "ps/checkpoint.h"
#include "ps/checkpoint_export.h"
#include "ps/embedding_table.h"

namespace psrt {
namespace {

// The model of every test: fc/weights (60 bytes) is partitioned across the
// two shards by a 40-byte threshold, the others stay whole.
const std::vector<VariableDef> kModel = {
    {"fc/weights", {5, 3}}, {"fc/bias", {3}}, {"out/weights", {3, 2}}};
constexpr int kShards = 2;

// Deterministic values: distinct per variable, step and kind.
float Value(int variable, int64_t i, int64_t step) {
  return 100.0f * variable + 0.25f * i + step;
}
float Average(int variable, int64_t i, int64_t step) {
  return -0.5f * Value(variable, i, step);
}

std::string NewDir(const std::string& name) {
  const std::string dir = testing::TempDir() + "/export_checkpoint_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

bool Exists(const std::string& path) { return std::filesystem::exists(path); }

std::string ShardFile(const std::string& dir, int64_t step, int k) {
  return dir + "/model.ckpt-" + std::to_string(step) + ".ps-" + std::to_string(k) +
         "-of-" + std::to_string(kShards) + ".safetensors";
}

struct WriteOptions {
  bool average = true;
  std::string drop_slice;  // A slice left out of its shard.
  // Embedding tables: shard k holds those of kTables[k] (each the rows of
  // its ids, TableShardOf's).
  bool tables = false;
};

// The ids every shard's part of a table is asked for, and the gradient
// each row then gets (Adagrad: values and slots differ from the initial).
constexpr int kIds = 40;
proto::TrainingConfig TableConfig() {
  proto::TrainingConfig config;
  config.set_mode(proto::ASYNC);
  config.set_num_replicas(1);
  config.set_optimizer(proto::ADAGRAD);
  config.set_learning_rate(0.5f);
  SetOptimizerDefaults(&config);
  return config;
}

// Shard k's part of table `name`: the rows of its ids among 0..kIds-1
// (every id with all = true, as an unsharded table holds them), made in
// descending id order, then each pushed once.
std::unique_ptr<EmbeddingTable> TablePart(const std::string& name, int dim, int k,
                                          bool all = false) {
  auto table = EmbeddingTable::Create(name, dim, /*seed=*/11, TableConfig());
  EXPECT_TRUE(table.ok()) << table.status();
  std::vector<uint64_t> ids;
  for (int id = kIds - 1; id >= 0; --id) {
    const uint64_t big = static_cast<uint64_t>(id) << 58;  // Some with the top bit set.
    if (all || TableShardOf(big, kShards) == k) ids.push_back(big);
  }
  std::vector<float> grads;  // Each id's own.
  for (uint64_t id : ids) {
    for (int j = 0; j < dim; ++j) grads.push_back(0.01f * ((id >> 58) % 7 + j) - 0.02f);
  }
  std::vector<float> rows(ids.size() * dim);
  EXPECT_TRUE((*table)->Lookup(ids, absl::MakeSpan(rows)).ok());
  EXPECT_TRUE((*table)->Apply(1, ids, grads).ok());
  return *std::move(table);
}

// Writes shard k's checkpoint `step` of kModel, placed as psrt_worker places
// it, with a Momentum slot and (optionally) moving averages.
void WriteShard(const std::string& dir, int k, int64_t step,
                const WriteOptions& options = {}) {
  PlacementOptions placement_options;
  placement_options.partition_threshold_bytes = 40;
  absl::StatusOr<Placement> placement = ComputePlacement(kModel, kShards, placement_options);
  ASSERT_TRUE(placement.ok()) << placement.status();
  std::vector<float> values, slot, average;
  ShardStateView view;
  for (int s : placement->shard_slices[k]) {
    const VariableSlice& slice = placement->slices[s];
    if (slice.name == options.drop_slice) continue;
    proto::VariableMeta meta;
    meta.set_name(slice.name);
    meta.set_dtype(proto::DT_FLOAT);
    for (int64_t d : slice.shape) meta.add_shape(d);
    view.variables.push_back(meta);
    const int64_t first = slice.byte_offset / sizeof(float);
    for (int64_t i = first; i < first + NumElements(slice.shape); ++i) {
      values.push_back(Value(slice.variable, i, step));
      slot.push_back(Value(slice.variable, i, step) + 1000);
      average.push_back(Average(slice.variable, i, step));
    }
  }
  view.version = step;
  view.num_elements = static_cast<int64_t>(values.size());
  view.values = values.data();
  view.slots.emplace_back("Momentum", slot.data());
  view.average = options.average ? average.data() : nullptr;
  std::vector<std::unique_ptr<EmbeddingTable>> tables;
  if (options.tables) {
    for (auto [name, dim] : {std::pair{"user", 3}, std::pair{"ad", 1}}) {
      tables.push_back(TablePart(name, dim, k));
      proto::TableMeta meta;
      meta.set_name(name);
      meta.set_dim(dim);
      meta.set_seed(11);
      view.tables.push_back({meta, tables.back().get()});
    }
  }
  absl::StatusOr<std::string> path =
      WriteShardCheckpoint({dir, k, kShards}, step, view, /*keep=*/5);
  ASSERT_TRUE(path.ok()) << path.status();
}

void WriteCheckpoint(const std::string& dir, int64_t step,
                     const WriteOptions& options = {}) {
  for (int k = 0; k < kShards; ++k) WriteShard(dir, k, step, options);
}

// Checks `file` holds exactly kModel's variables, sorted by name, with the
// values (or averages) of `step`.
void ExpectModel(const SafetensorsFile& file, int64_t step, bool average) {
  std::map<std::string, int> index;
  for (int v = 0; v < static_cast<int>(kModel.size()); ++v) index[kModel[v].name] = v;
  ASSERT_EQ(file.tensors.size(), kModel.size());
  auto expected = index.begin();  // Sorted by name.
  for (const auto& [name, tensor] : file.tensors) {
    EXPECT_EQ(name, expected->first);
    const int v = index.at(name);
    ASSERT_EQ(tensor.shape(), kModel[v].shape) << name;
    for (int64_t i = 0; i < tensor.num_elements(); ++i) {
      ASSERT_EQ(tensor.data()[i], average ? Average(v, i, step) : Value(v, i, step))
          << name << "[" << i << "]";
    }
    ++expected;
  }
  EXPECT_EQ(file.metadata.at("global_step"), std::to_string(step));
}

TEST(ExportCheckpointTest, ThePlacementPartitionsOneVariable) {
  PlacementOptions options;
  options.partition_threshold_bytes = 40;
  absl::StatusOr<Placement> placement = ComputePlacement(kModel, kShards, options);
  ASSERT_TRUE(placement.ok());
  std::map<std::string, int> shard_of;
  for (const VariableSlice& slice : placement->slices) shard_of[slice.name] = slice.shard;
  ASSERT_EQ(shard_of.size(), 4u);
  EXPECT_NE(shard_of.at("fc/weights/part_0"), shard_of.at("fc/weights/part_1"));
}

TEST(ExportCheckpointTest, MergesTheNewestCommonStep) {
  const std::string dir = NewDir("newest");
  WriteCheckpoint(dir, 100);
  WriteCheckpoint(dir, 200);
  WriteShard(dir, 0, 300);  // Shard 1 never saved 300.
  const std::string out = dir + "/model.safetensors";
  CheckpointExportOptions options;
  options.checkpoint_dir = dir;
  absl::StatusOr<MergedCheckpoint> merged = ExportCheckpoint(options, out);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->step, 200);
  EXPECT_EQ(merged->num_shards, 2);
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(out);
  ASSERT_TRUE(file.ok()) << file.status();
  ExpectModel(*file, 200, /*average=*/false);
  EXPECT_EQ(file->metadata.at("source"), dir + "/model.ckpt-200, 2 shards");
}

TEST(ExportCheckpointTest, ExportsAnExplicitStepAndShardCount) {
  const std::string dir = NewDir("explicit");
  WriteCheckpoint(dir, 100);
  WriteCheckpoint(dir, 200);
  const std::string out = dir + "/model.safetensors";
  CheckpointExportOptions options;
  options.checkpoint_dir = dir;
  options.step = 100;
  options.num_shards = 2;
  ASSERT_TRUE(ExportCheckpoint(options, out).ok());
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(out);
  ASSERT_TRUE(file.ok()) << file.status();
  ExpectModel(*file, 100, /*average=*/false);
}

TEST(ExportCheckpointTest, ExportsMovingAveragesUnderThePlainNames) {
  const std::string dir = NewDir("average");
  WriteCheckpoint(dir, 100);
  const std::string out = dir + "/ema.safetensors";
  CheckpointExportOptions options;
  options.checkpoint_dir = dir;
  options.moving_average = true;
  ASSERT_TRUE(ExportCheckpoint(options, out).ok());
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(out);
  ASSERT_TRUE(file.ok()) << file.status();
  ExpectModel(*file, 100, /*average=*/true);
  EXPECT_EQ(file->metadata.at("source"), dir + "/model.ckpt-100, 2 shards, moving averages");
}

TEST(ExportCheckpointTest, RefusesMovingAveragesTheCheckpointLacks) {
  const std::string dir = NewDir("no_average");
  WriteOptions no_average;
  no_average.average = false;
  WriteCheckpoint(dir, 100, no_average);
  CheckpointExportOptions options;
  options.checkpoint_dir = dir;
  options.moving_average = true;
  const std::string out = dir + "/ema.safetensors";
  absl::StatusOr<MergedCheckpoint> merged = ExportCheckpoint(options, out);
  EXPECT_EQ(merged.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(merged.status().message().find(ShardFile(dir, 100, 0)), std::string::npos)
      << merged.status();
  EXPECT_FALSE(Exists(out));
  // Without the flag the same checkpoint exports its values.
  options.moving_average = false;
  EXPECT_TRUE(ExportCheckpoint(options, out).ok());
}

TEST(ExportCheckpointTest, AMissingShardFileIsNotFoundAndWritesNothing) {
  const std::string dir = NewDir("missing_shard");
  WriteCheckpoint(dir, 100);
  ASSERT_TRUE(std::filesystem::remove(ShardFile(dir, 100, 1)));
  CheckpointExportOptions options;
  options.checkpoint_dir = dir;
  const std::string out = dir + "/model.safetensors";
  absl::StatusOr<MergedCheckpoint> merged = ExportCheckpoint(options, out);
  EXPECT_EQ(merged.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(merged.status().message().find(ShardFile(dir, 100, 1)), std::string::npos)
      << merged.status();
  EXPECT_FALSE(Exists(out));
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp."), std::string::npos)
        << entry.path();
  }
}

TEST(ExportCheckpointTest, ACorruptShardFileIsDataLossAndWritesNothing) {
  const std::string dir = NewDir("corrupt");
  WriteCheckpoint(dir, 100);
  const std::string path = ShardFile(dir, 100, 0);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(0, std::ios::end);
    const std::streamoff last = f.tellg() - std::streamoff{1};
    f.seekg(last);
    const char byte = static_cast<char>(f.get());
    f.seekp(last);
    f.put(static_cast<char>(byte ^ 0x01));
  }
  CheckpointExportOptions options;
  options.checkpoint_dir = dir;
  const std::string out = dir + "/model.safetensors";
  absl::StatusOr<MergedCheckpoint> merged = ExportCheckpoint(options, out);
  EXPECT_EQ(merged.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(merged.status().message().find(path), std::string::npos) << merged.status();
  EXPECT_FALSE(Exists(out));
}

TEST(ExportCheckpointTest, ATruncatedShardFileIsAnErrorNamingIt) {
  const std::string dir = NewDir("truncated");
  WriteCheckpoint(dir, 100);
  const std::string path = ShardFile(dir, 100, 1);
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 3);
  CheckpointExportOptions options;
  options.checkpoint_dir = dir;
  absl::StatusOr<MergedCheckpoint> merged = MergeShardCheckpoints(options);
  EXPECT_FALSE(merged.ok());
  EXPECT_NE(merged.status().message().find(path), std::string::npos) << merged.status();
}

TEST(ExportCheckpointTest, AMissingPartIsInvalidArgumentNamingIt) {
  const std::string dir = NewDir("missing_part");
  WriteOptions drop;
  drop.drop_slice = "fc/weights/part_0";
  WriteCheckpoint(dir, 100, drop);
  CheckpointExportOptions options;
  options.checkpoint_dir = dir;
  const std::string out = dir + "/model.safetensors";
  absl::StatusOr<MergedCheckpoint> merged = ExportCheckpoint(options, out);
  EXPECT_EQ(merged.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(merged.status().message().find("fc/weights/part_0"), std::string::npos)
      << merged.status();
  EXPECT_FALSE(Exists(out));
}

// Writes one shard holding the given slices, filled with 1.
void WriteSlices(const std::string& dir, int k, int64_t step,
                 const std::vector<VariableDef>& slices) {
  ShardStateView view;
  int64_t total = 0;
  for (const VariableDef& def : slices) {
    proto::VariableMeta meta;
    meta.set_name(def.name);
    meta.set_dtype(proto::DT_FLOAT);
    for (int64_t d : def.shape) meta.add_shape(d);
    view.variables.push_back(meta);
    total += NumElements(def.shape);
  }
  std::vector<float> values(total, 1.0f);
  view.num_elements = total;
  view.values = values.data();
  ASSERT_TRUE(WriteShardCheckpoint({dir, k, kShards}, step, view, 5).ok());
}

TEST(ExportCheckpointTest, PartsWithDifferentTrailingDimensionsAreRefused) {
  const std::string dir = NewDir("trailing");
  WriteSlices(dir, 0, 100, {{"w/part_0", {2, 3}}});
  WriteSlices(dir, 1, 100, {{"w/part_1", {2, 4}}});
  CheckpointExportOptions options;
  options.checkpoint_dir = dir;
  absl::StatusOr<MergedCheckpoint> merged = MergeShardCheckpoints(options);
  EXPECT_EQ(merged.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(merged.status().message().find("\"w\""), std::string::npos) << merged.status();
}

TEST(ExportCheckpointTest, ASliceHeldTwiceIsRefused) {
  const std::string dir = NewDir("twice");
  WriteSlices(dir, 0, 100, {{"b", {3}}});
  WriteSlices(dir, 1, 100, {{"b", {3}}});
  CheckpointExportOptions options;
  options.checkpoint_dir = dir;
  absl::StatusOr<MergedCheckpoint> merged = MergeShardCheckpoints(options);
  EXPECT_EQ(merged.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(merged.status().message().find("\"b\""), std::string::npos) << merged.status();
}

TEST(ExportCheckpointTest, NoCommonStepIsNotFoundListingTheSteps) {
  const std::string dir = NewDir("no_common");
  WriteShard(dir, 0, 100);
  WriteShard(dir, 1, 200);
  CheckpointExportOptions options;
  options.checkpoint_dir = dir;
  const std::string out = dir + "/model.safetensors";
  absl::StatusOr<MergedCheckpoint> merged = ExportCheckpoint(options, out);
  EXPECT_EQ(merged.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(merged.status().message().find("no checkpoint step"), std::string::npos)
      << merged.status();
  EXPECT_NE(merged.status().message().find("200"), std::string::npos) << merged.status();
  EXPECT_FALSE(Exists(out));
}

TEST(ExportCheckpointTest, DiscoversTheShardCount) {
  const std::string dir = NewDir("discover");
  EXPECT_EQ(DiscoverNumShards(dir).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(DiscoverNumShards(dir + "/absent").status().code(),
            absl::StatusCode::kNotFound);
  WriteCheckpoint(dir, 100);
  absl::StatusOr<int> shards = DiscoverNumShards(dir);
  ASSERT_TRUE(shards.ok()) << shards.status();
  EXPECT_EQ(*shards, 2);
  // A partial index of a 3-shard cluster is not a checkpoint of its.
  std::ofstream(dir + "/checkpoint.ps-0-of-3") << "model.ckpt-500.ps-0-of-3.safetensors\n";
  EXPECT_EQ(DiscoverNumShards(dir).value_or(0), 2);
  // Whole indexes of 3 shards: the count of the newest step wins (a job
  // resumed with other ps tasks), and one step in both is ambiguous ...
  for (int k = 0; k < 3; ++k) {
    std::ofstream(absl::StrCat(dir, "/checkpoint.ps-", k, "-of-3"))
        << absl::StrCat("model.ckpt-", k == 0 ? 500 : 200, ".ps-", k, "-of-3.safetensors\n",
                        "model.ckpt-200.ps-", k, "-of-3.safetensors\n");
  }
  EXPECT_EQ(DiscoverNumShards(dir).value_or(0), 3);
  for (int k = 0; k < 3; ++k) {
    std::ofstream(absl::StrCat(dir, "/checkpoint.ps-", k, "-of-3"))
        << absl::StrCat("model.ckpt-100.ps-", k, "-of-3.safetensors\n");
  }
  EXPECT_EQ(DiscoverNumShards(dir).status().code(), absl::StatusCode::kInvalidArgument);
  // ... unless the caller names it.
  CheckpointExportOptions options;
  options.checkpoint_dir = dir;
  options.num_shards = 2;
  EXPECT_TRUE(MergeShardCheckpoints(options).ok());
}

// Each table's rows come from every shard: T/ids holds all the ids once,
// T/values their rows as an unsharded table holds them, slots left out.
TEST(ExportCheckpointTest, GathersEveryShardsTableRows) {
  const std::string dir = NewDir("tables");
  WriteOptions options;
  options.tables = true;
  WriteCheckpoint(dir, 100, options);
  const std::string out = dir + "/model.safetensors";
  CheckpointExportOptions export_options;
  export_options.checkpoint_dir = dir;
  absl::StatusOr<MergedCheckpoint> merged = ExportCheckpoint(export_options, out);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->variables.size(), kModel.size());
  ASSERT_EQ(merged->tables.size(), 2u);
  EXPECT_EQ(merged->tables[0].name, "ad");  // By name.
  EXPECT_EQ(merged->tables[1].name, "user");

  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(out);
  ASSERT_TRUE(file.ok()) << file.status();
  std::map<std::string, const Tensor*> floats;
  for (const auto& [name, tensor] : file->tensors) floats[name] = &tensor;
  std::map<std::string, const IntegerTensor*> integers;
  for (const auto& [name, tensor] : file->integers) integers[name] = &tensor;
  EXPECT_EQ(floats.size(), kModel.size() + 2);  // No slots.
  EXPECT_EQ(floats.count("user/Adagrad"), 0u);
  for (auto [name, dim] : {std::pair{"user", 3}, std::pair{"ad", 1}}) {
    SCOPED_TRACE(name);
    const IntegerTensor* ids = integers.at(std::string(name) + "/ids");
    const Tensor* values = floats.at(std::string(name) + "/values");
    EXPECT_EQ(ids->dtype, SafetensorsDtype::kI64);
    ASSERT_EQ(ids->shape, (Shape{kIds}));
    ASSERT_EQ(values->shape(), (Shape{kIds, dim}));
    // Shard 0's rows, then shard 1's, each in the order they were made.
    std::vector<uint64_t> expected_ids;
    for (int k = 0; k < kShards; ++k) {
      TablePart(name, dim, k)->ForEachRow(
          [&](uint64_t id, absl::Span<const float>) { expected_ids.push_back(id); });
    }
    EXPECT_EQ(ids->values, expected_ids);
    EXPECT_NE(TableShardOf(ids->values.front(), kShards), TableShardOf(ids->values.back(), kShards));
    // Every row as an unsharded table has it after the same updates.
    auto all = TablePart(name, dim, 0, /*all=*/true);
    std::vector<float> rows(kIds * dim);
    ASSERT_TRUE(all->Lookup(ids->values, absl::MakeSpan(rows)).ok());
    EXPECT_EQ(std::vector<float>(values->data(), values->data() + kIds * dim), rows);
  }
  // The merged variables are those of a checkpoint without tables.
  WriteCheckpoint(NewDir("no_tables"), 100);
  export_options.checkpoint_dir = testing::TempDir() + "/export_checkpoint_no_tables";
  absl::StatusOr<MergedCheckpoint> plain = MergeShardCheckpoints(export_options);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(plain->tables.empty());
  ASSERT_EQ(plain->variables.size(), merged->variables.size());
  for (size_t v = 0; v < plain->variables.size(); ++v) {
    const Tensor& a = plain->variables[v].second;
    const Tensor& b = merged->variables[v].second;
    EXPECT_EQ(std::vector<float>(a.data(), a.data() + a.num_elements()),
              std::vector<float>(b.data(), b.data() + b.num_elements()));
  }
}

// A table that one shard's file lacks would export without its rows.
TEST(ExportCheckpointTest, ATableMissingFromAShardIsRefused) {
  const std::string dir = NewDir("table_missing");
  WriteOptions options;
  options.tables = true;
  WriteShard(dir, 0, 100, options);
  WriteShard(dir, 1, 100);
  CheckpointExportOptions export_options;
  export_options.checkpoint_dir = dir;
  absl::StatusOr<MergedCheckpoint> merged = MergeShardCheckpoints(export_options);
  EXPECT_EQ(merged.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(merged.status().message().find("table \"ad\" is held by 1 of the 2 shards"),
            std::string::npos)
      << merged.status();
}

}  // namespace
}  // namespace psrt
