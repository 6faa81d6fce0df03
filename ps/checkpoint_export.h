// Checkpoint export: the shards of one checkpoint (ps/checkpoint.h) merged
// into the model's variables, and written as one safetensors file
// (common/safetensors.h) that PyTorch, NumPy or TensorFlow users load
// without psrt.
//
// Merging: every shard file of the step is read; a variable partitioned by
// placement (common/placement.h) into slices "<name>/part_<j>" is
// reassembled as "<name>" by concatenating parts 0..P-1 in order along
// dimension 0 (all present, same trailing dimensions); a whole variable is
// copied as it is. Optimizer slots are not exported. With `moving_average`
// the moving averages are exported instead of the values, under the plain
// variable names (TensorFlow's ema.variables_to_restore()). An embedding
// table T is gathered from every shard (each holds the rows of its ids) as
// T/ids (I64 [N]: each id's 64 bits) and T/values (F32 [N, dim]): shard 0's
// rows, then shard 1's, and so on; its values also with `moving_average`
// (tables keep no moving averages).
//
// The exported file: the variables sorted by name, then the tables' ids and
// values by table name, and __metadata__
//   global_step  the checkpoint's step (decimal)
//   source       "<dir>/model.ckpt-<step>, <K> shards" plus ", moving averages"
// It is written only after every shard has been read and merged, to a
// temporary name renamed into place, so an error never leaves partial output.
//
// Thread safety: the functions share no state; each reads its own files.
#ifndef PSRT_PS_CHECKPOINT_EXPORT_H_
#define PSRT_PS_CHECKPOINT_EXPORT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor.h"

namespace psrt {

struct CheckpointExportOptions {
  std::string checkpoint_dir;
  // The checkpoint to export; < 0: the newest step listed in every shard's
  // index.
  int64_t step = -1;
  // Shards of the cluster that wrote it; 0: discovered from the index files
  // "checkpoint.ps-<k>-of-<K>" in checkpoint_dir.
  int num_shards = 0;
  // Export the moving averages instead of the values.
  bool moving_average = false;
};

// An embedding table gathered over the shards: id ids[i] has row i.
struct MergedTable {
  std::string name;
  std::vector<int64_t> ids;
  Tensor values;  // [ids.size(), dim]
};

struct MergedCheckpoint {
  int64_t step = 0;
  int num_shards = 0;
  std::vector<std::pair<std::string, Tensor>> variables;  // Sorted by name.
  std::vector<MergedTable> tables;                        // Sorted by name.
};

// K from the index files "checkpoint.ps-<k>-of-<K>" in `dir`. Where they
// name several counts (a job resumed with another number of ps tasks), the
// one whose NewestCommonStep is the newest. NotFound when there is none,
// InvalidArgument when two counts tie or none has a step that all its
// shards list (naming every count).
absl::StatusOr<int> DiscoverNumShards(const std::string& dir);

// The newest step listed in the index of every shard 0..num_shards-1.
// NotFound (listing each shard's steps) when no step is common to all.
absl::StatusOr<int64_t> NewestCommonStep(const std::string& dir, int num_shards);

// Reads and merges the checkpoint. Errors name the file or variable:
// NotFound for a missing shard file, DataLoss for a corrupt one (as
// ReadShardCheckpoint reports them), InvalidArgument for slices that do not
// form whole variables (a missing part, mismatched trailing dimensions, a
// name held twice; a table some shard lacks, or whose dimension differs
// between shards), FailedPrecondition for `moving_average` when a shard
// keeps none.
absl::StatusOr<MergedCheckpoint> MergeShardCheckpoints(
    const CheckpointExportOptions& options);

// Writes a merged checkpoint (of `options`, which the file's metadata
// names) to `out_path` as safetensors (see the top of this file).
absl::Status WriteMergedCheckpoint(const MergedCheckpoint& merged,
                                   const CheckpointExportOptions& options,
                                   const std::string& out_path);

// MergeShardCheckpoints, then WriteMergedCheckpoint. Returns what was
// written.
absl::StatusOr<MergedCheckpoint> ExportCheckpoint(
    const CheckpointExportOptions& options, const std::string& out_path);

}  // namespace psrt

#endif  // PSRT_PS_CHECKPOINT_EXPORT_H_
