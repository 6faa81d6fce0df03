#include "ps/checkpoint_export.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <map>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/strings/string_view.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "ps/checkpoint.h"

namespace psrt {
namespace {

constexpr char kIndexPrefix[] = "checkpoint.ps-";
constexpr char kPartTag[] = "/part_";

// Parses an index file name "checkpoint.ps-<k>-of-<K>" into k and K.
bool ParseIndexName(absl::string_view name, int* shard, int* num_shards) {
  if (!absl::ConsumePrefix(&name, kIndexPrefix)) return false;
  const size_t of = name.find("-of-");
  if (of == absl::string_view::npos) return false;
  return absl::SimpleAtoi(name.substr(0, of), shard) &&
         absl::SimpleAtoi(name.substr(of + 4), num_shards) && *shard >= 0 &&
         *num_shards >= 1 && *shard < *num_shards;
}

// Splits "w/part_3" into "w" and 3; false for a name that is not a part.
bool SplitPartName(const std::string& name, std::string* base, int* part) {
  const size_t tag = name.rfind(kPartTag);
  if (tag == std::string::npos || tag == 0) return false;
  const absl::string_view digits = absl::string_view(name).substr(tag + strlen(kPartTag));
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(),
                                     [](char c) { return c >= '0' && c <= '9'; })) {
    return false;
  }
  if (!absl::SimpleAtoi(digits, part)) return false;
  *base = name.substr(0, tag);
  return true;
}

// A slice as read from a shard, before reassembly.
struct Slice {
  Tensor tensor;
  int shard = 0;
};

// Concatenates the parts of `name` (keyed by part index) along dimension 0.
absl::StatusOr<Tensor> Concatenate(const std::string& name,
                                   const std::map<int, Slice>& parts) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("variable \"", name, "\": ", what));
  };
  const int num_parts = parts.rbegin()->first + 1;
  if (static_cast<int>(parts.size()) != num_parts) {
    std::vector<int> missing, found;
    for (int j = 0; j < num_parts; ++j) (parts.count(j) ? found : missing).push_back(j);
    return bad(absl::StrCat("no shard holds \"", name, kPartTag, missing[0],
                            "\" (parts found: ", absl::StrJoin(found, ", "),
                            "; missing: ", absl::StrJoin(missing, ", "), ")"));
  }
  const Shape& first = parts.begin()->second.tensor.shape();
  if (first.empty()) return bad("part_0 is a scalar; parts are row ranges");
  Shape shape = first;
  shape[0] = 0;
  for (const auto& [j, slice] : parts) {
    const Shape& s = slice.tensor.shape();
    if (s.size() != first.size() || !std::equal(s.begin() + 1, s.end(), first.begin() + 1)) {
      return bad(absl::StrCat("part_", j, " (shard ", slice.shard, ") has shape ",
                              ShapeToString(s), ", part_0 (shard ",
                              parts.begin()->second.shard, ") has ",
                              ShapeToString(first),
                              "; the dimensions after the first must agree"));
    }
    shape[0] += s[0];
  }
  Tensor whole(shape);
  float* out = whole.data();
  for (const auto& [j, slice] : parts) {
    if (slice.tensor.num_elements() > 0) {
      std::memcpy(out, slice.tensor.data(), slice.tensor.num_bytes());
    }
    out += slice.tensor.num_elements();
  }
  return whole;
}

}  // namespace

absl::StatusOr<int> DiscoverNumShards(const std::string& dir) {
  std::error_code error;
  std::filesystem::directory_iterator it(dir, error);
  if (error) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint directory ", dir, ": ", error.message()));
  }
  std::map<int, std::string> by_count;  // K -> one index file naming it.
  for (; it != std::filesystem::directory_iterator(); it.increment(error)) {
    if (error) break;
    const std::string name = it->path().filename().string();
    int shard = 0, num_shards = 0;
    if (ParseIndexName(name, &shard, &num_shards)) by_count.emplace(num_shards, name);
  }
  if (error) {
    return absl::InternalError(absl::StrCat("listing ", dir, ": ", error.message()));
  }
  if (by_count.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "no checkpoint index (", kIndexPrefix, "<k>-of-<K>) in ", dir));
  }
  if (by_count.size() > 1) {
    // The count that saved last, by step: a resumed job's, after its first save.
    int newest_count = 0;
    int64_t newest_step = -1;
    bool tie = false;
    for (const auto& [count, name] : by_count) {
      absl::StatusOr<int64_t> step = NewestCommonStep(dir, count);
      if (!step.ok() || *step < newest_step) continue;
      tie = *step == newest_step;
      newest_step = *step;
      newest_count = count;
    }
    if (newest_step >= 0 && !tie) return newest_count;
    std::vector<std::string> seen;
    for (const auto& [k, name] : by_count) seen.push_back(absl::StrCat(k, " (", name, ")"));
    return absl::InvalidArgumentError(absl::StrCat(
        dir, " holds checkpoints of clusters with different shard counts: ",
        absl::StrJoin(seen, ", "), "; set num_shards to export one of them"));
  }
  return by_count.begin()->first;
}

