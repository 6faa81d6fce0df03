// ParameterShard::SnapshotPool and ParameterShard::EncodingCache, private to
// the shard's implementation files.
#ifndef PSRT_PS_SNAPSHOT_POOL_H_
#define PSRT_PS_SNAPSHOT_POOL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/wire_dtype.h"
#include "ps/parameter_shard.h"

namespace psrt {

// Recycles snapshot buffers, so that serving a pull never touches fresh
// pages after the first few pulls. Thread-safe.
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

// The newest 16-bit encoding of each kind of pull reply (the values or the
// moving averages, as bfloat16 or float16), shared by every pull of the same
// state: the W pulls of a version in sync mode encode the stripe once. A
// state is the shard's (incarnation, version), which every change of the
// values moves. Encoded buffers come from a pool of their own (half the
// values' size), so none is allocated in steady state; the cache holds only
// encodings, never the values, which stay free to update in place.
//
// Thread safety: thread-safe. Pulls of one kind wait for each other's
// encoding (which they would otherwise each repeat); other kinds do not.
class ParameterShard::EncodingCache {
 public:
  // Replaces reply's snapshot with its values as `dtype` (DT_BFLOAT16 or
  // DT_HALF), from the cache when it holds that state's. `moving_average`:
  // the reply holds the averages. REQUIRES: reply is the shard's reply.
  void Encode(proto::DataType dtype, bool moving_average, PullReply* reply) {
    Entry& entry = entries_[moving_average][dtype == proto::DT_HALF];
    const int64_t incarnation = reply->header.incarnation();
    const int64_t version = reply->header.version();
    {
      absl::MutexLock lock(&entry.mu);
      if (entry.encoded == nullptr || entry.incarnation != incarnation ||
          entry.version != version || entry.source != reply->snapshot.get()) {
        const Tensor& values = reply->snapshot->values;
        const size_t n = static_cast<size_t>(values.num_elements());
        std::shared_ptr<Snapshot> encoded = pool_->New((n + 1) / 2);
        EncodeWire(dtype, {values.data(), n},
                   {reinterpret_cast<uint16_t*>(encoded->values.data()), n});
        entry.encoded = std::move(encoded);
        entry.incarnation = incarnation;
        entry.version = version;
        entry.source = reply->snapshot.get();
      }
      reply->num_bytes = reply->snapshot->values.num_elements() * sizeof(uint16_t);
      reply->snapshot = entry.encoded;
    }
    for (proto::VariableMeta& meta : *reply->header.mutable_variables()) meta.set_dtype(dtype);
  }

 private:
  struct Entry {
    absl::Mutex mu;
    std::shared_ptr<const Snapshot> encoded ABSL_GUARDED_BY(mu);  // Null: none yet.
    int64_t incarnation ABSL_GUARDED_BY(mu) = 0;
    int64_t version ABSL_GUARDED_BY(mu) = 0;
    const Snapshot* source ABSL_GUARDED_BY(mu) = nullptr;  // Never dereferenced.
  };
  Entry entries_[2][2];  // [moving_average][dtype == DT_HALF]
  const std::shared_ptr<SnapshotPool> pool_ = std::make_shared<SnapshotPool>();
};

}  // namespace psrt

#endif  // PSRT_PS_SNAPSHOT_POOL_H_
