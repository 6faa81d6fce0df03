// ShardTables: one ps shard's part of every embedding table of the job
// (ps/embedding_table.h), and what pushes and pulls do with it
// (proto/psrt.proto's TableMeta, SparseIds and SparseSegment).
//
// A push's sparse part follows its dense gradients in the message: per
// segment, num_ids ids (uint64) and then num_ids gradient rows (float32).
// Check refuses a malformed part before anything is applied; in sync mode
// Accumulate sums each id's rows over the version's accepted pushes and
// ApplySums applies their mean once, as the update of that version; in
// async mode Apply applies a push's rows on arrival. A pull's rows come
// from Lookup, in the order its ids were asked, after the dense values.
//
// A table's update is all or nothing (EmbeddingTable::Apply), but one
// update of several tables is not: when a later table's update would
// overflow, the earlier ones stay applied and the call fails, naming it.
//
// Thread safety: not thread-safe; the shard calls it under its lock (the
// tables lock themselves too).
#ifndef PSRT_PS_SHARD_TABLES_H_
#define PSRT_PS_SHARD_TABLES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/byte_source.h"
#include "proto/psrt.pb.h"
#include "ps/embedding_table.h"

namespace psrt {

class ShardTables {
 public:
  using Metas = google::protobuf::RepeatedPtrField<proto::TableMeta>;
  using Segments = google::protobuf::RepeatedPtrField<proto::SparseSegment>;

  // The most ids one message may carry per table (a push or a pull's
  // request): 4M, far above any batch's.
  static constexpr int64_t kMaxIds = int64_t{1} << 22;

  // The tables of an Init, with `config`'s sparse_optimizer and
  // sparse_learning_rate (the dense ones where unset) and its admission and
  // eviction (RowPolicyFromConfig). InvalidArgument for an empty or
  // repeated name, a dim outside 1..65536, or a bad policy.
  static absl::StatusOr<std::unique_ptr<ShardTables>> Create(const Metas& tables,
                                                             const proto::TrainingConfig& config);

  // Takes `config`'s sparse rule and row policy, as Create does, for the
  // rows held and to come (EmbeddingTable::Reconfigure, whose errors it
  // returns; the tables share both, so a refusal comes before any change).
  // At global step `step`.
  absl::Status Reconfigure(const proto::TrainingConfig& config, int64_t step);

  // Whether `tables` are the ones held (names, dims and seeds, in order).
  bool Same(const Metas& tables) const;
  bool empty() const { return tables_.empty(); }

  // The bytes a push's segments take after its dense gradients.
  // InvalidArgument naming the table: an unknown table, one named twice, a
  // count outside 0..kMaxIds.
  absl::StatusOr<uint64_t> PushBytes(const Segments& segments) const;
  // The most bytes a push's sparse part may take (kMaxIds rows of each table).
  uint64_t max_push_bytes() const;

  // Refuses a push's sparse part (segments at `offset` of `data`, sized by
  // PushBytes) that names an id twice in one table: InvalidArgument naming
  // the table. Sets *nonfinite_table to the first table whose gradient rows
  // hold NaN or Inf ("" when none): the shard refuses or drops such a push
  // as it does dense gradients that hold them.
  absl::Status Check(const Segments& segments, const ByteSource& data, uint64_t offset,
                     std::string* nonfinite_table) const;

  // Sync: adds the push's rows into the sums of the version being built.
  void Accumulate(const Segments& segments, const ByteSource& data, uint64_t offset);
  // Sync: applies the sums times `scale` as the update of global step
  // `step`, then clears them (whatever the outcome), then evicts
  // (EmbeddingTable::Evict).
  absl::Status ApplySums(int64_t step, float scale);
  void ClearSums();
  // Async (and sync with one replica to aggregate): applies the push's rows
  // as the update of global step `step`, then evicts.
  absl::Status Apply(int64_t step, const Segments& segments, const ByteSource& data,
                     uint64_t offset);

  // InvalidArgument naming the table when a pull asks for rows of a table
  // this shard lacks, or for more than kMaxIds ids of one.
  absl::Status CheckLookup(
      const google::protobuf::RepeatedPtrField<proto::SparseIds>& asked) const;
  // The rows of the ids `asked` (per table), made where missing unless
  // `make_missing` is false (EmbeddingTable::Lookup: a training look-up at
  // global step `step`): one segment per table appended to `header`, its
  // rows to `rows`. InvalidArgument naming the table: unknown, or more than
  // kMaxIds ids.
  absl::Status Lookup(const google::protobuf::RepeatedPtrField<proto::SparseIds>& asked,
                      proto::PullHeader* header, std::vector<float>* rows, bool make_missing,
                      int64_t step);

  // Appends each table's rows, bytes and drops (EmbeddingTable::Stats) to
  // `status`.
  void AddStatus(proto::StatusResponse* status) const;

  // For checkpoints: the tables in Init's order (t < num_tables()).
  int num_tables() const { return static_cast<int>(tables_.size()); }
  const proto::TableMeta& meta(int t) const { return tables_[t].meta; }
  EmbeddingTable* rows(int t) const { return tables_[t].rows.get(); }

 private:
  struct Table {
    proto::TableMeta meta;
    std::unique_ptr<EmbeddingTable> rows;
    // Sync: the version's sum of gradient rows, per distinct id.
    absl::flat_hash_map<uint64_t, int64_t> sum_index;
    std::vector<uint64_t> sum_ids;
    std::vector<float> sums;
  };
  // The index of the table named `name` in tables_, or -1; or the table, or null.
  int IndexOf(const std::string& name) const;
  const Table* Find(const std::string& name) const;
  // Calls f(t, ids, grads) for each segment of a push (t: its table's
  // index), its ids and rows read from `data` into buffers of the object's.
  template <class F>
  void ForEachSegment(const Segments& segments, const ByteSource& data, uint64_t offset,
                      F&& f) const;

  std::vector<Table> tables_;
  // Scratch for reading a push's segments, reused.
  mutable std::vector<uint64_t> ids_;
  mutable std::vector<float> grads_;
};

}  // namespace psrt

#endif  // PSRT_PS_SHARD_TABLES_H_
