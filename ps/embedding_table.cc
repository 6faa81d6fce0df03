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

absl::Status EmbeddingTable::Lookup(absl::Span<const uint64_t> ids, absl::Span<float> out) {
  if (out.size() != ids.size() * dim_) {
    return absl::InvalidArgumentError(absl::StrCat("table ", name_, ": ", ids.size(),
                                                   " ids of dimension ", dim_, " in ",
                                                   out.size(), " floats"));
  }
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < ids.size(); ++i) {
    std::memcpy(out.data() + i * dim_, RowLocked(ids[i]), dim_ * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status EmbeddingTable::Apply(int64_t step, absl::Span<const uint64_t> ids,
                                   absl::Span<const float> grads) {
  if (grads.size() != ids.size() * dim_) {
    return absl::InvalidArgumentError(absl::StrCat("table ", name_, ": ", ids.size(),
                                                   " ids of dimension ", dim_, " with ",
                                                   grads.size(), " gradient floats"));
  }
  {
    std::vector<uint64_t> sorted(ids.begin(), ids.end());
    std::sort(sorted.begin(), sorted.end());
    const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
    if (twice != sorted.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("table ", name_, ": id ", *twice, " named twice in one update"));
    }
  }
  absl::MutexLock lock(&mu_);
  // The update runs on copies of the rows (a new row's made there), which
  // replace them, or become new rows, only when every value and slot stays
  // finite.
  std::vector<float*> rows(ids.size(), nullptr);  // Null: a new row.
  scratch_.resize(ids.size() * row_floats_);
  optimizer_->BeginStep(step);
  const int num_slots = optimizer_->num_slots();
  std::vector<float*> slots(num_slots);
  for (size_t i = 0; i < ids.size(); ++i) {
    float* copy = scratch_.data() + i * row_floats_;
    auto found = index_.find(ids[i]);
    if (found != index_.end()) {
      rows[i] = RowAt(found->second);
      std::memcpy(copy, rows[i], row_floats_ * sizeof(float));
    } else {
      InitRow(ids[i], copy);
    }
    for (int s = 0; s < num_slots; ++s) slots[s] = copy + (1 + s) * dim_;
    optimizer_->ApplyRow(grads.subspan(i * dim_, dim_), copy, slots);
  }
  if (kernels::FirstNonFinite(scratch_) >= 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "table ", name_, ": the update of step ", step,
        " would make a value or slot NaN or infinite; nothing applied"));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    float* row = rows[i] != nullptr ? rows[i] : NewRowLocked(ids[i]);
    std::memcpy(row, scratch_.data() + i * row_floats_, row_floats_ * sizeof(float));
  }
  return absl::OkStatus();
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
