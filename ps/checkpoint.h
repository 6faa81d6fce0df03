// Shard checkpoints: one parameter-server shard's state at one step, on disk.
//
// Layout in a checkpoint directory (shared by the shards of a cluster, or
// one per machine):
//   model.ckpt-<step>.ps-<k>-of-<K>.safetensors   shard k's state at <step>
//   checkpoint.ps-<k>-of-<K>                      shard k's index
// k counts shards, not ps tasks: with S stripes per task (psrt_ps
// --ps_stripes) task t holds shards t*S .. t*S+S-1 of K = tasks * S.
// A shard file is safetensors (common/safetensors.h), loadable with the
// Python `safetensors` package. Tensors, for each variable slice NAME held by
// the shard: NAME (the values), NAME/<slot> for each optimizer slot (e.g.
// "fc/weights/Momentum") and NAME/ExponentialMovingAverage. For each
// embedding table T (ps/embedding_table.h) the shard holds, with R rows of
// dimension D: T/ids (I64 [R]: each id's 64 bits; row i is id i's),
// T/values (F32 [R, D]) and T/<slot> (F32 [R, D]) for each of the sparse
// optimizer's slots (e.g. "emb/Adagrad"), rows in the order they were made.
// __metadata__:
//   format       "psrt-shard-checkpoint-3" for a shard with tables,
//                "psrt-shard-checkpoint-1" without (as psrt wrote before
//                tables, so that such files stay readable to it); all read,
//                and "-2", tables whose rows were split by residues of the
//                hash (ShardState::tables_by_residue): restored onto its own
//                count, a shard gathers its rows from every shard's file
//   step, version, shard, num_shards (decimal)
//   slots        the optimizer slots' names, comma-separated
//   table_slots  the tables' optimizer slots' names, comma-separated
//   header       an InitHeader in protobuf text format: the TrainingConfig
//                (with the run_id of the training run the state belongs
//                to), the variables, the tables (TableMeta) and the model's
//                layout (ModelLayout: every variable, whole, and the
//                placement's options)
// plus the file's checksum; a file that fails it, is truncated or does not
// match the shard is refused with a clear error.
//
// The index is text, in save order (newest last), rewritten atomically
// after each save:
//   model.ckpt-1000.ps-0-of-2.safetensors
//   model.ckpt-2000.ps-0-of-2.safetensors
// Files are written to a temporary name, fsynced and renamed, so a crash
// never leaves a partial file under a real name; only the `keep` most
// recently saved checkpoints are kept.
//
// Resharding. A checkpoint restores onto the same number K of shards from
// each shard's own file, or onto another number K' from the files of all K,
// or onto K shards placed otherwise (another placement strategy or
// partition threshold) from the files of all K (ReadCheckpointForShard;
// they must then be in one directory): the layout
// says which slices of which variables each old file holds and each new
// shard is to hold (common/placement.h), and a table's rows are split by
// TableShardOf, by ranges of the ids' hashes, so that a new shard reads
// only the old files whose ranges meet its own (and those that hold slices
// of its variables). Rows, slots and moving averages come out as they were
// saved, and the version is the newest of the files read (in sync mode,
// every shard's is the same): a resharded sync job goes on exactly as the
// saving one would have. Ids waiting for admission are not saved, at any
// count: they start counting again.
#ifndef PSRT_PS_CHECKPOINT_H_
#define PSRT_PS_CHECKPOINT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/file_util.h"
#include "common/tensor.h"
#include "proto/psrt.pb.h"
#include "ps/embedding_table.h"

