// Restoring a checkpoint onto another number of shards (ps/checkpoint.h,
// "Resharding"): ReadCheckpointForShard and ListRestorableCheckpoints.
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/placement.h"
#include "common/status_macros.h"
#include "ps/checkpoint.h"
#include "ps/embedding_table.h"

namespace psrt {
namespace {

std::string FilePath(const ShardCheckpointId& id, int64_t step) {
  return absl::StrCat(id.dir, "/model.ckpt-", step, ".ps-", id.shard, "-of-", id.num_shards,
                      ".safetensors");
}

// The placement the layout gives a job of `num_shards` shards.
absl::StatusOr<Placement> PlacementOf(const proto::ModelLayout& layout, int num_shards) {
  std::vector<VariableDef> variables;
  for (const proto::VariableMeta& v : layout.variables()) {
    variables.push_back({v.name(), Shape(v.shape().begin(), v.shape().end())});
  }
  PlacementOptions options;
  ASSIGN_OR_RETURN(options.strategy, ParsePlacementStrategy(layout.placement()));
  options.partition_threshold_bytes = layout.partition_threshold_bytes();
  return ComputePlacement(variables, num_shards, options);
}

// The bytes [begin, end) of a variable that two of its slices share (begin
// >= end: none).
std::pair<int64_t, int64_t> Shared(const VariableSlice& a, const VariableSlice& b) {
  if (a.variable != b.variable) return {0, 0};
  return {std::max(a.byte_offset, b.byte_offset),
          std::min(a.byte_offset + a.num_bytes, b.byte_offset + b.num_bytes)};
}

// The rows of `table` that shard `shard` of `num_shards` holds.
ShardState::Table RowsOfShard(const ShardState::Table& table, int shard, int num_shards) {
  ShardState::Table part;
  part.meta = table.meta;
  std::vector<size_t> rows;
  for (size_t i = 0; i < table.ids.size(); ++i) {
    if (TableShardOf(table.ids[i], num_shards) == shard) rows.push_back(i);
  }
  const int64_t dim = table.meta.dim();
  auto gather = [&](const Tensor& from) {
    Tensor to({static_cast<int64_t>(rows.size()), dim});
    for (size_t r = 0; r < rows.size(); ++r) {
      std::memcpy(to.data() + r * dim, from.data() + rows[r] * dim, dim * sizeof(float));
    }
    return to;
  };
  for (size_t row : rows) part.ids.push_back(table.ids[row]);
  part.values = gather(table.values);
  for (const auto& [name, slot] : table.slots) part.slots.emplace_back(name, gather(slot));
  return part;
}

// One table of the pieces gathered from several files, freeing each piece
// once it is copied.
ShardState::Table Concatenate(std::vector<ShardState::Table> pieces) {
  if (pieces.size() == 1) return std::move(pieces[0]);
  ShardState::Table table;
  table.meta = pieces[0].meta;
  const int64_t dim = table.meta.dim();
  int64_t rows = 0;
  for (const ShardState::Table& piece : pieces) rows += static_cast<int64_t>(piece.ids.size());
  table.ids.reserve(rows);
  table.values = Tensor({rows, dim});
  for (const auto& slot : pieces[0].slots) table.slots.emplace_back(slot.first, Tensor({rows, dim}));
  int64_t row = 0;
  for (ShardState::Table& piece : pieces) {
    const int64_t n = static_cast<int64_t>(piece.ids.size());
    table.ids.insert(table.ids.end(), piece.ids.begin(), piece.ids.end());
    std::memcpy(table.values.data() + row * dim, piece.values.data(), n * dim * sizeof(float));
    for (size_t s = 0; s < table.slots.size(); ++s) {
      std::memcpy(table.slots[s].second.data() + row * dim, piece.slots[s].second.data(),
                  n * dim * sizeof(float));
    }
    row += n;
    piece = ShardState::Table();
  }
  return table;
}

// Shard `id`'s part of checkpoint `step` of a job of `from` shards, cut as
// `target` places it (null: as the files' own layout does). One old file is
// in memory at a time; those that hold neither rows nor slices of this
// shard's are not read (the first is, for the layout).
absl::StatusOr<ShardState> Reshard(const ShardCheckpointId& id, int from, int64_t step,
                                   const proto::ModelLayout* target) {
  const int shard = id.shard, to = id.num_shards;
  std::vector<int> order;  // The files that may hold this shard's rows first.
  for (int j = 0; j < from; ++j) {
    if (TableShardsOverlap(j, from, shard, to)) order.push_back(j);
  }
  for (int j = 0; j < from; ++j) {
    if (!TableShardsOverlap(j, from, shard, to)) order.push_back(j);
  }
  ShardState out;
  out.resharded_from = from;
  Placement old_placement, new_placement;
  std::vector<int> mine;           // new_placement's slices of this shard.
  std::vector<int64_t> offsets;    // Their first elements in out.values.
  int64_t total = 0, copied = 0;
  bool averages = false;           // Every file holding variables has them.
  std::vector<std::vector<ShardState::Table>> pieces;
  std::string first_path;
  proto::ModelLayout first_layout;  // The files' own.
  for (int j : order) {
    const ShardCheckpointId old{id.dir, j, from};
    const std::string path = FilePath(old, step);
    auto bad = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat(
          "resharding checkpoint ", step, " from ", from, " shards to ", to, ": ", path, " ",
          what));
    };
    if (!first_path.empty() && !TableShardsOverlap(j, from, shard, to)) {
      bool needed = false;
      for (int s : old_placement.shard_slices[j]) {
        for (int m : mine) {
          const auto [begin, end] = Shared(old_placement.slices[s], new_placement.slices[m]);
          needed |= begin < end;
        }
      }
      if (!needed) continue;
    }
    ASSIGN_OR_RETURN(ShardState file, ReadShardCheckpoint(old, step));
    if (first_path.empty()) {
      first_path = path;
      first_layout = file.layout;
      if (file.layout.placement().empty()) {
        return bad("records no model layout (psrt wrote none before resharding was possible): "
                   "resume it with the number of shards that saved it");
      }
      if (target != nullptr && !SameVariables(file.layout, *target)) {
        return bad("holds another model than the chief's (another --model or layer sizes)");
      }
      absl::StatusOr<Placement> placed = PlacementOf(file.layout, from);
      if (placed.ok()) old_placement = *std::move(placed);
      if (placed.ok()) placed = PlacementOf(target != nullptr ? *target : file.layout, to);
      if (!placed.ok()) return bad(absl::StrCat("has a bad layout: ", placed.status().message()));
      new_placement = *std::move(placed);
      out.config = file.config;
      out.layout = target != nullptr ? *target : file.layout;
      out.step = file.step;
      mine = new_placement.shard_slices[shard];
      for (int m : mine) {
        const VariableSlice& slice = new_placement.slices[m];
        proto::VariableMeta& meta = out.variables.emplace_back();
        meta.set_name(slice.name);
        meta.set_dtype(proto::DT_FLOAT);
        for (int64_t d : slice.shape) meta.add_shape(d);
        offsets.push_back(total);
        total += NumElements(slice.shape);
      }
      out.values = Tensor({total});
      for (const auto& slot : file.slots) out.slots.emplace_back(slot.first, Tensor({total}));
      averages = out.config.moving_average_decay() > 0;
      if (averages) out.average = Tensor({total});
      pieces.resize(file.tables.size());
      for (const ShardState::Table& table : file.tables) out.tables.push_back({table.meta});
    } else {
      if (file.config.run_id() != out.config.run_id()) {
        return bad(absl::StrCat("belongs to run ", file.config.run_id(), ", ", first_path,
                                " to run ", out.config.run_id()));
      }
      if (file.layout.SerializeAsString() != first_layout.SerializeAsString()) {
        return bad(absl::StrCat("records another model layout than ", first_path));
      }
      bool same = file.slots.size() == out.slots.size() && file.tables.size() == pieces.size();
      for (size_t s = 0; same && s < out.slots.size(); ++s) {
        same = file.slots[s].first == out.slots[s].first;
      }
      for (size_t t = 0; same && t < pieces.size(); ++t) {
        same = file.tables[t].meta.SerializeAsString() == out.tables[t].meta.SerializeAsString();
      }
      if (!same) return bad(absl::StrCat("holds other optimizer slots or tables than ", first_path));
    }
    out.version = std::max(out.version, file.version);

