#include "worker/input/prefetching_batch_source.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace psrt {

PrefetchingBatchSource::PrefetchingBatchSource(std::unique_ptr<BatchSource> inner,
                                               HostAllocator* allocator)
    : inner_(std::move(inner)), allocator_(allocator), images_(Shape{0}, allocator) {}

PrefetchingBatchSource::~PrefetchingBatchSource() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void PrefetchingBatchSource::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](PrefetchingBatchSource* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
            return s->wanted_ || s->stopping_;
          },
          this));
      if (stopping_) return;
      wanted_ = false;
    }
    // images_ and labels_ are this thread's until made_ is set.
    const absl::Status made = inner_->NextBatch(batch_size_, &images_, &labels_);
    const absl::Span<const uint64_t> ids = inner_->sparse_ids();
    made_ids_.assign(ids.begin(), ids.end());
    absl::MutexLock lock(&mu_);
    if (status_.ok()) status_ = made;
    made_ = true;
  }
}

absl::Status PrefetchingBatchSource::NextBatch(int batch_size, Tensor* images,
                                               std::vector<int32_t>* labels) {
  if (!thread_.joinable()) {
    batch_size_ = batch_size;
    {
      absl::MutexLock lock(&mu_);
      wanted_ = true;
    }
    thread_ = std::thread([this] { Loop(); });
  } else if (batch_size != batch_size_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a batch of ", batch_size, " asked of a source that makes batches of ", batch_size_,
        " ahead"));
  }
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&made_));
  if (!status_.ok()) return status_;  // Nothing more is made.
  made_ = false;
  std::swap(*images, images_);
  std::swap(*labels, labels_);
  ids_.swap(made_ids_);
  // The storage given back makes the next batch; the caller's first one may
  // not be from the allocator.
  if (images_.allocator() != allocator_) images_ = Tensor(Shape{0}, allocator_);
  wanted_ = true;
  return absl::OkStatus();
}

absl::Status PrefetchingBatchSource::Skip(int64_t examples) {
  if (thread_.joinable()) {
    return absl::FailedPreconditionError(
        "Skip after NextBatch: a batch made ahead cannot be unmade");
  }
  return inner_->Skip(examples);
}

}  // namespace psrt
