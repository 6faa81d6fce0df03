// EmbeddingTable: a parameter server's rows of one sparse table (design.md,
// "Sparse embedding tables"): the rows whose ids TableShardOf sends to this
// shard, keyed by 64-bit id, with no vocabulary. A row is made on first
// touch: its values drawn from a normal of stddev 1 / sqrt(dim), truncated
// at two standard deviations (TensorFlow's embedding_column default), or
// zeros (`zero_rows`: a linear model's per-id weights),
// seeded by the table's seed and the id alone, so that a run is
// reproducible whichever shard holds the row and whenever it is first
// touched; its optimizer slots start at the rule's initial values
// (Adagrad's accumulator at 0.1). Apply runs the dense optimizer's rule
// (ps/optimizer.h, TensorFlow's semantics: SGD, Momentum, Adagrad, RMSProp,
// Adam, FTRL-proximal) on the rows it names and on no other: lazy, as
// TensorFlow's SparseApply* and LazyAdam are (Adam's bias correction
// follows the global step).
//
// Memory: a row is dim floats of values and dim per slot, kept in chunks of
// 4096 rows that never move as the table grows; an open-addressing map
// from id to row number adds about 16 to 40 bytes a row (bytes()).
//
// Thread safety: thread-safe (one mutex per table).
#ifndef PSRT_PS_EMBEDDING_TABLE_H_
#define PSRT_PS_EMBEDDING_TABLE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "proto/psrt.pb.h"
#include "ps/optimizer.h"

namespace psrt {

// The shard of `num_shards` that holds `id` in every table: a mix of all
// the id's bits, so that ids differing only in their high bits (Criteo's
// field keys) spread evenly. Every worker computes the same.
int TableShardOf(uint64_t id, int num_shards);

class EmbeddingTable {
 public:
  // InvalidArgument for dim < 1 or an empty name; `optimizer`'s errors
  // (common/training_config.h) otherwise.
  static absl::StatusOr<std::unique_ptr<EmbeddingTable>> Create(
      std::string name, int dim, uint64_t seed, const proto::TrainingConfig& optimizer,
      bool zero_rows = false);

  const std::string& name() const { return name_; }
  int dim() const { return dim_; }

  // out[i * dim .. ) = the values of row ids[i], made if missing, or with
  // `make_missing` false, a missing row's initial values without making it
  // (an evaluation's look-ups do not grow the table).
  // InvalidArgument when out.size() != ids.size() * dim.
  absl::Status Lookup(absl::Span<const uint64_t> ids, absl::Span<float> out,
                      bool make_missing = true);

  // One update of global step `step`: row ids[i] takes grads[i * dim .. )
  // through the optimizer's rule (made first if missing). Nothing changes
  // when the call is refused: InvalidArgument for a size mismatch,
  // FailedPrecondition when the update would make a value or slot NaN or
  // infinite. REQUIRES: ids distinct (ShardTables::Check refuses a push
  // that names one twice; a sum holds each once): one named twice would be
  // updated twice.
  absl::Status Apply(int64_t step, absl::Span<const uint64_t> ids,
                     absl::Span<const float> grads);

  int64_t rows() const;
  // Bytes held: the rows' chunks and the id map.
  int64_t bytes() const;
  // A row's values and slots: (1 + slots) * dim floats.
  int64_t payload_bytes_per_row() const {
    return static_cast<int64_t>(row_floats_) * sizeof(float);
  }
  // The slot names of the optimizer ("Adagrad", "Adam", "Adam_1", ...).
  std::vector<std::string> slot_names() const;

  // Calls f(id, row) for every row in the order they were made; row holds
  // the values, then each slot (payload_bytes_per_row() / 4 floats).
  // For checkpoints; the table is locked meanwhile.
  void ForEachRow(const std::function<void(uint64_t, absl::Span<const float>)>& f) const;
  // Restores a row as ForEachRow gave it: `row` holds the values, then each
  // slot. InvalidArgument naming the table for a row of another size or an
  // id the table holds already.
  absl::Status Insert(uint64_t id, absl::Span<const float> row);

 private:
  EmbeddingTable(std::string name, int dim, uint64_t seed, bool zero_rows,
                 std::unique_ptr<Optimizer> optimizer);
  // The row of `id`, made if missing.
  float* RowLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new row for `id`, its contents unset. REQUIRES: `id` has none.
  float* NewRowLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new row's initial values and slots into `row`.
  void InitRow(uint64_t id, float* row) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  float* RowAt(int64_t row) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const std::string name_;
  const int dim_;
  const uint64_t seed_;
  const bool zero_rows_;
  const int row_floats_;
  mutable absl::Mutex mu_;
  const std::unique_ptr<Optimizer> optimizer_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, int64_t> index_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> ids_ ABSL_GUARDED_BY(mu_);  // Row r's id.
  std::vector<std::unique_ptr<float[]>> chunks_ ABSL_GUARDED_BY(mu_);
  // The rows of `ids` into found_ (null: none yet), their map slots and
  // rows prefetched.
  void FindRowsLocked(absl::Span<const uint64_t> ids) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<float*> found_ ABSL_GUARDED_BY(mu_);
  // Apply's: the rows' contents before the update, the rows updated (null:
  // made by it), a row's slots.
  std::vector<float> undo_ ABSL_GUARDED_BY(mu_);
  std::vector<float*> updated_ ABSL_GUARDED_BY(mu_);
  std::vector<float*> slots_ ABSL_GUARDED_BY(mu_);
};

}  // namespace psrt

#endif  // PSRT_PS_EMBEDDING_TABLE_H_
