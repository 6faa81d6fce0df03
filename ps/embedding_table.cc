#include "ps/embedding_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"

#include "absl/strings/str_cat.h"
#include "common/splitmix.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "kernels/elementwise.h"

namespace psrt {
namespace {

constexpr int64_t kChunkRows = 4096;
// Without a ttl, an id waiting for admission is forgotten after this many
// steps without a look-up.
constexpr int64_t kCandidateWindowSteps = 1 << 16;

}  // namespace

int TableShardOf(uint64_t id, int num_shards) {
  return static_cast<int>((static_cast<unsigned __int128>(SplitMix64(id)) *
                           static_cast<uint64_t>(num_shards)) >> 64);
}

bool TableShardsOverlap(int a, int num_a, int b, int num_b) {
  // [a, a + 1) / num_a meets [b, b + 1) / num_b.
  const int64_t a64 = a, b64 = b;
  return a64 * num_b < (b64 + 1) * num_a && b64 * num_a < (a64 + 1) * num_b;
}

absl::StatusOr<RowPolicy> RowPolicyFromConfig(const proto::TrainingConfig& config) {
  RowPolicy policy;
  const std::pair<const char*, int64_t> counts[] = {
      {"embedding_admit_count", config.embedding_admit_count()},
      {"embedding_ttl_steps", config.embedding_ttl_steps()},
      {"embedding_max_rows_per_shard", config.embedding_max_rows_per_shard()},
  };
  for (const auto& [field, value] : counts) {
    if (value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " must not be negative, got ", value));
    }
  }
  const double p = config.embedding_admit_probability();
  if (!(p >= 0 && p <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("embedding_admit_probability must be in [0, 1] (0: off), got ", p));
  }
  policy.admit_count = config.embedding_admit_count();
  policy.admit_probability = p > 0 ? p : 1;
  if (policy.admit_count > 1 && policy.admit_probability < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "embedding_admit_count (", policy.admit_count, ") and embedding_admit_probability (",
        p, ") are two ways to admit ids: set one"));
  }
  policy.ttl_steps = config.embedding_ttl_steps();
  policy.max_rows = config.embedding_max_rows_per_shard();
  return policy;
}

absl::StatusOr<std::unique_ptr<EmbeddingTable>> EmbeddingTable::Create(
    std::string name, int dim, uint64_t seed, const proto::TrainingConfig& optimizer,
    bool zero_rows, RowPolicy policy) {
  if (name.empty()) return absl::InvalidArgumentError("an embedding table needs a name");
  if (dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("embedding table ", name, ": dimension ", dim, " is not positive"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> rule, NewOptimizer(optimizer, 0));
  return std::unique_ptr<EmbeddingTable>(new EmbeddingTable(
      std::move(name), dim, seed, zero_rows, std::move(rule), policy));
}

EmbeddingTable::EmbeddingTable(std::string name, int dim, uint64_t seed, bool zero_rows,
                               std::unique_ptr<Optimizer> optimizer, RowPolicy policy)
    : name_(std::move(name)),
      dim_(dim),
      seed_(seed),
      zero_rows_(zero_rows),
      row_floats_((1 + optimizer->num_slots()) * dim),
      policy_(policy),
      optimizer_(std::move(optimizer)) {}

absl::Status EmbeddingTable::Reconfigure(const proto::TrainingConfig& optimizer,
                                         RowPolicy policy, int64_t step) {
  ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> rule, NewOptimizer(optimizer, 0));
  absl::MutexLock lock(&mu_);
  if (rule->num_slots() != optimizer_->num_slots()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "embedding table ", name_, ": its rows hold ", optimizer_->num_slots(),
        " optimizer slots, the new rule has ", rule->num_slots()));
  }
  if (policy_.evicts() && !policy.evicts() && !free_rows_.empty()) {
    // Its rows are numbered with places eviction freed, which only
    // eviction's bookkeeping tells from rows.
    return absl::FailedPreconditionError(absl::StrCat(
        "embedding table ", name_, " has evicted rows (--embedding_ttl_steps, "
        "--embedding_max_rows_per_ps) and cannot go on without eviction: give a ttl or a "
        "budget again (a large one keeps every row)"));
  }
  optimizer_ = std::move(rule);
  if (policy.evicts() && !policy_.evicts()) {
    touched_.assign(ids_.size(), step);  // No place is free without eviction.
  } else if (!policy.evicts()) {
    touched_.clear();
  }
  if (policy.admits_every_id()) candidates_.clear();
  policy_ = policy;
  return absl::OkStatus();
}

