// RowCache: a worker's copies of the embedding rows it pulled lately
// (psrt_worker --embedding_cache_steps=S; PsClient). A training pull reads
// an id's rows from here when this worker pulled them at most S pulls ago,
// and asks the ps tasks for the others only: the rows it trains on may then
// lag the ps's by up to S steps of updates, this worker's own included
// (bounded staleness, for the hot ids that nearly every batch holds).
//
// An id's entry holds the rows of every table, back to back (PsClient asks
// every table for the same ids). Entries older than S pulls are dropped
// every S pulls, so the cache holds the rows of at most 2S pulls; their
// places are reused, so steady state allocates nothing.
//
// Thread safety: not thread-safe.
#ifndef PSRT_WORKER_STORE_ROW_CACHE_H_
#define PSRT_WORKER_STORE_ROW_CACHE_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace psrt {

class RowCache {
 public:
  // REQUIRES: staleness_steps >= 1, floats_per_id >= 1.
  RowCache(int staleness_steps, int floats_per_id);

  // Starts the next pull: entries made more than staleness_steps pulls
  // before it are no longer found.
  void StartPull();
  // The rows of `id` if this worker pulled them recently enough, else null.
  // Counts the look-up and its hit.
  const float* Find(uint64_t id);
  // Where to write the rows of `id`, pulled now (floats_per_id floats).
  float* Insert(uint64_t id);
  // Forgets every entry (the ps tasks' state was replaced).
  void Clear();

  int64_t size() const { return static_cast<int64_t>(entries_.size()); }
  int64_t lookups() const { return lookups_; }
  int64_t hits() const { return hits_; }

 private:
  struct Entry {
    int64_t pulled_at = 0;
    int64_t place = 0;
  };
  // Drops the entries no pull can use any more.
  void Sweep();

  const int staleness_;
  const int floats_per_id_;
  int64_t pull_ = 0;
  absl::flat_hash_map<uint64_t, Entry> entries_;
  std::vector<float> rows_;           // Place p: rows_[p * floats_per_id_, ...).
  std::vector<int64_t> free_places_;
  int64_t lookups_ = 0;
  int64_t hits_ = 0;
};

}  // namespace psrt

#endif  // PSRT_WORKER_STORE_ROW_CACHE_H_
