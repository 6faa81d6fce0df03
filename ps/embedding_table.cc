#include "ps/embedding_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/splitmix.h"
#include "common/status_macros.h"
#include "kernels/elementwise.h"

namespace psrt {
namespace {

constexpr int64_t kChunkRows = 4096;

}  // namespace

int TableShardOf(uint64_t id, int num_shards) {
  return static_cast<int>(SplitMix64(id) % static_cast<uint64_t>(num_shards));
}

absl::StatusOr<std::unique_ptr<EmbeddingTable>> EmbeddingTable::Create(
    std::string name, int dim, uint64_t seed, const proto::TrainingConfig& optimizer,
    bool zero_rows) {
  if (name.empty()) return absl::InvalidArgumentError("an embedding table needs a name");
  if (dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("embedding table ", name, ": dimension ", dim, " is not positive"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> rule, NewOptimizer(optimizer, 0));
  return std::unique_ptr<EmbeddingTable>(
      new EmbeddingTable(std::move(name), dim, seed, zero_rows, std::move(rule)));
}

EmbeddingTable::EmbeddingTable(std::string name, int dim, uint64_t seed, bool zero_rows,
                               std::unique_ptr<Optimizer> optimizer)
    : name_(std::move(name)),
      dim_(dim),
      seed_(seed),
      zero_rows_(zero_rows),
      row_floats_((1 + optimizer->num_slots()) * dim),
      optimizer_(std::move(optimizer)) {}

float* EmbeddingTable::RowAt(int64_t row) const {
  return chunks_[row / kChunkRows].get() + (row % kChunkRows) * row_floats_;
}

float* EmbeddingTable::RowLocked(uint64_t id) {
  auto found = index_.find(id);
  if (found != index_.end()) return RowAt(found->second);
  float* row = NewRowLocked(id);
  InitRow(id, row);
  return row;
}

float* EmbeddingTable::NewRowLocked(uint64_t id) {
  const int64_t row = static_cast<int64_t>(ids_.size());
  index_.emplace(id, row);
  if (row % kChunkRows == 0) {
    chunks_.push_back(std::make_unique<float[]>(kChunkRows * row_floats_));
  }
  ids_.push_back(id);
  return RowAt(row);
}

void EmbeddingTable::InitRow(uint64_t id, float* values) const {
  // A normal truncated at two standard deviations: redrawn beyond.
  const double stddev = 1 / std::sqrt(static_cast<double>(dim_));
  for (int j = 0; j < dim_ && zero_rows_; ++j) values[j] = 0;
  for (int j = 0; j < dim_ && !zero_rows_; ++j) {
    uint64_t h = SplitMix64(SplitMix64(seed_ ^ SplitMix64(id)) + static_cast<uint64_t>(j));
    double z;
    do {
      const double u1 = UnitInterval(h = SplitMix64(h)), u2 = UnitInterval(h = SplitMix64(h));
      z = std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2);
    } while (std::abs(z) > 2);
    values[j] = static_cast<float>(z * stddev);
  }
  for (int s = 0; s < optimizer_->num_slots(); ++s) {
    std::fill_n(values + (1 + s) * dim_, dim_, optimizer_->slot_initial_value(s));
  }
}

absl::Status EmbeddingTable::Lookup(absl::Span<const uint64_t> ids, absl::Span<float> out,
                                    bool make_missing) {
  if (out.size() != ids.size() * dim_) {
    return absl::InvalidArgumentError(absl::StrCat("table ", name_, ": ", ids.size(),
                                                   " ids of dimension ", dim_, " in ",
                                                   out.size(), " floats"));
  }
  absl::MutexLock lock(&mu_);
  FindRowsLocked(ids);
  undo_.resize(row_floats_);  // A missing row's initial values, not kept.
  for (size_t i = 0; i < ids.size(); ++i) {
    const float* row = found_[i];
    if (row == nullptr && make_missing) {
      row = RowLocked(ids[i]);
    } else if (row == nullptr) {
      InitRow(ids[i], undo_.data());
      row = undo_.data();
    }
    std::memcpy(out.data() + i * dim_, row, dim_ * sizeof(float));
  }
  return absl::OkStatus();
}

void EmbeddingTable::FindRowsLocked(absl::Span<const uint64_t> ids) {
  // The rows of a batch lie anywhere in memory, and so do their map slots:
  // each look-up is a cache miss or two. Prefetching the slots a few ids
  // ahead, and each row found, keeps many misses in flight at once.
  constexpr size_t kAhead = 16;
  found_.resize(ids.size());
  for (size_t i = 0; i < std::min(kAhead, ids.size()); ++i) index_.prefetch(ids[i]);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i + kAhead < ids.size()) index_.prefetch(ids[i + kAhead]);
    auto it = index_.find(ids[i]);
    found_[i] = it != index_.end() ? RowAt(it->second) : nullptr;
    if (found_[i] != nullptr) {
      const char* row = reinterpret_cast<const char*>(found_[i]);
      for (int64_t b = 0; b < row_floats_ * int64_t{sizeof(float)}; b += 64) {
        __builtin_prefetch(row + b);
      }
    }
  }
}

