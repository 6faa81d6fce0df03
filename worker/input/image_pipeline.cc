#include "worker/input/image_pipeline.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cpu_budget.h"
#include "glog/logging.h"
#include "worker/input/image_decoder.h"

namespace psrt {
namespace {

// Corrupt images logged one by one; later ones are only counted.
constexpr int64_t kCorruptLogged = 10;

}  // namespace

ImagePipeline::ImagePipeline(std::shared_ptr<const ImageShard> shard,
                             const ImagePipelineOptions& options)
    : shard_(std::move(shard)),
      options_(options),
      pixels_(int64_t{options.height} * options.width * options.channels),
      threads_(options.threads > 0
                   ? options.threads
                   : ProcessCpuBudget().cores),
      corrupt_(shard_->size()) {
  CHECK(shard_ != nullptr && shard_->size() > 0) << "empty image shard";
  CHECK(options.height > 0 && options.width > 0 && options.batch_size > 0 &&
        options.prefetch_batches > 0);
  CHECK(options.channels == 1 || options.channels == 3) << options.channels;
  for (auto& c : corrupt_) c.store(0);
  absl::MutexLock lock(&mu_);
  slots_.resize(options.prefetch_batches);
}

ImagePipeline::~ImagePipeline() {
  Stop();
  if (corrupt_count_.load() > 0) {
    LOG(WARNING) << "input: " << corrupt_count_.load() << " corrupt image(s) of "
                 << shard_->size() << " skipped (--corrupt_images=skip)";
  }
}

const std::vector<int64_t>& ImagePipeline::Order(int64_t epoch) {
  for (int i = 0; i < 2; ++i) {
    if (order_epoch_[i] == epoch) return order_[i];
  }
  // Replace the older epoch: positions are assigned in increasing order.
  const int i = order_epoch_[0] < order_epoch_[1] ? 0 : 1;
  std::vector<int64_t>& order = order_[i];
  order.resize(shard_->size());
  std::iota(order.begin(), order.end(), 0);
  if (options_.shuffle) {
    ExampleRng rng(options_.seed, epoch, /*example=*/-1);
    for (size_t k = order.size() - 1; k > 0; --k) {
      std::swap(order[k], order[rng.UniformInt(static_cast<int64_t>(k) + 1)]);
    }
  }
  order_epoch_[i] = epoch;
  return order;
}

void ImagePipeline::Assign(Slot* slot) {
  const int b = options_.batch_size;
  const int64_t n = shard_->size();
  slot->begin = next_begin_;
  next_begin_ += b;
  slot->claimed = 0;
  slot->done = 0;
  slot->status = absl::OkStatus();
  slot->failed_item = -1;
  if (slot->images.shape() != Shape{b, pixels_}) slot->images.Resize({b, pixels_});
  slot->labels.resize(b);
  slot->examples.resize(b);
  slot->epochs.resize(b);
  int64_t epoch = -1;
  const std::vector<int64_t>* order = nullptr;
  for (int i = 0; i < b; ++i) {
    const int64_t p = slot->begin + i;
    if (p / n != epoch) {
      epoch = p / n;
      order = &Order(epoch);
    }
    slot->examples[i] = (*order)[p % n];
    slot->epochs[i] = epoch;
  }
}

void ImagePipeline::Start() {
  next_begin_ = position_;
  for (size_t i = 0; i < slots_.size(); ++i) Assign(&slots_[(head_ + i) % slots_.size()]);
  running_ = true;
  for (int t = 0; t < threads_; ++t) threads_pool_.emplace_back([this] { Decode(); });
}

void ImagePipeline::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return;
    stop_ = true;
    changed_.SignalAll();
  }
  for (std::thread& t : threads_pool_) t.join();
  threads_pool_.clear();
  absl::MutexLock lock(&mu_);
  stop_ = false;
  running_ = false;
}

