// Dataset: a labelled image set held in memory, whatever file format it
// came from (idx_dataset.h, tfrecord_dataset.h) or none (SyntheticDataset);
// and BatchIterator, a worker's shard of one, batched.
#ifndef PSRT_WORKER_INPUT_DATASET_H_
#define PSRT_WORKER_INPUT_DATASET_H_

#include <cstdint>
#include <random>
#include <vector>

#include "common/tensor.h"

namespace psrt {

// A labelled image set held in memory.
struct Dataset {
  Tensor images;                // [N, rows*cols], pixels scaled to [0, 1].
  std::vector<int32_t> labels;  // N class ids.
  int rows = 0;
  int cols = 0;
  int64_t size() const { return static_cast<int64_t>(labels.size()); }
};

// `examples` random images of `pixels` values in [0, 1) with random labels
// below num_classes, from `seed` alone (tf_cnn_benchmarks' synthetic data:
// for timing a model without reading any).
Dataset SyntheticDataset(int64_t examples, int64_t pixels, int num_classes, uint64_t seed);

// BatchIterator: this worker's shard of a Dataset, batched.
//
// Shard s of n holds the examples i with i % n == s, in index order, or in a
// fresh pseudo-random order each epoch when `shuffle` (seeded by `seed`, so
// runs repeat). Batches run across epoch boundaries without gaps.
// Thread safety: not thread-safe.
class BatchIterator {
 public:
  // REQUIRES: 0 <= shard < num_shards; the shard is non-empty.
  BatchIterator(const Dataset* data, int shard, int num_shards, bool shuffle,
                uint64_t seed);
  // Fills `images` ([batch, rows*cols], storage reused) and `labels`.
  // REQUIRES: batch_size > 0.
  void NextBatch(int batch_size, Tensor* images, std::vector<int32_t>* labels);
  // Moves past `examples` examples exactly as NextBatch would (a resumed
  // worker continues the data order where the checkpointed run was).
  void Skip(int64_t examples);

 private:
  void StartEpoch();
  const Dataset* data_;
  std::vector<int64_t> order_;
  size_t next_ = 0;
  bool shuffle_;
  std::mt19937_64 rng_;
};

}  // namespace psrt

#endif  // PSRT_WORKER_INPUT_DATASET_H_
