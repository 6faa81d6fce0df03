#include "ps/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/file_system.h"
#include "common/file_util.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "google/protobuf/text_format.h"
#include "kernels/elementwise.h"

namespace psrt {
namespace {

constexpr char kFormat[] = "psrt-shard-checkpoint-1";
constexpr char kFormatWithTables[] = "psrt-shard-checkpoint-3";
// Tables whose rows went to shards by residue, not range (TableShardOf).
constexpr char kFormatTablesByResidue[] = "psrt-shard-checkpoint-2";
constexpr char kAverageSuffix[] = "/ExponentialMovingAverage";
constexpr char kIdsSuffix[] = "/ids";
constexpr char kValuesSuffix[] = "/values";

// A table's ids, and its rows' `floats` floats from `first` on (the values
// or a slot), as tensors streamed from its rows.
NamedTensor TableIds(const ShardStateView::Table& table, int64_t rows) {
  const EmbeddingTable* source = table.rows;
  return NamedTensor(table.meta.name() + kIdsSuffix, {rows}, SafetensorsDtype::kI64,
                     [source](absl::FunctionRef<void(absl::string_view)> emit) {
                       source->ForEachRow([&](uint64_t id, absl::Span<const float>) {
                         emit({reinterpret_cast<const char*>(&id), sizeof(id)});
                       });
                     });
}

NamedTensor TableColumns(const ShardStateView::Table& table, const std::string& suffix,
                         int64_t rows, int first, int floats) {
  const EmbeddingTable* source = table.rows;
  return NamedTensor(table.meta.name() + suffix, {rows, floats}, SafetensorsDtype::kF32,
                     [source, first, floats](absl::FunctionRef<void(absl::string_view)> emit) {
                       source->ForEachRow([&](uint64_t, absl::Span<const float> row) {
                         emit({reinterpret_cast<const char*>(row.data() + first),
                               floats * sizeof(float)});
                       });
                     });
}

std::string Suffix(const ShardCheckpointId& id) {
  return absl::StrCat(".ps-", id.shard, "-of-", id.num_shards);
}

std::string FileName(const ShardCheckpointId& id, int64_t step) {
  return absl::StrCat("model.ckpt-", step, Suffix(id), ".safetensors");
}

std::string IndexPath(const ShardCheckpointId& id) {
  return absl::StrCat(id.dir, "/checkpoint", Suffix(id));
}

// Parses "model.ckpt-<step><suffix>.safetensors".
bool StepOfFile(const ShardCheckpointId& id, absl::string_view name, int64_t* step) {
  const std::string tail = Suffix(id) + ".safetensors";
  if (!absl::ConsumePrefix(&name, "model.ckpt-") || !absl::ConsumeSuffix(&name, tail)) {
    return false;
  }
  return absl::SimpleAtoi(name, step);
}

// Parses "model.ckpt-<step>.ps-<k>-of-<K>.safetensors", any shard of any count.
bool ParseShardFileName(absl::string_view name, int64_t* step, int* shard, int* num_shards) {
  if (!absl::ConsumePrefix(&name, "model.ckpt-") || !absl::ConsumeSuffix(&name, ".safetensors")) {
    return false;
  }
  const std::vector<absl::string_view> parts = absl::StrSplit(name, absl::ByAnyChar(".-"));
  // "<step>", "ps", "<k>", "of", "<K>".
  return parts.size() == 5 && parts[1] == "ps" && parts[3] == "of" &&
         absl::SimpleAtoi(parts[0], step) && absl::SimpleAtoi(parts[2], shard) &&
         absl::SimpleAtoi(parts[4], num_shards) && *num_shards >= 1 && *shard >= 0 &&
         *shard < *num_shards;
}

absl::Status WriteIndex(const ShardCheckpointId& id, const std::vector<int64_t>& steps) {
  std::string text;
  for (int64_t step : steps) absl::StrAppend(&text, FileName(id, step), "\n");
  return WriteFileAtomically(IndexPath(id), text);
}

// The steps of `id`'s checkpoints: those the index names, in its order
// (each once), and the files under their final name that it misses (a
// crash between a save's rename and its index update, a lost index), by
// step. Every file under its final name is complete (written, synced,
// renamed). A missing index or directory holds none.
struct KnownCheckpoints {
  std::vector<int64_t> indexed;
  std::vector<int64_t> unindexed;
};

KnownCheckpoints FindCheckpoints(const ShardCheckpointId& id) {
  KnownCheckpoints known;
  FileSystem* fs = FileSystem::Default();
  int64_t step = 0;
  auto seen = [&known](int64_t s) {
    return std::find(known.indexed.begin(), known.indexed.end(), s) != known.indexed.end();
  };
  if (absl::StatusOr<std::string> index = fs->ReadFile(IndexPath(id)); index.ok()) {
    for (absl::string_view line : absl::StrSplit(*index, '\n', absl::SkipEmpty())) {
      if (StepOfFile(id, std::string(line), &step) && !seen(step)) known.indexed.push_back(step);
    }
  }
  if (absl::StatusOr<std::vector<std::string>> names = fs->ListDirectory(id.dir); names.ok()) {
    for (const std::string& name : *names) {
      if (StepOfFile(id, name, &step) && !seen(step)) known.unindexed.push_back(step);
    }
  }
  // Each step once, though two names may parse to one ("-010", "-10").
  std::sort(known.unindexed.begin(), known.unindexed.end());
  known.unindexed.erase(std::unique(known.unindexed.begin(), known.unindexed.end()),
                        known.unindexed.end());
  return known;
}

// The checkpoints in the order they were saved, oldest first: the files the
// index misses first, by step, then the index's lines in order.
std::vector<int64_t> InSaveOrder(const ShardCheckpointId& id) {
  KnownCheckpoints known = FindCheckpoints(id);
  known.unindexed.insert(known.unindexed.end(), known.indexed.begin(), known.indexed.end());
  return known.unindexed;
}

}  // namespace

std::vector<int64_t> ListShardCheckpoints(const ShardCheckpointId& id) {
  const KnownCheckpoints known = FindCheckpoints(id);
  std::vector<int64_t> steps = known.indexed;
  steps.insert(steps.end(), known.unindexed.begin(), known.unindexed.end());
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

std::string OtherShardCountFile(const ShardCheckpointId& id) {
  absl::StatusOr<std::vector<std::string>> names = FileSystem::Default()->ListDirectory(id.dir);
  if (!names.ok()) return "";
  for (const std::string& name : *names) {
    int64_t step = 0;
    int shard = 0, num_shards = 0;
    if (ParseShardFileName(name, &step, &shard, &num_shards) && num_shards != id.num_shards) {
      return name;
    }
  }
  return "";
}

std::vector<OtherCountCheckpoint> ListOtherCountCheckpoints(const ShardCheckpointId& id) {
  absl::StatusOr<std::vector<std::string>> names = FileSystem::Default()->ListDirectory(id.dir);
  if (!names.ok()) return {};
  std::map<std::pair<int64_t, int>, std::set<int>> shards;  // (step, count) -> shards.
  for (const std::string& name : *names) {
    int64_t step = 0;
    int shard = 0, num_shards = 0;
    if (ParseShardFileName(name, &step, &shard, &num_shards) && num_shards != id.num_shards) {
      shards[{step, num_shards}].insert(shard);
    }
  }
  std::vector<OtherCountCheckpoint> complete;
  for (auto it = shards.rbegin(); it != shards.rend(); ++it) {
    const auto& [step, num_shards] = it->first;
    if (static_cast<int>(it->second.size()) == num_shards) complete.push_back({num_shards, step});
  }
  return complete;
}

absl::StatusOr<PendingShardCheckpoint> StartShardCheckpoint(const ShardCheckpointId& id,
                                                            int64_t step,
                                                            const ShardStateView& state) {
  std::vector<NamedTensor> tensors;
  std::vector<std::string> slot_names;
  for (const auto& slot : state.slots) slot_names.push_back(slot.first);
  auto add_all = [&](const float* base, const std::string& suffix) {
    int64_t offset = 0;
    for (const proto::VariableMeta& meta : state.variables) {
      Shape shape(meta.shape().begin(), meta.shape().end());
      tensors.emplace_back(meta.name() + suffix, shape, base + offset);
      offset += NumElements(shape);
    }
    CHECK_EQ(offset, state.num_elements);
  };
  add_all(state.values, "");
  for (const auto& [name, data] : state.slots) add_all(data, "/" + name);
  if (state.average != nullptr) add_all(state.average, kAverageSuffix);
  // Every table has the sparse optimizer's slots.
  const std::vector<std::string> table_slots =
      state.tables.empty() ? std::vector<std::string>() : state.tables[0].rows->slot_names();
  for (const ShardStateView::Table& table : state.tables) {
    CHECK(table.rows->slot_names() == table_slots) << table.meta.name();
    const int64_t rows = table.rows->rows();
    const int dim = table.rows->dim();
    tensors.push_back(TableIds(table, rows));
    tensors.push_back(TableColumns(table, kValuesSuffix, rows, 0, dim));
    for (int s = 0; s < static_cast<int>(table_slots.size()); ++s) {
      tensors.push_back(TableColumns(table, "/" + table_slots[s], rows, (1 + s) * dim, dim));
    }
  }

  proto::InitHeader header;
  *header.mutable_config() = state.config;
  for (const auto& meta : state.variables) *header.add_variables() = meta;
  for (const auto& table : state.tables) *header.add_tables() = table.meta;
  *header.mutable_layout() = state.layout;
  std::string header_text;
  google::protobuf::TextFormat::PrintToString(header, &header_text);
  std::map<std::string, std::string> metadata = {
      {"format", state.tables.empty() ? kFormat : kFormatWithTables},
      {"step", absl::StrCat(step)},
      {"version", absl::StrCat(state.version)},
      {"shard", absl::StrCat(id.shard)},
      {"num_shards", absl::StrCat(id.num_shards)},
      {"slots", absl::StrJoin(slot_names, ",")},
      {"header", header_text}};
  if (!state.tables.empty()) metadata["table_slots"] = absl::StrJoin(table_slots, ",");
  PendingShardCheckpoint pending{id, step, nullptr};
  ASSIGN_OR_RETURN(pending.file,
                   StartSafetensors(absl::StrCat(id.dir, "/", FileName(id, step)), tensors,
                                    std::move(metadata)));
  return pending;
}

absl::StatusOr<std::string> FinishShardCheckpoint(PendingShardCheckpoint pending, int keep,
                                                  int64_t keep_step) {
  CHECK_GE(keep, 1);
  RETURN_IF_ERROR(pending.file->Commit());
  const ShardCheckpointId& id = pending.id;
  const int64_t step = pending.step;
  // Retention by save order, not by step: after a rollback, the abandoned
  // newer steps are the oldest saves, pruned first, and the file just
  // written is always kept.
  std::vector<int64_t> steps = InSaveOrder(id);
  steps.erase(std::remove(steps.begin(), steps.end(), step), steps.end());
  steps.push_back(step);
  const size_t first_kept = steps.size() - std::min<size_t>(keep, steps.size());
  std::vector<int64_t> kept, pruned;
  for (size_t i = 0; i < steps.size(); ++i) {
    (i >= first_kept || steps[i] == keep_step ? kept : pruned).push_back(steps[i]);
  }
  RETURN_IF_ERROR(WriteIndex(id, kept));
  for (int64_t old : pruned) ::unlink(absl::StrCat(id.dir, "/", FileName(id, old)).c_str());
  return pending.file->path();
}

absl::StatusOr<std::string> WriteShardCheckpoint(const ShardCheckpointId& id,
                                                 int64_t step,
                                                 const ShardStateView& state,
                                                 int keep, int64_t keep_step) {
  CHECK_GE(keep, 1);
  ASSIGN_OR_RETURN(PendingShardCheckpoint pending, StartShardCheckpoint(id, step, state));
  return FinishShardCheckpoint(std::move(pending), keep, keep_step);
}

absl::StatusOr<ShardState> ReadShardCheckpoint(const ShardCheckpointId& id,
                                               int64_t step) {
  const std::string path = absl::StrCat(id.dir, "/", FileName(id, step));
  ASSIGN_OR_RETURN(SafetensorsFile file, ReadSafetensors(path));
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint ", path, ": ", what));
  };
  auto meta = [&](const std::string& key) -> std::string {
    auto it = file.metadata.find(key);
    return it == file.metadata.end() ? "" : it->second;
  };
  const std::string format = meta("format");
  if (format != kFormat && format != kFormatWithTables && format != kFormatTablesByResidue) {
    return bad("not a psrt shard checkpoint");
  }
  if (!file.checksum_verified) {
    return bad("carries no checksum (psrt writes one into every checkpoint): "
               "refusing to restore a file that cannot be verified");
  }
  if (meta("shard") != absl::StrCat(id.shard) ||
      meta("num_shards") != absl::StrCat(id.num_shards)) {
    return bad(absl::StrCat("holds shard ", meta("shard"), " of ", meta("num_shards"),
                            ", not shard ", id.shard, " of ", id.num_shards));
  }
  ShardState state;
  proto::InitHeader header;
  if (!google::protobuf::TextFormat::ParseFromString(meta("header"), &header) ||
      !absl::SimpleAtoi(meta("step"), &state.step) ||
      !absl::SimpleAtoi(meta("version"), &state.version)) {
    return bad("malformed metadata");
  }
  if (state.step != step) {
    return bad(absl::StrCat("holds step ", state.step, ", not ", step, " (a renamed file?)"));
  }
  state.config = header.config();
  state.variables.assign(header.variables().begin(), header.variables().end());
  state.layout = header.layout();
  state.tables_by_residue = format == kFormatTablesByResidue;

  std::map<std::string, Tensor*> by_name;
  for (auto& [name, tensor] : file.tensors) by_name[name] = &tensor;
  // The shapes in the header are input too: nothing is sized by them before
  // they are checked, and the tensors are found, first.
  int64_t total = 0;
  for (const auto& v : state.variables) {
    if (v.dtype() != proto::DT_FLOAT) {
      return bad(absl::StrCat("variable \"", v.name(), "\" has dtype ",
                              proto::DataType_Name(v.dtype()), ", want DT_FLOAT"));
    }
    absl::StatusOr<int64_t> n = CheckedNumElements(Shape(v.shape().begin(), v.shape().end()));
    if (!n.ok()) return bad(absl::StrCat("variable \"", v.name(), "\": ", n.status().message()));
    total += *n;
    if (total > kMaxElements) {
      return bad(absl::StrCat("the variables hold more than ", kMaxElements, " elements"));
    }
  }
  // Concatenates NAME + suffix of every variable; an error when one is
  // missing or has another shape.
  auto gather = [&](const std::string& suffix, Tensor* out) -> absl::Status {
    std::vector<Tensor*> parts;
    for (const auto& v : state.variables) {
      auto it = by_name.find(v.name() + suffix);
      if (it == by_name.end() || it->second->shape() != Shape(v.shape().begin(), v.shape().end())) {
        return bad(absl::StrCat("tensor \"", v.name() + suffix, "\" is missing or has the wrong shape"));
      }
      // psrt never applies a non-finite result, so it never saves one.
      if (kernels::FirstNonFinite({it->second->data(),
                                   static_cast<size_t>(it->second->num_elements())}) >= 0) {
        return bad(absl::StrCat("tensor \"", v.name() + suffix, "\" holds NaN or Inf"));
      }
      parts.push_back(it->second);
    }
    out->Resize({total});
    int64_t offset = 0;
    for (Tensor* part : parts) {
      std::memcpy(out->data() + offset, part->data(), part->num_bytes());
      offset += part->num_elements();
      *part = Tensor();  // Copied: the file's copy need not stay.
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(gather("", &state.values));
  for (absl::string_view slot : absl::StrSplit(meta("slots"), ',', absl::SkipEmpty())) {
    state.slots.emplace_back(std::string(slot), Tensor());
    RETURN_IF_ERROR(gather(absl::StrCat("/", slot), &state.slots.back().second));
  }
  if (!state.variables.empty() &&
      by_name.count(state.variables[0].name() + kAverageSuffix) > 0) {
    RETURN_IF_ERROR(gather(kAverageSuffix, &state.average));
  }

  std::map<std::string, IntegerTensor*> integers;
  for (auto& [name, tensor] : file.integers) integers[name] = &tensor;
  const std::vector<std::string> table_slots =
      absl::StrSplit(meta("table_slots"), ',', absl::SkipEmpty());
  for (const proto::TableMeta& table_meta : header.tables()) {
    ShardState::Table& table = state.tables.emplace_back();
    table.meta = table_meta;
    const std::string& name = table_meta.name();
    auto bad_table = [&](const std::string& what) {
      return bad(absl::StrCat("table \"", name, "\": ", what));
    };
    auto ids = integers.find(name + kIdsSuffix);
    if (ids == integers.end() || ids->second->shape.size() != 1) {
      return bad_table(absl::StrCat("tensor \"", name, kIdsSuffix,
                                    "\" is missing or not a vector of 64-bit integers"));
    }
    table.ids = std::move(ids->second->values);
    if (table_meta.dim() < 1) {
      return bad_table(absl::StrCat("dimension ", table_meta.dim(), " is not positive"));
    }
    // Moves NAME + suffix out of the file: [ids, dim] floats, all finite.
    const Shape shape = {static_cast<int64_t>(table.ids.size()), table_meta.dim()};
    auto take = [&](const std::string& suffix, Tensor* out) -> absl::Status {
      const std::string tensor = name + suffix;
      auto it = by_name.find(tensor);
      if (it == by_name.end()) return bad_table(absl::StrCat("tensor \"", tensor, "\" is missing"));
      if (it->second->shape() != shape) {
        return bad_table(absl::StrCat("tensor \"", tensor, "\" has shape ",
                                      ShapeToString(it->second->shape()), ", want ",
                                      ShapeToString(shape), " (", table.ids.size(),
                                      " ids of dimension ", table_meta.dim(), ")"));
      }
      if (kernels::FirstNonFinite(it->second->flat()) >= 0) {
        return bad_table(absl::StrCat("tensor \"", tensor, "\" holds NaN or Inf"));
      }
      *out = std::move(*it->second);
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(take(kValuesSuffix, &table.values));
    for (const std::string& slot : table_slots) {
      table.slots.emplace_back(slot, Tensor());
      RETURN_IF_ERROR(take("/" + slot, &table.slots.back().second));
    }
  }
  return state;
}

}  // namespace psrt