absl::StatusOr<int32_t> ImagePipeline::DecodeOne(int64_t example, int64_t epoch,
                                                 std::string* encoded, Image* scratch,
                                                 float* out) {
  const ImageShard& shard = *shard_;
  const int64_t n = shard.size();
  for (int64_t attempt = 0; attempt < n; ++attempt) {
    const int64_t j = (example + attempt) % n;
    if (options_.skip_corrupt && corrupt_[j].load(std::memory_order_relaxed)) continue;
    absl::string_view bytes;
    absl::Status status = shard.Read(j, encoded, &bytes);
    if (status.ok()) status = DecodeImage(bytes, options_.channels, scratch);
    if (status.ok()) {
      ExampleRng rng(options_.seed, epoch, j);
      const CropBox box =
          options_.train ? SampleDistortedCrop(scratch->height, scratch->width, options_.crop, &rng)
                         : CentralCrop(scratch->height, scratch->width, options_.central_fraction);
      const bool flip = options_.train && (rng.Next() >> 63) != 0;
      CropResizeFlip(*scratch, box, options_.height, options_.width, flip, out,
                     options_.pixel_max);
      return shard.labels[j];
    }
    status = absl::Status(status.code(), absl::StrCat(shard.Where(j), ": ", status.message()));
    if (!options_.skip_corrupt) return status;
    if (corrupt_[j].exchange(1) == 0) {
      const int64_t count = corrupt_count_.fetch_add(1) + 1;
      if (count <= kCorruptLogged) {
        LOG(WARNING) << "skipping a corrupt image (" << count << " so far"
                     << (count == kCorruptLogged ? "; later ones are only counted" : "")
                     << "): " << status.message();
      }
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "every one of the shard's ", n, " images is corrupt (the first: ", shard.Where(0), ")"));
}

void ImagePipeline::Decode() {
  std::string encoded;  // An image read from disk.
  Image scratch;
  const int b = options_.batch_size;
  mu_.Lock();
  while (true) {
    Slot* slot = nullptr;
    while (!stop_) {
      for (size_t i = 0; i < slots_.size() && slot == nullptr; ++i) {
        Slot& s = slots_[(head_ + i) % slots_.size()];
        if (s.claimed < b) slot = &s;
      }
      if (slot != nullptr) break;
      changed_.Wait(&mu_);
    }
    if (stop_) break;
    const int item = slot->claimed++;
    const int64_t example = slot->examples[item];
    const int64_t epoch = slot->epochs[item];
    float* out = slot->images.data() + item * pixels_;
    mu_.Unlock();
    const absl::Time start = absl::Now();
    absl::StatusOr<int32_t> label = DecodeOne(example, epoch, &encoded, &scratch, out);
    busy_ns_.fetch_add(absl::ToInt64Nanoseconds(absl::Now() - start),
                       std::memory_order_relaxed);
    mu_.Lock();
    if (label.ok()) {
      slot->labels[item] = *label;
    } else if (slot->failed_item < 0 || item < slot->failed_item) {
      slot->failed_item = item;
      slot->status = label.status();
    }
    if (++slot->done == b) changed_.SignalAll();
  }
  mu_.Unlock();
}

absl::Status ImagePipeline::NextBatch(int batch_size, Tensor* images,
                                      std::vector<int32_t>* labels) {
  if (batch_size != options_.batch_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the image pipeline makes batches of ", options_.batch_size, ", not ", batch_size));
  }
  absl::MutexLock lock(&mu_);
  if (!running_) Start();
  Slot& slot = slots_[head_];
  if (slot.done < batch_size) {
    const absl::Time start = absl::Now();
    while (slot.done < batch_size) changed_.Wait(&mu_);
    wait_ += absl::Now() - start;
  }
  if (!slot.status.ok()) return slot.status;  // Final: the slot stays full.
  std::swap(*images, slot.images);
  std::swap(*labels, slot.labels);
  position_ += batch_size;
  head_ = (head_ + 1) % slots_.size();
  Assign(&slot);
  changed_.SignalAll();
  ++batches_;
  return absl::OkStatus();
}

absl::Status ImagePipeline::Skip(int64_t examples) {
  CHECK_GE(examples, 0);
  Stop();
  absl::MutexLock lock(&mu_);
  position_ += examples;
  return absl::OkStatus();
}

ImagePipeline::Stats ImagePipeline::stats() const {
  Stats stats;
  stats.batches = batches_;
  stats.wait = wait_;
  stats.busy = absl::Nanoseconds(busy_ns_.load());
  stats.corrupt_skipped = corrupt_count_.load();
  return stats;
}

absl::StatusOr<Dataset> DecodeImageDataset(std::shared_ptr<const ImageShard> shard,
                                           ImagePipelineOptions options) {
  const int64_t n = shard->size();
  options.train = false;
  options.shuffle = false;
  options.batch_size = static_cast<int>(n);
  options.prefetch_batches = 1;
  ImagePipeline pipeline(std::move(shard), options);
  Dataset data;
  absl::Status status = pipeline.NextBatch(static_cast<int>(n), &data.images, &data.labels);
  if (!status.ok()) return status;
  data.rows = options.height;
  data.cols = options.width;
  return data;
}

}  // namespace psrt
