#include "common/placement.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"

namespace psrt {

absl::StatusOr<PlacementStrategy> ParsePlacementStrategy(absl::string_view name) {
  if (name == "round_robin") return PlacementStrategy::kRoundRobin;
  if (name == "greedy") return PlacementStrategy::kGreedyByBytes;
  if (name == "contiguous") return PlacementStrategy::kContiguous;
  if (name == "prioritized") return PlacementStrategy::kPrioritized;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown placement strategy \"", name,
                   "\" (known: round_robin, greedy, contiguous, prioritized)"));
}

const char* PlacementStrategyName(PlacementStrategy strategy) {
  switch (strategy) {
    case PlacementStrategy::kRoundRobin: return "round_robin";
    case PlacementStrategy::kGreedyByBytes: return "greedy";
    case PlacementStrategy::kContiguous: return "contiguous";
    case PlacementStrategy::kPrioritized: return "prioritized";
  }
  return "round_robin";
}

absl::StatusOr<Placement> ComputePlacement(
    const std::vector<VariableDef>& variables, int num_shards,
    const PlacementOptions& options) {
  if (num_shards <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement needs at least one shard, got ", num_shards));
  }
  if (options.partition_threshold_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition threshold must be positive, got ",
                     options.partition_threshold_bytes));
  }
  Placement placement;
  placement.num_shards = num_shards;
  placement.shard_slices.resize(num_shards);
  std::set<std::string> names;
  // First the slices, then their shards.
  for (int v = 0; v < static_cast<int>(variables.size()); ++v) {
    const VariableDef& var = variables[v];
    if (var.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("variable ", v, " has an empty name"));
    }
    if (!names.insert(var.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("duplicate variable name \"", var.name, "\""));
    }
    for (int64_t d : var.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("variable \"", var.name, "\" has a negative dimension ",
                         ShapeToString(var.shape)));
      }
    }
    const int64_t bytes = NumElements(var.shape) * int64_t{sizeof(float)};
    const int64_t rows = var.shape.empty() ? 1 : var.shape[0];
    int64_t parts = 1;
    if (bytes > options.partition_threshold_bytes && rows >= 2) {
      const int64_t wanted = (bytes + options.partition_threshold_bytes - 1) /
                             options.partition_threshold_bytes;
      parts = std::min<int64_t>({int64_t{num_shards}, rows, wanted});
    }
    const int64_t row_bytes = rows == 0 ? 0 : bytes / rows;
    int64_t row = 0;
    for (int64_t j = 0; j < parts; ++j) {
      const int64_t part_rows = rows / parts + (j < rows % parts ? 1 : 0);
      VariableSlice slice;
      slice.name = parts == 1 ? var.name : absl::StrCat(var.name, "/part_", j);
      slice.variable = v;
      slice.shape = var.shape;
      if (parts > 1) slice.shape[0] = part_rows;
      slice.byte_offset = row * row_bytes;
      slice.num_bytes = parts == 1 ? bytes : part_rows * row_bytes;
      row += part_rows;
      placement.slices.push_back(std::move(slice));
    }
  }

  const int n = static_cast<int>(placement.slices.size());
  int64_t total_bytes = 0;
  for (const VariableSlice& slice : placement.slices) total_bytes += slice.num_bytes;
  std::vector<int64_t> shard_bytes(num_shards, 0);
  std::vector<bool> used(num_shards, false);  // By the current variable.
  int next_round_robin = 0;
  int64_t bytes_before = 0;  // kContiguous, kPrioritized: of the slices placed so far.
  // kPrioritized: where each shard's run ends, as a fraction of the bytes.
  std::vector<double> run_ends(num_shards);
  double weights = 0;
  for (int k = 0; k < num_shards; ++k) run_ends[k] = weights += 1 << std::min(k, 3);
  for (double& end : run_ends) end /= weights;
  for (int i = 0; i < n; ++i) {
    VariableSlice& slice = placement.slices[i];
    if (i == 0 || slice.variable != placement.slices[i - 1].variable) {
      std::fill(used.begin(), used.end(), false);
    }
    int shard = 0;
    if (options.strategy == PlacementStrategy::kRoundRobin) {
      shard = next_round_robin;
      next_round_robin = (next_round_robin + 1) % num_shards;
    } else if (options.strategy == PlacementStrategy::kContiguous ||
               options.strategy == PlacementStrategy::kPrioritized) {
      // The shard its middle byte falls in, but never behind the previous
      // slice's or more than one past it, and never so far back that the
      // slices left could not give every later shard one: no shard is left
      // empty while there are slices enough.
      const int previous = i == 0 ? -1 : placement.slices[i - 1].shard;
      const int64_t middle = bytes_before + slice.num_bytes / 2;
      if (total_bytes == 0) {
        shard = 0;
      } else if (options.strategy == PlacementStrategy::kContiguous) {
        shard = static_cast<int>(static_cast<double>(middle) * num_shards /
                                 static_cast<double>(total_bytes));
      } else {
        const double at = static_cast<double>(middle) / static_cast<double>(total_bytes);
        shard = static_cast<int>(std::upper_bound(run_ends.begin(), run_ends.end(), at) -
                                 run_ends.begin());
      }
      shard = std::min(shard, previous + 1);
      shard = std::max(shard, previous);
      if (n >= num_shards) shard = std::max(shard, num_shards - (n - i));
      shard = std::min(shard, num_shards - 1);
    } else {
      shard = -1;
      for (int k = 0; k < num_shards; ++k) {
        if (used[k]) continue;
        if (shard < 0 || shard_bytes[k] < shard_bytes[shard]) shard = k;
      }
    }
    used[shard] = true;
    bytes_before += slice.num_bytes;
    slice.shard = shard;
    shard_bytes[shard] += slice.num_bytes;
    placement.shard_slices[shard].push_back(i);
  }
  return placement;
}

}  // namespace psrt