float* EmbeddingTable::RowAt(int64_t row) const {
  return chunks_[row / kChunkRows].get() + (row % kChunkRows) * row_floats_;
}

int64_t EmbeddingTable::NewRowLocked(uint64_t id, int64_t step) {
  int64_t row;
  if (!free_rows_.empty()) {
    row = free_rows_.back();
    free_rows_.pop_back();
    ids_[row] = id;
  } else {
    row = static_cast<int64_t>(ids_.size());
    if (row / kChunkRows == static_cast<int64_t>(chunks_.size())) {
      chunks_.push_back(std::make_unique<float[]>(kChunkRows * row_floats_));
    }
    ids_.push_back(id);
    if (policy_.evicts()) touched_.push_back(step);
  }
  if (policy_.evicts()) touched_[row] = step;
  index_.emplace(id, row);
  return row;
}

void EmbeddingTable::RemoveRowLocked(int64_t row) {
  index_.erase(ids_[row]);
  if (row + 1 == static_cast<int64_t>(ids_.size())) {
    ids_.pop_back();
    if (policy_.evicts()) touched_.pop_back();
    return;
  }
  // Only eviction drops a row other than the newest (a refused update drops
  // the rows it made, newest first, or from the places eviction freed).
  CHECK(policy_.evicts()) << name_ << ": row " << row << " of " << ids_.size()
                          << " dropped from the middle without eviction";
  touched_[row] = -1;
  free_rows_.push_back(row);
}

bool EmbeddingTable::AdmitLocked(uint64_t id, int64_t step) {
  Candidate& candidate = candidates_[id];
  // The look-ups of one global step count once, and all of them get the
  // first one's answer (a row admitted by it is found, not counted): the
  // sync workers' pulls of a step then fare alike, whatever their order.
  if (candidate.lookups > 0 && candidate.last_step == step) return false;
  ++candidate.lookups;
  candidate.last_step = step;
  bool admit;
  if (policy_.admit_count > 1) {
    admit = candidate.lookups >= policy_.admit_count;
  } else {
    // Each look-up its own draw, from (seed, id, look-up) alone: a run is
    // reproducible.
    const uint64_t lookup = static_cast<uint64_t>(candidate.lookups);
    const uint64_t h =
        SplitMix64(SplitMix64(seed_ ^ SplitMix64(id)) ^ (0x9e3779b97f4a7c15ull * lookup));
    admit = UnitInterval(h) < policy_.admit_probability;
  }
  if (admit) candidates_.erase(id);
  return admit;
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
                                    bool make_missing, int64_t step) {
  if (out.size() != ids.size() * dim_) {
    return absl::InvalidArgumentError(absl::StrCat("table ", name_, ": ", ids.size(),
                                                   " ids of dimension ", dim_, " in ",
                                                   out.size(), " floats"));
  }
  absl::MutexLock lock(&mu_);
  FindRowsLocked(ids);
  undo_.resize(row_floats_);  // A missing row's initial values, not kept.
  const bool admits_every_id = policy_.admits_every_id();
  constexpr size_t kRowsAhead = 8;
  for (size_t i = 0; i < kRowsAhead; ++i) PrefetchRowLocked(i);
  for (size_t i = 0; i < ids.size(); ++i) {
    PrefetchRowLocked(i + kRowsAhead);
    int64_t found = found_rows_[i];
    if (found < 0 && make_missing) {
      // An id named twice in one look-up has its row from the first time.
      if (auto it = index_.find(ids[i]); it != index_.end()) found = it->second;
    }
    const float* row;
    if (found >= 0) {
      row = RowAt(found);
      if (make_missing && policy_.evicts()) touched_[found] = step;
    } else if (make_missing && (admits_every_id || AdmitLocked(ids[i], step))) {
      float* made = RowAt(NewRowLocked(ids[i], step));
      InitRow(ids[i], made);
      row = made;
    } else if (!admits_every_id) {
      std::fill_n(undo_.data(), dim_, 0.0f);  // The shared default row.
      row = undo_.data();
    } else {
      InitRow(ids[i], undo_.data());
      row = undo_.data();
    }
    std::memcpy(out.data() + i * dim_, row, dim_ * sizeof(float));
  }
  // The rows this look-up made count against the budget at once (the rows
  // it read were touched at `step`, so older ones go first).
  if (policy_.max_rows > 0 && RowsLocked() > policy_.max_rows) EnforceBudgetLocked();
  return absl::OkStatus();
}

