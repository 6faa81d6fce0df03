#include "ps/shard_tables.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/training_config.h"
#include "kernels/elementwise.h"

namespace psrt {
namespace {

constexpr int kMaxDim = 1 << 16;

}  // namespace

absl::StatusOr<std::unique_ptr<ShardTables>> ShardTables::Create(
    const Metas& tables, const proto::TrainingConfig& config) {
  ASSIGN_OR_RETURN(const proto::TrainingConfig rule, SparseTrainingConfig(config));
  ASSIGN_OR_RETURN(const RowPolicy policy, RowPolicyFromConfig(config));
  auto held = std::unique_ptr<ShardTables>(new ShardTables());
  std::set<std::string> names;
  for (const proto::TableMeta& meta : tables) {
    if (meta.name().empty() || !names.insert(meta.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("init: empty or repeated table name \"", meta.name(), "\""));
    }
    if (meta.dim() < 1 || meta.dim() > kMaxDim) {
      return absl::InvalidArgumentError(absl::StrCat("init: table \"", meta.name(),
                                                     "\" has dimension ", meta.dim(),
                                                     ", want 1..", kMaxDim));
    }
    Table table;
    table.meta = meta;
    ASSIGN_OR_RETURN(table.rows, EmbeddingTable::Create(meta.name(), meta.dim(), meta.seed(), rule,
                                                        meta.zero_rows(), policy));
    held->tables_.push_back(std::move(table));
  }
  return held;
}

absl::Status ShardTables::Reconfigure(const proto::TrainingConfig& config, int64_t step) {
  ASSIGN_OR_RETURN(const proto::TrainingConfig rule, SparseTrainingConfig(config));
  ASSIGN_OR_RETURN(const RowPolicy policy, RowPolicyFromConfig(config));
  for (Table& table : tables_) RETURN_IF_ERROR(table.rows->Reconfigure(rule, policy, step));
  return absl::OkStatus();
}

bool ShardTables::Same(const Metas& tables) const {
  if (tables.size() != static_cast<int>(tables_.size())) return false;
  for (int i = 0; i < tables.size(); ++i) {
    const proto::TableMeta& held = tables_[i].meta;
    if (held.name() != tables[i].name() || held.dim() != tables[i].dim() ||
        held.seed() != tables[i].seed() || held.zero_rows() != tables[i].zero_rows()) {
      return false;
    }
  }
  return true;
}

int ShardTables::IndexOf(const std::string& name) const {
  for (size_t t = 0; t < tables_.size(); ++t) {
    if (tables_[t].meta.name() == name) return static_cast<int>(t);
  }
  return -1;
}

const ShardTables::Table* ShardTables::Find(const std::string& name) const {
  const int t = IndexOf(name);
  return t < 0 ? nullptr : &tables_[t];
}

absl::StatusOr<uint64_t> ShardTables::PushBytes(const Segments& segments) const {
  uint64_t bytes = 0;
  std::set<std::string> seen;
  for (const proto::SparseSegment& segment : segments) {
    const Table* table = Find(segment.table());
    if (table == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("push: no embedding table \"", segment.table(), "\" on this shard"));
    }
    if (!seen.insert(segment.table()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("push: table \"", segment.table(), "\" named twice"));
    }
    if (segment.num_ids() < 0 || segment.num_ids() > kMaxIds) {
      return absl::InvalidArgumentError(absl::StrCat("push: table \"", segment.table(), "\": ",
                                                     segment.num_ids(), " ids, want 0..",
                                                     kMaxIds));
    }
    bytes += static_cast<uint64_t>(segment.num_ids()) *
             (sizeof(uint64_t) + table->meta.dim() * sizeof(float));
  }
  return bytes;
}

uint64_t ShardTables::max_push_bytes() const {
  uint64_t bytes = 0;
  for (const Table& table : tables_) {
    bytes += kMaxIds * (sizeof(uint64_t) + table.meta.dim() * sizeof(float));
  }
  return bytes;
}

template <class F>
void ShardTables::ForEachSegment(const Segments& segments, const ByteSource& data,
                                 uint64_t offset, F&& f) const {
  for (const proto::SparseSegment& segment : segments) {
    const int t = IndexOf(segment.table());
    const Table& table = tables_[t];
    const size_t n = static_cast<size_t>(segment.num_ids());
    const size_t floats = n * table.meta.dim();
    // The ids are copied (they follow float32 data: 8-byte alignment is not
    // guaranteed), the rows read in place where the message is in one piece.
    ids_.resize(n);
    data.ReadAt(offset, {reinterpret_cast<char*>(ids_.data()), n * sizeof(uint64_t)});
    offset += n * sizeof(uint64_t);
    const char* in_place = data.InPlace(offset, floats * sizeof(float));
    const float* rows = reinterpret_cast<const float*>(in_place);
    if (in_place == nullptr || reinterpret_cast<uintptr_t>(in_place) % alignof(float) != 0) {
      grads_.resize(floats);
      data.ReadAt(offset, {reinterpret_cast<char*>(grads_.data()), floats * sizeof(float)});
      rows = grads_.data();
    }
    offset += floats * sizeof(float);
    f(t, absl::MakeConstSpan(ids_), absl::MakeConstSpan(rows, floats));
  }
}