absl::Status EmbeddingTable::Apply(int64_t step, absl::Span<const uint64_t> ids,
                                   absl::Span<const float> grads) {
  if (grads.size() != ids.size() * dim_) {
    return absl::InvalidArgumentError(absl::StrCat("table ", name_, ": ", ids.size(),
                                                   " ids of dimension ", dim_, " with ",
                                                   grads.size(), " gradient floats"));
  }
  absl::MutexLock lock(&mu_);
  // In place, each row while it is in cache, its old contents kept in
  // undo_ (a new row is made first); if a value or slot became NaN or
  // infinite, the rows are put back and the new ones dropped.
  const size_t rows_before = ids_.size();
  undo_.resize(ids.size() * row_floats_);
  updated_.resize(ids.size());
  optimizer_->BeginStep(step);
  const int num_slots = optimizer_->num_slots();
  slots_.resize(num_slots);
  bool finite = true;
  FindRowsLocked(ids);
  for (size_t i = 0; i < ids.size(); ++i) {
    float* row = found_[i];
    if (row != nullptr) {
      std::memcpy(undo_.data() + i * row_floats_, row, row_floats_ * sizeof(float));
      updated_[i] = row;
    } else {
      row = NewRowLocked(ids[i]);
      InitRow(ids[i], row);
      updated_[i] = nullptr;  // Dropped, not restored, on failure.
    }
    for (int s = 0; s < num_slots; ++s) slots_[s] = row + (1 + s) * dim_;
    optimizer_->ApplyRow(grads.subspan(i * dim_, dim_), row, slots_);
    finite = finite && kernels::FirstNonFinite({row, static_cast<size_t>(row_floats_)}) < 0;
  }
  if (finite) return absl::OkStatus();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (updated_[i] != nullptr) {
      std::memcpy(updated_[i], undo_.data() + i * row_floats_, row_floats_ * sizeof(float));
    }
  }
  for (size_t r = rows_before; r < ids_.size(); ++r) index_.erase(ids_[r]);
  ids_.resize(rows_before);
  return absl::FailedPreconditionError(absl::StrCat(
      "table ", name_, ": the update of step ", step,
      " would make a value or slot NaN or infinite; nothing applied"));
}

int64_t EmbeddingTable::rows() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(ids_.size());
}

int64_t EmbeddingTable::bytes() const {
  absl::MutexLock lock(&mu_);
  const int64_t map_bytes =
      static_cast<int64_t>(index_.capacity()) * (sizeof(std::pair<uint64_t, int64_t>) + 1);
  return static_cast<int64_t>(chunks_.size()) * kChunkRows * row_floats_ * sizeof(float) +
         static_cast<int64_t>(ids_.capacity() * sizeof(uint64_t)) + map_bytes;
}

std::vector<std::string> EmbeddingTable::slot_names() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> names;
  for (const auto& [name, tensor] : optimizer_->slots()) names.push_back(name);
  return names;
}

void EmbeddingTable::ForEachRow(
    const std::function<void(uint64_t, absl::Span<const float>)>& f) const {
  absl::MutexLock lock(&mu_);
  for (size_t r = 0; r < ids_.size(); ++r) {
    f(ids_[r], absl::Span<const float>(RowAt(r), row_floats_));
  }
}

absl::Status EmbeddingTable::Insert(uint64_t id, absl::Span<const float> row) {
  if (row.size() != static_cast<size_t>(row_floats_)) {
    return absl::InvalidArgumentError(absl::StrCat("table ", name_, ": a row of id ", id, " has ",
                                                   row.size(), " floats, want ", row_floats_,
                                                   " (values and slots)"));
  }
  absl::MutexLock lock(&mu_);
  if (index_.contains(id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", name_, ": id ", id, " has a row already"));
  }
  std::memcpy(NewRowLocked(id), row.data(), row.size() * sizeof(float));
  return absl::OkStatus();
}

}  // namespace psrt
