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
//   format       "psrt-shard-checkpoint-2" for a shard with tables,
//                "psrt-shard-checkpoint-1" without (as psrt wrote before
//                tables, so that such files stay readable to it); both read
//   step, version, shard, num_shards (decimal)
//   slots        the optimizer slots' names, comma-separated
//   table_slots  the tables' optimizer slots' names, comma-separated
//   header       an InitHeader in protobuf text format: the TrainingConfig
//                (with the run_id of the training run the state belongs
//                to), the variables and the tables (TableMeta)
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
// A checkpoint restores onto a shard of the same number K: the tables' rows
// are split by TableShardOf(id, K), as the dense slices are by placement.
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

// Reads checkpoint `step`. Errors name the file: NotFound, DataLoss for a
// corrupt file, InvalidArgument for one that belongs to another shard or
// step, or whose tensors do not match its header (naming the variable or
// the table: a missing tensor, ids and rows of different counts, NaN).
absl::StatusOr<ShardState> ReadShardCheckpoint(const ShardCheckpointId& id,
                                               int64_t step);

}  // namespace psrt

#endif  // PSRT_PS_CHECKPOINT_H_
