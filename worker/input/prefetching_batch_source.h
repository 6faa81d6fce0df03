// PrefetchingBatchSource: another source's batches, each made on a thread
// of its own while the caller's step runs, so that a step waits for input
// only when making a batch takes longer than the step. The batches are the
// inner source's, in its order: prefetching changes when a batch is made,
// not which. Their images live in memory from `allocator`: a GPU worker
// gives page-locked memory (Model::input_allocator), which its upload reads
// directly, with no staging copy.
//
// NextBatch hands over the storage of the batch made ahead (BatchSource
// allows a source to exchange storage) and starts making the next one in
// the storage the caller gave back, which held the batch of the call
// before: so the caller must be done with that batch, its uploads included,
// by its next call (a trainer is: the step that read it has ended).
//
// Thread safety: one consumer thread, as every BatchSource; the inner
// source runs on the prefetch thread alone once the first batch is asked.
#ifndef PSRT_WORKER_INPUT_PREFETCHING_BATCH_SOURCE_H_
#define PSRT_WORKER_INPUT_PREFETCHING_BATCH_SOURCE_H_

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/tensor.h"
#include "worker/input/batch_source.h"

namespace psrt {

class PrefetchingBatchSource : public BatchSource {
 public:
  // `allocator` null: the heap.
  PrefetchingBatchSource(std::unique_ptr<BatchSource> inner, HostAllocator* allocator);
  // Waits for the batch being made, if any.
  ~PrefetchingBatchSource() override;
  PrefetchingBatchSource(const PrefetchingBatchSource&) = delete;
  PrefetchingBatchSource& operator=(const PrefetchingBatchSource&) = delete;

  // The first call makes its batch while it waits. The inner source's error
  // is returned by the call that would have received that batch, and by
  // every later one. FailedPrecondition for a batch_size other than the
  // first call's (the batch made ahead has that size).
  absl::Status NextBatch(int batch_size, Tensor* images, std::vector<int32_t>* labels) override;
  // The inner source's Skip. FailedPrecondition after the first NextBatch
  // (a batch made ahead cannot be unmade; a trainer skips fresh sources).
  absl::Status Skip(int64_t examples) override;
  // The inner source's ids of the batch the last NextBatch returned.
  absl::Span<const uint64_t> sparse_ids() const override { return ids_; }

 private:
  void Loop();

  const std::unique_ptr<BatchSource> inner_;
  HostAllocator* const allocator_;
  int batch_size_ = 0;  // Fixed by the first NextBatch.
  std::vector<uint64_t> ids_;  // The caller's batch's sparse_ids.
  std::thread thread_;  // Started by the first NextBatch.

  absl::Mutex mu_;
  bool wanted_ ABSL_GUARDED_BY(mu_) = false;  // The thread is to make a batch.
  bool made_ ABSL_GUARDED_BY(mu_) = false;    // The batch below is complete.
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);  // The inner source's first error.
  // The batch being made (the thread's while wanted_ or making) or made.
  Tensor images_;
  std::vector<int32_t> labels_;
  std::vector<uint64_t> made_ids_;
};

}  // namespace psrt

#endif  // PSRT_WORKER_INPUT_PREFETCHING_BATCH_SOURCE_H_
