#include "common/placement.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"

namespace psrt {

absl::StatusOr<PlacementStrategy> ParsePlacementStrategy(absl::string_view name) {
  if (name == "round_robin") return PlacementStrategy::kRoundRobin;
  if (name == "greedy") return PlacementStrategy::kGreedyByBytes;
  if (name == "contiguous") return PlacementStrategy::kContiguous;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown placement strategy \"", name, "\" (known: round_robin, greedy, contiguous)"));
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
  std::vector<int64_t> shard_bytes(num_shards, 0);
  std::set<std::string> names;
  int next_round_robin = 0;
  int64_t total_bytes = 0;   // kContiguous: of the whole model,
  int64_t bytes_before = 0;  // and before the slice being placed.
  for (const VariableDef& var : variables) {
    int64_t elements = 1;
    for (int64_t d : var.shape) elements *= std::max<int64_t>(d, 0);
    total_bytes += elements * int64_t{sizeof(float)};
  }

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
    std::vector<bool> used(num_shards, false);
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

      int shard = 0;
      if (options.strategy == PlacementStrategy::kRoundRobin) {
        shard = next_round_robin;
        next_round_robin = (next_round_robin + 1) % num_shards;
      } else if (options.strategy == PlacementStrategy::kContiguous) {
        const int64_t middle = bytes_before + slice.num_bytes / 2;
        shard = total_bytes == 0
                    ? 0
                    : std::min(num_shards - 1,
                               static_cast<int>(static_cast<double>(middle) * num_shards /
                                                static_cast<double>(total_bytes)));
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
      placement.shard_slices[shard].push_back(
          static_cast<int>(placement.slices.size()));
      placement.slices.push_back(std::move(slice));
    }
  }
  return placement;
}

}  // namespace psrt