void EmbeddingTable::FindRowsLocked(absl::Span<const uint64_t> ids) {
  // The rows of a batch lie anywhere in memory, and so do their map slots:
  // each look-up is a cache miss or two. Prefetching the slots a few ids
  // ahead keeps several misses in flight at once (the rows are prefetched
  // a few ids ahead of their use: PrefetchRowLocked).
  constexpr size_t kAhead = 16;
  found_rows_.resize(ids.size());
  for (size_t i = 0; i < std::min(kAhead, ids.size()); ++i) index_.prefetch(ids[i]);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i + kAhead < ids.size()) index_.prefetch(ids[i + kAhead]);
    auto it = index_.find(ids[i]);
    found_rows_[i] = it != index_.end() ? it->second : -1;
  }
}

void EmbeddingTable::PrefetchRowLocked(size_t i) const {
  if (i >= found_rows_.size() || found_rows_[i] < 0) return;
  const char* row = reinterpret_cast<const char*>(RowAt(found_rows_[i]));
  for (int64_t b = 0; b < row_floats_ * int64_t{sizeof(float)}; b += 64) {
    __builtin_prefetch(row + b);
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
  undo_.resize(ids.size() * row_floats_);
  updated_.resize(ids.size());
  made_.clear();
  optimizer_->BeginStep(step);
  const int num_slots = optimizer_->num_slots();
  slots_.resize(num_slots);
  bool finite = true;
  int64_t unadmitted = 0;
  FindRowsLocked(ids);
  constexpr size_t kRowsAhead = 8;
  for (size_t i = 0; i < kRowsAhead; ++i) PrefetchRowLocked(i);
  for (size_t i = 0; i < ids.size(); ++i) {
    PrefetchRowLocked(i + kRowsAhead);
    float* row;
    updated_[i] = nullptr;  // Made by this update, or not admitted.
    if (found_rows_[i] >= 0) {
      row = RowAt(found_rows_[i]);
      std::memcpy(undo_.data() + i * row_floats_, row, row_floats_ * sizeof(float));
      updated_[i] = row;
    } else if (policy_.admits_every_id()) {
      made_.push_back(NewRowLocked(ids[i], step));
      row = RowAt(made_.back());
      InitRow(ids[i], row);
    } else {
      ++unadmitted;  // Looked up before its row was made: dropped.
      continue;
    }
    for (int s = 0; s < num_slots; ++s) slots_[s] = row + (1 + s) * dim_;
    optimizer_->ApplyRow(grads.subspan(i * dim_, dim_), row, slots_);
    finite = finite && kernels::FirstNonFinite({row, static_cast<size_t>(row_floats_)}) < 0;
  }
  if (finite) {
    unadmitted_gradients_ += unadmitted;
    if (policy_.evicts()) {
      for (size_t i = 0; i < ids.size(); ++i) {
        if (found_rows_[i] >= 0) touched_[found_rows_[i]] = step;
      }
    }
    return absl::OkStatus();
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (updated_[i] != nullptr) {
      std::memcpy(updated_[i], undo_.data() + i * row_floats_, row_floats_ * sizeof(float));
    }
  }
  for (auto row = made_.rbegin(); row != made_.rend(); ++row) RemoveRowLocked(*row);
  return absl::FailedPreconditionError(absl::StrCat(
      "table ", name_, ": the update of step ", step,
      " would make a value or slot NaN or infinite; nothing applied"));
}

void EmbeddingTable::Evict(int64_t step) {
  if (!policy_.evicts() && policy_.admits_every_id()) return;
  absl::MutexLock lock(&mu_);
  const int64_t window = policy_.ttl_steps > 0 ? policy_.ttl_steps : kCandidateWindowSteps;
  if (step >= next_sweep_) {
    // Untouched for `window` steps: last touched at step - window or before.
    const int64_t stale = step - window;
    for (int64_t r = 0; policy_.ttl_steps > 0 && r < static_cast<int64_t>(ids_.size()); ++r) {
      if (touched_[r] >= 0 && touched_[r] <= stale) {
        RemoveRowLocked(r);
        ++evicted_rows_;
      }
    }
    absl::erase_if(candidates_, [&](const auto& c) { return c.second.last_step <= stale; });
    next_sweep_ = step + std::max<int64_t>(1, window / 16);
  }
  if (policy_.max_rows > 0 && RowsLocked() > policy_.max_rows) EnforceBudgetLocked();
}

void EmbeddingTable::EnforceBudgetLocked() {
  const int64_t keep = policy_.max_rows - policy_.max_rows / 16;
  int64_t drop = RowsLocked() - keep;
  // The step at or before which rows go: the drop-th smallest last step;
  // rows of that very step go in row order until enough have.
  steps_.clear();
  for (int64_t t : touched_) {
    if (t >= 0) steps_.push_back(t);
  }
  std::nth_element(steps_.begin(), steps_.begin() + (drop - 1), steps_.end());
  const int64_t cutoff = steps_[drop - 1];
  for (int64_t r = 0; r < static_cast<int64_t>(ids_.size()) && drop > 0; ++r) {
    if (touched_[r] >= 0 && touched_[r] < cutoff) {
      RemoveRowLocked(r);
      ++evicted_rows_;
      --drop;
    }
  }
  for (int64_t r = 0; r < static_cast<int64_t>(ids_.size()) && drop > 0; ++r) {
    if (touched_[r] == cutoff) {
      RemoveRowLocked(r);
      ++evicted_rows_;
      --drop;
    }
  }
}

int64_t EmbeddingTable::RowsLocked() const {
  return static_cast<int64_t>(ids_.size() - free_rows_.size());
}

int64_t EmbeddingTable::BytesLocked() const {
  const int64_t map_bytes =
      static_cast<int64_t>(index_.capacity()) * (sizeof(std::pair<uint64_t, int64_t>) + 1);
  const int64_t candidate_bytes =
      static_cast<int64_t>(candidates_.capacity()) * (sizeof(std::pair<uint64_t, Candidate>) + 1);
  return static_cast<int64_t>(chunks_.size()) * kChunkRows * row_floats_ * sizeof(float) +
         static_cast<int64_t>(ids_.capacity() * sizeof(uint64_t)) + map_bytes +
         static_cast<int64_t>((touched_.capacity() + free_rows_.capacity()) * sizeof(int64_t)) +
         candidate_bytes;
}

int64_t EmbeddingTable::rows() const {
  absl::MutexLock lock(&mu_);
  return RowsLocked();
}

int64_t EmbeddingTable::bytes() const {
  absl::MutexLock lock(&mu_);
  return BytesLocked();
}

EmbeddingTable::Stats EmbeddingTable::stats() const {
  absl::MutexLock lock(&mu_);
  Stats stats;
  stats.rows = RowsLocked();
  stats.bytes = BytesLocked();
  stats.evicted_rows = evicted_rows_;
  stats.unadmitted_gradients = unadmitted_gradients_;
  stats.candidates = static_cast<int64_t>(candidates_.size());
  return stats;
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
    if (!touched_.empty() && touched_[r] < 0) continue;  // A dropped row's place.
    f(ids_[r], absl::Span<const float>(RowAt(r), row_floats_));
  }
}

absl::Status EmbeddingTable::Insert(uint64_t id, absl::Span<const float> row, int64_t step) {
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
  std::memcpy(RowAt(NewRowLocked(id, step)), row.data(), row.size() * sizeof(float));
  return absl::OkStatus();
}

}  // namespace psrt