    // The file's slices, as the layout places them, into this shard's.
    const std::vector<int>& held = old_placement.shard_slices[j];
    bool as_placed = held.size() == file.variables.size();
    for (size_t v = 0; as_placed && v < held.size(); ++v) {
      const VariableSlice& slice = old_placement.slices[held[v]];
      as_placed = file.variables[v].name() == slice.name &&
                  Shape(file.variables[v].shape().begin(), file.variables[v].shape().end()) ==
                      slice.shape;
    }
    if (!as_placed) return bad("holds other variables than its recorded layout places on it");
    if (!held.empty() && file.average.num_elements() == 0) averages = false;
    int64_t file_offset = 0;
    for (int s : held) {
      const VariableSlice& from_slice = old_placement.slices[s];
      for (size_t m = 0; m < mine.size(); ++m) {
        const VariableSlice& to_slice = new_placement.slices[mine[m]];
        const auto [begin, end] = Shared(from_slice, to_slice);
        if (begin >= end) continue;
        const int64_t src = file_offset + (begin - from_slice.byte_offset) / 4;
        const int64_t dst = offsets[m] + (begin - to_slice.byte_offset) / 4;
        const size_t bytes = end - begin;
        std::memcpy(out.values.data() + dst, file.values.data() + src, bytes);
        for (size_t i = 0; i < out.slots.size(); ++i) {
          std::memcpy(out.slots[i].second.data() + dst, file.slots[i].second.data() + src, bytes);
        }
        if (averages) std::memcpy(out.average.data() + dst, file.average.data() + src, bytes);
        copied += (end - begin) / 4;
      }
      file_offset += from_slice.num_bytes / 4;
    }
    for (size_t t = 0; t < pieces.size(); ++t) {
      if (TableShardsOverlap(j, from, shard, to)) {
        pieces[t].push_back(RowsOfShard(file.tables[t], shard, to));
      }
    }
  }
  // The placements cover every variable once, so this holds unless the
  // files were changed; it is cheap to be sure.
  if (copied != total) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resharding checkpoint ", step, " from ", from, " shards to ", to, ": the files hold ",
        copied, " of shard ", shard, "'s ", total, " values"));
  }
  if (!averages) out.average = Tensor();  // LoadLocked restarts them at the values.
  for (size_t t = 0; t < pieces.size(); ++t) out.tables[t] = Concatenate(std::move(pieces[t]));
  return out;
}