namespace psrt {

struct ShardCheckpointId {
  std::string dir;
  int shard = 0;
  int num_shards = 1;
};

// What a shard saves: views of its buffers (all of `num_elements` floats,
// variables back to back in `variables` order).
struct ShardStateView {
  proto::TrainingConfig config;
  std::vector<proto::VariableMeta> variables;
  int64_t version = 0;
  int64_t num_elements = 0;
  const float* values = nullptr;
  std::vector<std::pair<std::string, const float*>> slots;
  const float* average = nullptr;  // Null: no moving averages.
  proto::ModelLayout layout;  // As the chief's Init gave it; may be empty.
  // The embedding tables, whose rows are read while the file is written.
  // REQUIRES: no row changes until StartShardCheckpoint has returned.
  struct Table {
    proto::TableMeta meta;
    const EmbeddingTable* rows = nullptr;
  };
  std::vector<Table> tables;
};

// A loaded shard state.
struct ShardState {
  proto::TrainingConfig config;
  std::vector<proto::VariableMeta> variables;
  int64_t step = 0;
  int64_t version = 0;
  Tensor values;
  std::vector<std::pair<std::string, Tensor>> slots;
  Tensor average;  // Empty: no moving averages.
  proto::ModelLayout layout;  // Empty in a file psrt wrote before layouts.
  // A file of format 2: its tables' rows went to shards by residues of the
  // hash, not by ranges, so they are not all this shard's (but with one).
  bool tables_by_residue = false;
  // Gathered from the files of a job of this many shards (resharded); 0:
  // from the files of the shard's own count (its own file, or all of them
  // when cut anew for another placement).
  int resharded_from = 0;
  // An embedding table's rows: id ids[i] has row i of values and of each
  // slot (both [ids.size(), dim]).
  struct Table {
    proto::TableMeta meta;
    std::vector<uint64_t> ids;
    Tensor values;
    std::vector<std::pair<std::string, Tensor>> slots;  // table_slots' order.
  };
  std::vector<Table> tables;
};

// Writes the state as checkpoint `step`, appends it to the index and deletes
// the files of all but the `keep` (>= 1) most recently saved checkpoints,
// this one included, and `keep_step` (when it is held; -1: none). Recency is
// save order, not step: after a rollback to an older step, the abandoned
// newer ones go first. Returns the path. InvalidArgument when two tensors
// would have one name (a table T beside a variable named "T/values").
absl::StatusOr<std::string> WriteShardCheckpoint(const ShardCheckpointId& id,
                                                 int64_t step,
                                                 const ShardStateView& state,
                                                 int keep, int64_t keep_step = -1);

// WriteShardCheckpoint in two steps, for a shard that holds its lock while
// the state is read but not while the file is made durable: Start writes
// every byte under a temporary name (reading all of `state`), Finish syncs
// and renames the file, then updates the index and prunes. A pending
// checkpoint dropped unfinished leaves nothing behind.
struct PendingShardCheckpoint {
  ShardCheckpointId id;
  int64_t step = 0;
  std::unique_ptr<AtomicFile> file;
};
absl::StatusOr<PendingShardCheckpoint> StartShardCheckpoint(const ShardCheckpointId& id,
                                                            int64_t step,
                                                            const ShardStateView& state);
absl::StatusOr<std::string> FinishShardCheckpoint(PendingShardCheckpoint pending, int keep,
                                                  int64_t keep_step = -1);

// The steps the index lists, and those of shard files the index misses,
// newest first (empty when there is none).
std::vector<int64_t> ListShardCheckpoints(const ShardCheckpointId& id);

// A shard file of `id.dir` written by a job of another number of shards
// than id.num_shards (a name such as "model.ckpt-750.ps-0-of-4.safetensors"),
// or "" when there is none.
std::string OtherShardCountFile(const ShardCheckpointId& id);

// The checkpoints of `id.dir` saved by a job of another number of shards
// than id.num_shards whose every shard file is there, newest step first.
struct OtherCountCheckpoint {
  int num_shards = 0;
  int64_t step = 0;
};
std::vector<OtherCountCheckpoint> ListOtherCountCheckpoints(const ShardCheckpointId& id);

// The two layouts hold the same variables (names, dtypes, shapes), in the
// same order, however they place them.
bool SameVariables(const proto::ModelLayout& a, const proto::ModelLayout& b);

// Every step shard `id` can restore, newest first: its own
// (ListShardCheckpoints) and the other counts' (ListOtherCountCheckpoints).
std::vector<int64_t> ListRestorableCheckpoints(const ShardCheckpointId& id);

// The state shard id.shard of id.num_shards restores from checkpoint
// `step`: its own file's, or, when it has none, its part of the checkpoint a
// job of another number of shards saved at `step` (see "Resharding" above).
// With `layout` (the chief's: a job resumed with another --placement or
// --partition_threshold_bytes than the checkpoint's), its slices are those
// `layout` places on it, cut from the files of whichever count holds
// `step` (all of them, then, in id.dir); the variables must be the files'.
// A format-2 checkpoint's rows are gathered from every shard's file of its
// own count. ReadShardCheckpoint's errors, naming the file; InvalidArgument
// when the files disagree (another run, step or layout), when a file holds
// other slices than its layout places there, or when the checkpoint
// predates layouts (psrt wrote none before, format 2 included) and must be
// resharded.
absl::StatusOr<ShardState> ReadCheckpointForShard(const ShardCheckpointId& id, int64_t step,
                                                  const proto::ModelLayout* layout = nullptr);

// Reads checkpoint `step`. Errors name the file: NotFound, DataLoss for a
// corrupt file, InvalidArgument for one that belongs to another shard or
// step, or whose tensors do not match its header (naming the variable or
// the table: a missing tensor, ids and rows of different counts, NaN).
absl::StatusOr<ShardState> ReadShardCheckpoint(const ShardCheckpointId& id,
                                               int64_t step);

}  // namespace psrt

#endif  // PSRT_PS_CHECKPOINT_H_