absl::Status ShardTables::Check(const Segments& segments, const ByteSource& data,
                                uint64_t offset, std::string* nonfinite_table) const {
  nonfinite_table->clear();
  absl::Status status;
  std::vector<uint64_t> sorted;
  std::vector<uint64_t> checked;  // The ids of the segment before, found distinct.
  ForEachSegment(segments, data, offset,
                 [&](int t, absl::Span<const uint64_t> ids, absl::Span<const float> grads) {
                   const Table& table = tables_[t];
                   if (!status.ok()) return;
                   if (nonfinite_table->empty() && kernels::FirstNonFinite(grads) >= 0) {
                     *nonfinite_table = table.meta.name();
                   }
                   // A model's tables are mostly looked up with the same ids.
                   if (absl::MakeConstSpan(checked) == ids) return;
                   sorted.assign(ids.begin(), ids.end());
                   std::sort(sorted.begin(), sorted.end());
                   const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
                   if (twice != sorted.end()) {
                     status = absl::InvalidArgumentError(
                         absl::StrCat("push: table \"", table.meta.name(), "\" names id ",
                                      *twice, " twice (send each id once, its rows summed)"));
                     return;
                   }
                   checked.assign(ids.begin(), ids.end());
                 });
  return status;
}

void ShardTables::Accumulate(const Segments& segments, const ByteSource& data,
                             uint64_t offset) {
  ForEachSegment(segments, data, offset,
                 [&](int t, absl::Span<const uint64_t> ids, absl::Span<const float> grads) {
                   Table& table = tables_[t];
                   const int dim = table.meta.dim();
                   for (size_t i = 0; i < ids.size(); ++i) {
                     auto [it, made] = table.sum_index.try_emplace(
                         ids[i], static_cast<int64_t>(table.sum_ids.size()));
                     const float* row = grads.data() + i * dim;
                     if (made) {
                       table.sum_ids.push_back(ids[i]);
                       table.sums.insert(table.sums.end(), row, row + dim);
                     } else {
                       float* sum = table.sums.data() + it->second * dim;
                       for (int j = 0; j < dim; ++j) sum[j] += row[j];
                     }
                   }
                 });
}

absl::Status ShardTables::ApplySums(int64_t step, float scale) {
  absl::Status status;
  for (Table& table : tables_) {
    if (status.ok() && !table.sum_ids.empty()) {
      if (scale != 1) kernels::Scale(scale, absl::MakeSpan(table.sums));
      status = table.rows->Apply(step, table.sum_ids, table.sums);
    }
  }
  ClearSums();
  for (Table& table : tables_) table.rows->Evict(step);
  return status;
}

void ShardTables::ClearSums() {
  for (Table& table : tables_) {
    table.sum_index.clear();
    table.sum_ids.clear();
    table.sums.clear();
  }
}

absl::Status ShardTables::Apply(int64_t step, const Segments& segments, const ByteSource& data,
                                uint64_t offset) {
  absl::Status status;
  ForEachSegment(segments, data, offset,
                 [&](int t, absl::Span<const uint64_t> ids, absl::Span<const float> grads) {
                   if (status.ok() && !ids.empty()) {
                     status = tables_[t].rows->Apply(step, ids, grads);
                   }
                 });
  for (Table& table : tables_) table.rows->Evict(step);
  return status;
}

absl::Status ShardTables::CheckLookup(
    const google::protobuf::RepeatedPtrField<proto::SparseIds>& asked) const {
  for (const proto::SparseIds& ids : asked) {
    if (Find(ids.table()) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("pull: no embedding table \"", ids.table(), "\" on this shard"));
    }
    if (ids.ids_size() > kMaxIds) {
      return absl::InvalidArgumentError(absl::StrCat("pull: ", ids.ids_size(), " ids of table \"",
                                                     ids.table(), "\", more than ", kMaxIds));
    }
  }
  return absl::OkStatus();
}

absl::Status ShardTables::Lookup(const google::protobuf::RepeatedPtrField<proto::SparseIds>& asked,
                                 proto::PullHeader* header, std::vector<float>* rows,
                                 bool make_missing, int64_t step) {
  RETURN_IF_ERROR(CheckLookup(asked));
  size_t floats = 0;
  for (const proto::SparseIds& ids : asked) {
    floats += static_cast<size_t>(ids.ids_size()) * Find(ids.table())->meta.dim();
  }
  rows->resize(floats);
  size_t at = 0;
  for (const proto::SparseIds& ids : asked) {
    const Table& table = *Find(ids.table());
    const size_t n = static_cast<size_t>(ids.ids_size()) * table.meta.dim();
    RETURN_IF_ERROR(table.rows->Lookup(absl::MakeConstSpan(ids.ids().data(), ids.ids_size()),
                                       absl::MakeSpan(rows->data() + at, n), make_missing,
                                       step));
    at += n;
    proto::SparseSegment* segment = header->add_sparse();
    segment->set_table(ids.table());
    segment->set_num_ids(ids.ids_size());
  }
  return absl::OkStatus();
}

void ShardTables::AddStatus(proto::StatusResponse* status) const {
  for (const Table& table : tables_) {
    proto::TableStatus* entry = status->add_tables();
    entry->set_name(table.meta.name());
    entry->set_dim(table.meta.dim());
    const EmbeddingTable::Stats stats = table.rows->stats();
    entry->set_rows(stats.rows);
    entry->set_bytes(stats.bytes);
    entry->set_evicted_rows(stats.evicted_rows);
    entry->set_unadmitted_gradients(stats.unadmitted_gradients);
    entry->set_candidates(stats.candidates);
  }
}

}  // namespace psrt