// A format-2 checkpoint of shard `id` (its rows split by residues of the
// hash) with the rows that TableShardOf gives it now: gathered from every
// shard's file of `step`, in place of its own file's.
absl::Status RowsByRange(const ShardCheckpointId& id, int64_t step, ShardState* state) {
  std::vector<std::vector<ShardState::Table>> pieces(state->tables.size());
  for (int j = 0; j < id.num_shards; ++j) {
    ShardState other;
    if (j != id.shard) {
      const ShardCheckpointId file{id.dir, j, id.num_shards};
      absl::StatusOr<ShardState> read = ReadShardCheckpoint(file, step);
      if (!read.ok()) {
        return absl::Status(read.status().code(), absl::StrCat(
            "checkpoint ", step, " of format 2 splits table rows by another hash than this psrt, "
            "which gathers each shard's rows from every shard's file: ", read.status().message()));
      }
      other = *std::move(read);
      bool same = other.config.run_id() == state->config.run_id() &&
                  other.tables.size() == state->tables.size();
      for (size_t t = 0; same && t < state->tables.size(); ++t) {
        same = other.tables[t].meta.SerializeAsString() ==
               state->tables[t].meta.SerializeAsString();
      }
      if (!same) {
        return absl::InvalidArgumentError(absl::StrCat(
            "checkpoint ", step, ": ", FilePath(file, step), " holds another run or other tables "
            "than ", FilePath(id, step)));
      }
    }
    const ShardState& source = j == id.shard ? *state : other;
    for (size_t t = 0; t < pieces.size(); ++t) {
      pieces[t].push_back(RowsOfShard(source.tables[t], id.shard, id.num_shards));
    }
  }
  for (size_t t = 0; t < pieces.size(); ++t) state->tables[t] = Concatenate(std::move(pieces[t]));
  return absl::OkStatus();
}

}  // namespace

bool SameVariables(const proto::ModelLayout& a, const proto::ModelLayout& b) {
  if (a.variables_size() != b.variables_size()) return false;
  for (int i = 0; i < a.variables_size(); ++i) {
    if (a.variables(i).SerializeAsString() != b.variables(i).SerializeAsString()) return false;
  }
  return true;
}

std::vector<int64_t> ListRestorableCheckpoints(const ShardCheckpointId& id) {
  std::vector<int64_t> steps = ListShardCheckpoints(id);
  for (const OtherCountCheckpoint& other : ListOtherCountCheckpoints(id)) {
    steps.push_back(other.step);
  }
  std::sort(steps.rbegin(), steps.rend());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  return steps;
}

absl::StatusOr<ShardState> ReadCheckpointForShard(const ShardCheckpointId& id, int64_t step,
                                                  const proto::ModelLayout* layout) {
  const std::vector<int64_t> own = ListShardCheckpoints(id);
  const bool have_own = std::find(own.begin(), own.end(), step) != own.end();
  if (have_own && layout != nullptr) {
    ASSIGN_OR_RETURN(ShardState state, Reshard(id, id.num_shards, step, layout));
    state.resharded_from = 0;  // Its own count, cut anew.
    return state;
  }
  if (!have_own) {
    for (const OtherCountCheckpoint& other : ListOtherCountCheckpoints(id)) {
      if (other.step == step) return Reshard(id, other.num_shards, step, layout);
    }
  }
  ASSIGN_OR_RETURN(ShardState state, ReadShardCheckpoint(id, step));
  if (state.tables_by_residue && !state.tables.empty() && id.num_shards > 1) {
    RETURN_IF_ERROR(RowsByRange(id, step, &state));
  }
  return state;
}

}  // namespace psrt