absl::StatusOr<int64_t> NewestCommonStep(const std::string& dir, int num_shards) {
  if (num_shards < 1) {
    return absl::InvalidArgumentError(absl::StrCat("num_shards must be >= 1, not ", num_shards));
  }
  std::set<int64_t> common;
  std::vector<std::string> listed;
  for (int k = 0; k < num_shards; ++k) {
    const std::vector<int64_t> steps = ListShardCheckpoints({dir, k, num_shards});
    listed.push_back(absl::StrCat(dir, "/", kIndexPrefix, k, "-of-", num_shards, ": ",
                                  steps.empty() ? "none" : absl::StrJoin(steps, ",")));
    std::set<int64_t> mine(steps.begin(), steps.end());
    if (k == 0) {
      common = std::move(mine);
    } else {
      std::set<int64_t> both;
      std::set_intersection(common.begin(), common.end(), mine.begin(), mine.end(),
                            std::inserter(both, both.begin()));
      common = std::move(both);
    }
  }
  if (common.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "no checkpoint step is listed in the index of every one of the ", num_shards,
        " shards (", absl::StrJoin(listed, "; "), ")"));
  }
  return *common.rbegin();
}

absl::StatusOr<MergedCheckpoint> MergeShardCheckpoints(
    const CheckpointExportOptions& options) {
  MergedCheckpoint merged;
  merged.num_shards = options.num_shards;
  if (merged.num_shards == 0) {
    ASSIGN_OR_RETURN(merged.num_shards, DiscoverNumShards(options.checkpoint_dir));
  }
  if (merged.num_shards < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_shards must be >= 1, not ", merged.num_shards));
  }
  merged.step = options.step;
  if (merged.step < 0) {
    ASSIGN_OR_RETURN(merged.step,
                     NewestCommonStep(options.checkpoint_dir, merged.num_shards));
  }

  // The tables' rows, shard by shard.
  struct TableParts {
    int dim = 0;
    int first_shard = 0;  // The first shard that held it.
    std::vector<std::pair<std::vector<uint64_t>, Tensor>> parts;
  };
  std::map<std::string, TableParts> tables;
  std::map<std::string, Slice> whole;                 // Unpartitioned variables.
  std::map<std::string, std::map<int, Slice>> parts;  // Base name -> parts.
  std::map<std::string, int> holder;                  // Slice name -> shard.
  for (int k = 0; k < merged.num_shards; ++k) {
    const ShardCheckpointId id{options.checkpoint_dir, k, merged.num_shards};
    absl::StatusOr<ShardState> state = ReadShardCheckpoint(id, merged.step);
    if (!state.ok()) {
      return absl::Status(state.status().code(),
                          absl::StrCat("shard ", k, " of ", merged.num_shards, ": ",
                                       state.status().message()));
    }
    const std::string file = absl::StrCat(options.checkpoint_dir, "/model.ckpt-",
                                          merged.step, ".ps-", k, "-of-",
                                          merged.num_shards, ".safetensors");
    if (state->step != merged.step) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint ", file, " says it holds step ", state->step, ", not ", merged.step));
    }
    const Tensor* source = &state->values;
    if (options.moving_average) {
      if (state->average.shape().empty() && !state->variables.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "checkpoint ", file, " has no moving averages (the job was trained "
            "without moving_average_decay); export without moving averages"));
      }
      source = &state->average;
    }
    int64_t offset = 0;
    for (const proto::VariableMeta& meta : state->variables) {
      const Shape shape(meta.shape().begin(), meta.shape().end());
      Slice slice{Tensor(shape), k};
      if (slice.tensor.num_elements() > 0) {
        std::memcpy(slice.tensor.data(), source->data() + offset, slice.tensor.num_bytes());
      }
      offset += slice.tensor.num_elements();
      if (auto [it, fresh] = holder.emplace(meta.name(), k); !fresh) {
        return absl::InvalidArgumentError(absl::StrCat(
            "variable slice \"", meta.name(), "\" is held by both shard ",
            it->second, " and shard ", k));
      }
      std::string base;
      int part = 0;
      if (SplitPartName(meta.name(), &base, &part)) {
        parts[base].emplace(part, std::move(slice));
      } else {
        whole.emplace(meta.name(), std::move(slice));
      }
    }
    for (ShardState::Table& table : state->tables) {
      auto [it, fresh] = tables.try_emplace(table.meta.name());
      TableParts& gathered = it->second;
      if (fresh) {
        gathered.dim = table.meta.dim();
        gathered.first_shard = k;
      } else if (gathered.dim != table.meta.dim()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "table \"", table.meta.name(), "\" has dimension ", gathered.dim, " in shard ",
            gathered.first_shard, " and ", table.meta.dim(), " in shard ", k));
      }
      gathered.parts.emplace_back(std::move(table.ids), std::move(table.values));
    }
  }
  for (auto& [name, gathered] : tables) {
    if (static_cast<int>(gathered.parts.size()) != merged.num_shards) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table \"", name, "\" is held by ", gathered.parts.size(), " of the ",
          merged.num_shards, " shards; each holds the rows of its ids"));
    }
    MergedTable& table = merged.tables.emplace_back();
    table.name = name;
    int64_t rows = 0;
    for (const auto& [ids, values] : gathered.parts) rows += static_cast<int64_t>(ids.size());
    table.ids.reserve(rows);
    table.values = Tensor({rows, gathered.dim});
    float* out = table.values.data();
    for (auto& [ids, values] : gathered.parts) {
      table.ids.insert(table.ids.end(), ids.begin(), ids.end());
      if (values.num_elements() > 0) std::memcpy(out, values.data(), values.num_bytes());
      out += values.num_elements();
      values = Tensor();
    }
  }

  std::map<std::string, Tensor> variables;
  for (auto& [name, slice] : whole) variables.emplace(name, std::move(slice.tensor));
  for (const auto& [name, by_part] : parts) {
    if (auto it = whole.find(name); it != whole.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "variable \"", name, "\" is held whole (shard ", it->second.shard,
          ") and as parts (\"", name, kPartTag, by_part.begin()->first, "\", shard ",
          by_part.begin()->second.shard, ")"));
    }
    ASSIGN_OR_RETURN(Tensor tensor, Concatenate(name, by_part));
    variables.emplace(name, std::move(tensor));
  }
  for (auto& [name, tensor] : variables) merged.variables.emplace_back(name, std::move(tensor));
  return merged;
}

