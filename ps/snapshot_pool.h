// ParameterShard::SnapshotPool, private to the shard's implementation files.
#ifndef PSRT_PS_SNAPSHOT_POOL_H_
#define PSRT_PS_SNAPSHOT_POOL_H_

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "ps/parameter_shard.h"

namespace psrt {

// Recycles snapshot buffers, so that serving a pull never touches fresh
// pages after the first few pulls.
class ParameterShard::SnapshotPool
    : public std::enable_shared_from_this<SnapshotPool> {
 public:
  // A buffer of `n` floats with unspecified contents.
  std::shared_ptr<Snapshot> New(int64_t n) {
    std::unique_ptr<Snapshot> snapshot;
    {
      absl::MutexLock lock(&mu_);
      if (!free_.empty()) {
        snapshot = std::move(free_.back());
        free_.pop_back();
      }
    }
    if (snapshot == nullptr) snapshot = std::make_unique<Snapshot>();
    snapshot->values.Resize({n});
    return Pooled(std::move(snapshot));
  }
  // A snapshot that takes over `values` without copying them (a restored
  // checkpoint's), recycled like the others.
  std::shared_ptr<Snapshot> Adopt(Tensor values) {
    auto snapshot = std::make_unique<Snapshot>();
    snapshot->values = std::move(values);
    return Pooled(std::move(snapshot));
  }

 private:
  std::shared_ptr<Snapshot> Pooled(std::unique_ptr<Snapshot> snapshot) {
    std::shared_ptr<SnapshotPool> self = shared_from_this();
    return std::shared_ptr<Snapshot>(snapshot.release(),
                                     [self](Snapshot* s) { self->Return(s); });
  }
  static constexpr size_t kMaxFree = 4;
  void Return(Snapshot* snapshot) {
    absl::MutexLock lock(&mu_);
    if (free_.size() < kMaxFree) {
      free_.emplace_back(snapshot);
    } else {
      delete snapshot;
    }
  }
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Snapshot>> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace psrt

#endif  // PSRT_PS_SNAPSHOT_POOL_H_
