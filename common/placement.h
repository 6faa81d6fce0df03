// Placement: which parameter-server shard holds which variable, or which
// slice of a large variable.
//
// A pure function of (variable list, number of shards, options): every worker
// computes the same placement without talking to anyone, and the chief
// registers exactly these slices on the shards.
//
// Partitioning: a variable of more than `partition_threshold_bytes` bytes
// (and at least two rows) is cut along dimension 0 into
//   P = min(num_shards, rows, ceil(bytes / partition_threshold_bytes))
// slices of nearly equal row counts (the first rows % P slices get one extra
// row), named "<name>/part_<j>" as in TensorFlow's partitioned variables. The
// slices of one variable land on distinct shards. Since the data is row-major,
// each slice is one contiguous byte range of the variable.
//
// Strategies: kRoundRobin hands slices to shards in turn, in variable order
// (TensorFlow's replica_device_setter); kGreedyByBytes gives each slice to
// the shard holding the fewest bytes so far (ties: the lowest shard index);
// kContiguous cuts the slices, in variable order, into num_shards runs of
// about equal bytes (a slice goes to the shard its middle byte falls in,
// but no shard stays empty while there are as many slices as shards), so
// that a shard holds neighbouring layers: the first layers' shard is then
// complete early in the forward pass and the last layers' early in the
// backward pass, which lets a worker overlap their transfer with compute
// (worker/training/step_pipeline.h). Under kContiguous two slices of one variable
// may share a shard. kPrioritized is kContiguous with runs that grow from
// the first layers: shard k's share of the bytes is in proportion to
// 2^min(k, 3) (1, 2, 4, then 8), as P3 prioritizes the first layers: their
// shard is pushed last in the backward pass and needed first in the
// forward pass, so its push, update and pull are the part of a step's
// communication that no compute hides; the smaller it is, the less shows.
#ifndef PSRT_COMMON_PLACEMENT_H_
#define PSRT_COMMON_PLACEMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tensor.h"

namespace psrt {

enum class PlacementStrategy { kRoundRobin, kGreedyByBytes, kContiguous, kPrioritized };

// "round_robin", "greedy", "contiguous" or "prioritized"; an unknown name
// is InvalidArgument.
absl::StatusOr<PlacementStrategy> ParsePlacementStrategy(absl::string_view name);
// The name ParsePlacementStrategy takes.
const char* PlacementStrategyName(PlacementStrategy strategy);

struct PlacementOptions {
  PlacementStrategy strategy = PlacementStrategy::kRoundRobin;
  int64_t partition_threshold_bytes = 1 << 20;
};

struct VariableSlice {
  std::string name;      // Name on the shard: "w" or "w/part_1".
  int variable = 0;      // Index into the variable list.
  Shape shape;           // The slice's own shape.
  int64_t byte_offset = 0;  // Start within the variable's float32 data.
  int64_t num_bytes = 0;
  int shard = 0;
};

struct Placement {
  int num_shards = 0;
  std::vector<VariableSlice> slices;  // Variable order, then part order.
  // shard_slices[k]: indices into `slices` held by shard k, ascending. This
  // is also the order of variables in every message to and from shard k.
  std::vector<std::vector<int>> shard_slices;
};

// REQUIRES nothing: bad input (no shards, empty name, duplicate name,
// negative dimension) is InvalidArgument naming it.
absl::StatusOr<Placement> ComputePlacement(
    const std::vector<VariableDef>& variables, int num_shards,
    const PlacementOptions& options);

}  // namespace psrt

#endif  // PSRT_COMMON_PLACEMENT_H_
