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
// Admission and eviction (RowPolicy, docs/sparse.md "Sizing a table"): an
// id may get its row only at its Nth training look-up, or with a
// probability at each; the look-ups of one global step count as one, and
// all get the first's answer (sync workers' pulls of a step, in whatever
// order). Until then it reads zeros (one default row shared by every such
// id) and its gradient rows are dropped and counted. A row that
// no training look-up or update has touched for ttl_steps steps is
// dropped (by Evict, after an update), and past max_rows the least
// recently touched are dropped (down to 15/16 of max_rows, so that the
// selection, a pass over the rows, runs once per max_rows/16 new rows) by
// the look-up or update that made one too many: a table holds at most
// max_rows rows but while a single look-up asks for more. An id that comes
// back starts afresh from its initial values.
//
// Memory: a row is dim floats of values and dim per slot, kept in chunks of
// 4096 rows that never move as the table grows (an evicted row's place is
// reused); an open-addressing map from id to row number adds about 16 to 40
// bytes a row, eviction 8 (the step a row was last touched), admission about
// 30 per id waiting for its row (bytes()).
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

// The shard of `num_shards` that holds `id` in every table. The id's 64
// bits are mixed (SplitMix64, so that ids differing only in their high bits,
// Criteo's field keys, spread evenly) into a hash h, and shard k holds the
// hashes of [k, k + 1) * 2^64 / num_shards: ranges, not residues, so that a
// checkpoint's rows go to another number of shards by ranges too (shard k
// of K draws from the few shards of the old count whose range meets its
// own: TableShardsOverlap). Every worker computes the same.
int TableShardOf(uint64_t id, int num_shards);
// Whether shard `a` of `num_a` and shard `b` of `num_b` may hold one id.
bool TableShardsOverlap(int a, int num_a, int b, int num_b);

// How a table admits and evicts rows; the default admits every id at once
// and keeps every row.
struct RowPolicy {
  int admit_count = 0;            // > 1: a row at the id's Nth training look-up.
  double admit_probability = 1;   // < 1: a row at each look-up with this chance.
  int64_t ttl_steps = 0;          // > 0: rows untouched this many steps dropped.
  int64_t max_rows = 0;           // > 0: at most this many rows, LRU.

  bool admits_every_id() const { return admit_count <= 1 && admit_probability >= 1; }
  bool evicts() const { return ttl_steps > 0 || max_rows > 0; }
};

// The policy of TrainingConfig's embedding_* fields; InvalidArgument naming
// the field for a negative value, a probability outside [0, 1], or both a
// count and a probability.
absl::StatusOr<RowPolicy> RowPolicyFromConfig(const proto::TrainingConfig& config);

class EmbeddingTable {
 public:
  // InvalidArgument for dim < 1 or an empty name; `optimizer`'s errors
  // (common/training_config.h) otherwise.
  static absl::StatusOr<std::unique_ptr<EmbeddingTable>> Create(
      std::string name, int dim, uint64_t seed, const proto::TrainingConfig& optimizer,
      bool zero_rows = false, RowPolicy policy = {});

  // What a table holds and has dropped.
  struct Stats {
    int64_t rows = 0;
    int64_t bytes = 0;
    int64_t evicted_rows = 0;          // Ever, for age or the budget.
    int64_t unadmitted_gradients = 0;  // Gradient rows of ids without a row.
    int64_t candidates = 0;            // Ids looked up, waiting for a row.
  };

  const std::string& name() const { return name_; }
  int dim() const { return dim_; }

  // out[i * dim .. ) = the values of row ids[i]. A training look-up
  // (`make_missing`, at global step `step`) makes a missing row, or under
  // admission counts the id's look-up and reads zeros until it is admitted,
  // and marks the rows touched at `step`. Otherwise (an evaluation's) a
  // missing row reads its initial values, or zeros under admission, and
  // nothing changes. InvalidArgument when out.size() != ids.size() * dim.
  absl::Status Lookup(absl::Span<const uint64_t> ids, absl::Span<float> out,
                      bool make_missing = true, int64_t step = 0);

  // One update of global step `step`: row ids[i] takes grads[i * dim .. )
  // through the optimizer's rule (made first if missing; under admission,
  // the gradient of an id without a row is dropped and counted). Nothing
  // changes when the call is refused: InvalidArgument for a size mismatch,
  // FailedPrecondition when the update would make a value or slot NaN or
  // infinite. REQUIRES: ids distinct (ShardTables::Check refuses a push
  // that names one twice; a sum holds each once): one named twice would be
  // updated twice.
  absl::Status Apply(int64_t step, absl::Span<const uint64_t> ids,
                     absl::Span<const float> grads);

  // Drops, at global step `step`, the rows the policy says to (above), and
  // the ids waiting for admission that no look-up has named for ttl_steps
  // (65536 without a ttl). The age sweep runs every 1/16 of that (at least
  // every step).
  void Evict(int64_t step);

