// ImagePipeline: training (or evaluation) batches decoded from one
// worker's shard of image records (worker/image_records.h) on a pool of
// decoder threads, prefetched ahead of the step.
//
// Order: the shard's n examples are a stream of positions 0, 1, 2, ...;
// position p is example order_e[p % n] of epoch e = p / n, where order_e is
// the identity or, with `shuffle`, a permutation drawn from (seed, e). Batch
// b holds positions [b * B, (b + 1) * B) in its slots 0..B-1. An example's
// random crop and flip come from (seed, e, example) (ExampleRng). So the
// batches do not depend on the number of threads or their timing, and
// Skip(k) only moves the position (nothing is decoded).
//
// Prefetch: `prefetch_batches` batch buffers, each filled by the threads
// image by image (a thread takes the next undecoded slot of the oldest
// unfinished batch). NextBatch hands out the oldest buffer once it is full
// by swapping it with the caller's tensor, whose storage then holds a later
// batch: no batch-sized buffer is allocated in the steady state. The time
// NextBatch spends waiting for a buffer to fill is counted (stats()).
//
// Corrupt images (any decode error, or a record on disk that no longer
// reads back; see ImageShard::Read): with skip_corrupt, the example is
// replaced by the next one of the shard (in storage order) that decodes,
// deterministically, and counted once per example; without, NextBatch
// fails with the error naming the file and record, e.g.
//   "/data/train-00000-of-00002: record 17: JPEG: Premature end of JPEG file"
//
// Thread safety: NextBatch, Skip and stats are for one consumer thread;
// the decoder threads are internal and end with the pipeline.
#ifndef PSRT_WORKER_INPUT_IMAGE_PIPELINE_H_
#define PSRT_WORKER_INPUT_IMAGE_PIPELINE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/tensor.h"
#include "worker/input/batch_source.h"
#include "worker/input/dataset.h"
#include "worker/input/image_preprocess.h"
#include "worker/input/image_records.h"

namespace psrt {

struct ImagePipelineOptions {
  // The output images: height x width x channels (1: gray, 3: RGB).
  int height = 32;
  int width = 32;
  int channels = 3;
  int batch_size = 32;
  // Training: a random distorted crop and a random flip; evaluation: the
  // central `central_fraction` of the image. Both resize to height x width.
  bool train = true;
  DistortedCropOptions crop;
  double central_fraction = 0.875;
  bool shuffle = true;
  uint64_t seed = 1;
  int threads = 0;           // Decoder threads; 0: the number of cores.
  int prefetch_batches = 3;  // Batch buffers being filled or ready.
  bool skip_corrupt = false;
  float pixel_max = 1;  // Pixels in [0, pixel_max] (CropResizeFlip).
};

class ImagePipeline : public BatchSource {
 public:
  // Starts the decoder threads. REQUIRES: shard is non-empty; sizes,
  // batch_size, prefetch_batches > 0; channels 1 or 3.
  ImagePipeline(std::shared_ptr<const ImageShard> shard, const ImagePipelineOptions& options);
  ~ImagePipeline() override;
  ImagePipeline(const ImagePipeline&) = delete;
  ImagePipeline& operator=(const ImagePipeline&) = delete;

  // InvalidArgument when batch_size differs from options.batch_size.
  absl::Status NextBatch(int batch_size, Tensor* images,
                         std::vector<int32_t>* labels) override;
  // Restarts the threads at the new position when batches were prefetched.
  absl::Status Skip(int64_t examples) override;

  struct Stats {
    int64_t batches = 0;           // Handed out.
    absl::Duration wait;           // NextBatch blocked on unfilled buffers.
    absl::Duration busy;           // Decoder threads' time on images, summed.
    int64_t corrupt_skipped = 0;   // Distinct examples replaced.
  };
  Stats stats() const;

 private:
  // A batch buffer: positions [begin, begin + B).
  struct Slot {
    int64_t begin = 0;
    int claimed = 0;  // Items handed to a thread.
    int done = 0;     // Items written.
    Tensor images;    // [B, pixels].
    std::vector<int32_t> labels;
    std::vector<int64_t> examples;  // Per item: the shard's example,
    std::vector<int64_t> epochs;    // and its epoch.
    absl::Status status;  // The error of the lowest failed item.
    int failed_item = -1;
  };
  void Start() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // Points `slot` at the positions from next_begin_ on.
  void Assign(Slot* slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const std::vector<int64_t>& Order(int64_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Decode();  // A decoder thread's loop.
  // Decodes example `example` (or, with skip_corrupt, its replacement) into
  // `out`; returns the label. `encoded` and `scratch` are the thread's.
  absl::StatusOr<int32_t> DecodeOne(int64_t example, int64_t epoch, std::string* encoded,
                                    Image* scratch, float* out);

  const std::shared_ptr<const ImageShard> shard_;
  const ImagePipelineOptions options_;
  const int64_t pixels_;
  const int threads_;
  std::vector<std::atomic<uint8_t>> corrupt_;  // Per example: replaced.
  std::atomic<int64_t> corrupt_count_{0};
  std::atomic<int64_t> busy_ns_{0};

  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  size_t head_ ABSL_GUARDED_BY(mu_) = 0;          // The slot NextBatch takes next,
  int64_t position_ ABSL_GUARDED_BY(mu_) = 0;     // which begins here.
  int64_t next_begin_ ABSL_GUARDED_BY(mu_) = 0;   // Of the next slot assigned.
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  // Cached shuffles of two epochs (a batch spans at most a few).
  int64_t order_epoch_[2] ABSL_GUARDED_BY(mu_) = {-1, -1};
  std::vector<int64_t> order_[2] ABSL_GUARDED_BY(mu_);
  int64_t batches_ = 0;
  absl::Duration wait_;
  std::vector<std::thread> threads_pool_;
};

// Decodes every example of `shard` once, in order, with the evaluation
// preprocessing of `options` (central crop; train, shuffle and batch_size
// are ignored), on options.threads threads, into a Dataset of
// [n, height * width * channels] (rows = height, cols = width). Corrupt
// images fail, or with skip_corrupt are replaced as in ImagePipeline.
absl::StatusOr<Dataset> DecodeImageDataset(std::shared_ptr<const ImageShard> shard,
                                           ImagePipelineOptions options);

}  // namespace psrt

#endif  // PSRT_WORKER_INPUT_IMAGE_PIPELINE_H_
