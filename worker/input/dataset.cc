#include "worker/input/dataset.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "glog/logging.h"

namespace psrt {

BatchIterator::BatchIterator(const Dataset* data, int shard, int num_shards,
                             bool shuffle, uint64_t seed)
    : data_(data), shuffle_(shuffle), rng_(seed) {
  CHECK(data != nullptr);
  CHECK_GT(num_shards, 0);
  CHECK_GE(shard, 0);
  CHECK_LT(shard, num_shards);
  for (int64_t i = shard; i < data->size(); i += num_shards) {
    order_.push_back(i);
  }
  CHECK(!order_.empty()) << "shard " << shard << " of " << num_shards
                         << " is empty: the dataset has " << data->size()
                         << " examples";
  StartEpoch();
}

void BatchIterator::StartEpoch() {
  next_ = 0;
  if (!shuffle_) return;
  // Fisher-Yates with a plain modulo rather than std::shuffle, whose draws
  // differ between standard libraries; the bias is below 2^-40.
  for (size_t i = order_.size() - 1; i > 0; --i) {
    std::swap(order_[i], order_[rng_() % (i + 1)]);
  }
}

void BatchIterator::NextBatch(int batch_size, Tensor* images,
                              std::vector<int32_t>* labels) {
  CHECK_GT(batch_size, 0);
  const int64_t dim = data_->images.dim(1);
  if (images->shape() != Shape{batch_size, dim}) {
    images->Resize({batch_size, dim});
  }
  labels->resize(batch_size);
  const float* src = data_->images.data();
  float* dst = images->data();
  for (int b = 0; b < batch_size; ++b) {
    if (next_ == order_.size()) StartEpoch();
    const int64_t i = order_[next_++];
    std::memcpy(dst + b * dim, src + i * dim, dim * sizeof(float));
    (*labels)[b] = data_->labels[i];
  }
}

void BatchIterator::Skip(int64_t examples) {
  CHECK_GE(examples, 0);
  while (examples > 0) {
    if (next_ == order_.size()) StartEpoch();
    const int64_t take = std::min<int64_t>(examples, order_.size() - next_);
    next_ += take;
    examples -= take;
  }
}

Dataset SyntheticDataset(int64_t examples, int64_t pixels, int num_classes, uint64_t seed) {
  Dataset data;
  data.images = Tensor({examples, pixels});
  data.rows = 1;
  data.cols = static_cast<int>(pixels);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  for (float& x : data.images.flat()) x = pixel(rng);
  std::uniform_int_distribution<int32_t> label(0, num_classes - 1);
  data.labels.resize(examples);
  for (int32_t& y : data.labels) y = label(rng);
  return data;
}

}  // namespace psrt