  int64_t rows() const;
  // Bytes held: the rows' chunks, the id map, the rows' last steps and the
  // ids waiting for admission.
  int64_t bytes() const;
  Stats stats() const;
  // A row's values and slots: (1 + slots) * dim floats.
  int64_t payload_bytes_per_row() const {
    return static_cast<int64_t>(row_floats_) * sizeof(float);
  }
  // The slot names of the optimizer ("Adagrad", "Adam", "Adam_1", ...).
  std::vector<std::string> slot_names() const;

  // Calls f(id, row) for every row in the order they were made (a row made
  // in an evicted row's place comes in that place); row holds the values,
  // then each slot (payload_bytes_per_row() / 4 floats).
  // For checkpoints; the table is locked meanwhile.
  void ForEachRow(const std::function<void(uint64_t, absl::Span<const float>)>& f) const;
  // Takes `optimizer`'s hyperparameters (the same rule, hence the same
  // slots: InvalidArgument naming the table otherwise) and `policy` for the
  // rows held and to come, as a job resumed with other flags asks; rows
  // kept under a new eviction count as touched at `step`. A table that has
  // evicted rows cannot stop evicting (FailedPrecondition naming it). REQUIRES: no
  // other call on the table meanwhile (it reads the policy unlocked).
  absl::Status Reconfigure(const proto::TrainingConfig& optimizer, RowPolicy policy,
                           int64_t step);

  // Restores a row as ForEachRow gave it: `row` holds the values, then each
  // slot; touched at `step` (the checkpoint's). InvalidArgument naming the
  // table for a row of another size or an id the table holds already.
  absl::Status Insert(uint64_t id, absl::Span<const float> row, int64_t step = 0);

 private:
  EmbeddingTable(std::string name, int dim, uint64_t seed, bool zero_rows,
                 std::unique_ptr<Optimizer> optimizer, RowPolicy policy);
  // The number of a new row for `id`, touched at `step`, its contents unset
  // (an evicted row's place if there is one). REQUIRES: `id` has none.
  int64_t NewRowLocked(uint64_t id, int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops row number `row`: its id forgets it and its place is reused.
  void RemoveRowLocked(int64_t row) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a training look-up of `id`, which has no row: whether it is
  // admitted now (then it is no longer waiting).
  bool AdmitLocked(uint64_t id, int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the least recently touched rows when there are more than the
  // budget, down to 15/16 of it.
  void EnforceBudgetLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t RowsLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  int64_t BytesLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // A new row's initial values and slots into `row`.
  void InitRow(uint64_t id, float* row) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  float* RowAt(int64_t row) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const std::string name_;
  const int dim_;
  const uint64_t seed_;
  const bool zero_rows_;
  const int row_floats_;
  RowPolicy policy_;
  mutable absl::Mutex mu_;
  std::unique_ptr<Optimizer> optimizer_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, int64_t> index_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> ids_ ABSL_GUARDED_BY(mu_);  // Row r's id.
  std::vector<std::unique_ptr<float[]>> chunks_ ABSL_GUARDED_BY(mu_);
  // With eviction: the step row r was last touched, -1 for a dropped row's
  // place; those places, to reuse.
  std::vector<int64_t> touched_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> free_rows_ ABSL_GUARDED_BY(mu_);
  int64_t next_sweep_ ABSL_GUARDED_BY(mu_) = 0;
  // With admission: the ids waiting for a row.
  struct Candidate {
    int32_t lookups = 0;
    int64_t last_step = 0;
  };
  absl::flat_hash_map<uint64_t, Candidate> candidates_ ABSL_GUARDED_BY(mu_);
  int64_t evicted_rows_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t unadmitted_gradients_ ABSL_GUARDED_BY(mu_) = 0;
  // The row numbers of `ids` into found_rows_ (-1: none), their map slots
  // and rows prefetched.
  void FindRowsLocked(absl::Span<const uint64_t> ids) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Prefetches the row found_rows_[i] names, if any (a few ids ahead of
  // the one being read or updated).
  void PrefetchRowLocked(size_t i) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  std::vector<int64_t> found_rows_ ABSL_GUARDED_BY(mu_);
  // Apply's: the rows' contents before the update, the rows updated (null:
  // made by it, or not admitted), the rows it made, a row's slots.
  std::vector<float> undo_ ABSL_GUARDED_BY(mu_);
  std::vector<float*> updated_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> made_ ABSL_GUARDED_BY(mu_);
  std::vector<float*> slots_ ABSL_GUARDED_BY(mu_);
  // EnforceBudgetLocked's scratch.
  std::vector<int64_t> steps_ ABSL_GUARDED_BY(mu_);
};

}  // namespace psrt

#endif  // PSRT_PS_EMBEDDING_TABLE_H_