absl::Status WriteMergedCheckpoint(const MergedCheckpoint& merged,
                                   const CheckpointExportOptions& options,
                                   const std::string& out_path) {
  std::vector<NamedTensor> tensors;
  tensors.reserve(merged.variables.size());
  for (const auto& [name, tensor] : merged.variables) tensors.emplace_back(name, &tensor);
  for (const MergedTable& table : merged.tables) {
    tensors.emplace_back(table.name + "/ids", Shape{static_cast<int64_t>(table.ids.size())},
                         table.ids.data());
    tensors.emplace_back(table.name + "/values", &table.values);
  }
  std::string source = absl::StrCat(options.checkpoint_dir, "/model.ckpt-", merged.step,
                                    ", ", merged.num_shards, " shards");
  if (options.moving_average) absl::StrAppend(&source, ", moving averages");
  return WriteSafetensors(out_path, tensors,
                          {{"global_step", absl::StrCat(merged.step)}, {"source", source}});
}

absl::StatusOr<MergedCheckpoint> ExportCheckpoint(
    const CheckpointExportOptions& options, const std::string& out_path) {
  ASSIGN_OR_RETURN(MergedCheckpoint merged, MergeShardCheckpoints(options));
  RETURN_IF_ERROR(WriteMergedCheckpoint(merged, options, out_path));
  return merged;
}

}  // namespace psrt
