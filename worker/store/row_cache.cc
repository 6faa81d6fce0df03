#include "worker/store/row_cache.h"

#include "glog/logging.h"

namespace psrt {

RowCache::RowCache(int staleness_steps, int floats_per_id)
    : staleness_(staleness_steps), floats_per_id_(floats_per_id) {
  CHECK_GE(staleness_, 1);
  CHECK_GE(floats_per_id_, 1);
}

void RowCache::StartPull() {
  ++pull_;
  if (pull_ % staleness_ == 0) Sweep();
}

void RowCache::Sweep() {
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (pull_ - it->second.pulled_at > staleness_) {
      free_places_.push_back(it->second.place);
      entries_.erase(it++);
    } else {
      ++it;
    }
  }
}

const float* RowCache::Find(uint64_t id) {
  ++lookups_;
  auto it = entries_.find(id);
  if (it == entries_.end() || pull_ - it->second.pulled_at > staleness_) return nullptr;
  ++hits_;
  return rows_.data() + it->second.place * floats_per_id_;
}

float* RowCache::Insert(uint64_t id) {
  auto [it, made] = entries_.try_emplace(id);
  if (made) {
    if (free_places_.empty()) {
      it->second.place = static_cast<int64_t>(rows_.size()) / floats_per_id_;
      rows_.resize(rows_.size() + floats_per_id_);
    } else {
      it->second.place = free_places_.back();
      free_places_.pop_back();
    }
  }
  it->second.pulled_at = pull_;
  return rows_.data() + it->second.place * floats_per_id_;
}

void RowCache::Clear() {
  entries_.clear();
  rows_.clear();
  free_places_.clear();
}

}  // namespace psrt
