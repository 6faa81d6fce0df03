// BatchSource: where a trainer's training batches come from, one after the
// other: an in-memory Dataset (DatasetBatchSource, over BatchIterator) or
// decoded image records (worker/image_pipeline.h).
//
// A source is a deterministic stream: the n-th batch is the same in every
// run with the same options, and Skip(k) followed by NextBatch gives what
// NextBatch would after k examples had been consumed (a resumed worker
// continues the data order where the checkpointed run was).
//
// Thread safety: not thread-safe; one consumer calls it.
#ifndef PSRT_WORKER_INPUT_BATCH_SOURCE_H_
#define PSRT_WORKER_INPUT_BATCH_SOURCE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "worker/input/dataset.h"

namespace psrt {

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Fills `images` ([batch_size, pixels]) and `labels` with the next batch.
  // A source may exchange the storage of *images with buffers of its own
  // (so the caller must not keep pointers into it across calls). An error
  // (a corrupt image, say) is final for this source.
  virtual absl::Status NextBatch(int batch_size, Tensor* images,
                                 std::vector<int32_t>* labels) = 0;
  // Moves past `examples` examples exactly as NextBatch would.
  // REQUIRES: examples >= 0.
  virtual absl::Status Skip(int64_t examples) = 0;
  // Sources of categorical input (Criteo's, for the CTR models): the ids of
  // the batch the last NextBatch made, [batch, fields] row-major, valid
  // until the next call; empty for image sources.
  virtual absl::Span<const uint64_t> sparse_ids() const { return {}; }
};

// Makes a batch stream from its beginning (a trainer Skips to where a
// resumed run continues); called at the start and after each recovery.
using BatchSourceFactory = std::function<absl::StatusOr<std::unique_ptr<BatchSource>>()>;

// A Dataset's shard through a BatchIterator (see there).
class DatasetBatchSource : public BatchSource {
 public:
  // REQUIRES: as BatchIterator's; `data` outlives the source.
  DatasetBatchSource(const Dataset* data, int shard, int num_shards, bool shuffle,
                     uint64_t seed)
      : batches_(data, shard, num_shards, shuffle, seed) {}
  absl::Status NextBatch(int batch_size, Tensor* images,
                         std::vector<int32_t>* labels) override {
    batches_.NextBatch(batch_size, images, labels);
    return absl::OkStatus();
  }
  absl::Status Skip(int64_t examples) override {
    batches_.Skip(examples);
    return absl::OkStatus();
  }

 private:
  BatchIterator batches_;
};

}  // namespace psrt

#endif  // PSRT_WORKER_INPUT_BATCH_SOURCE_H_
