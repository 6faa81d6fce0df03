// PrefetchingBatchSource: the inner source's batches in its order (after a
// Skip too), in storage from the allocator given, and its errors and misuse
// said.
#include "worker/input/prefetching_batch_source.h"

#include <atomic>
#include <cstdlib>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "worker/input/dataset.h"

namespace psrt {
namespace {

Dataset Numbered(int examples, int dim) {
  Dataset data;
  data.images = Tensor({examples, dim});
  data.labels.resize(examples);
  for (int i = 0; i < examples; ++i) {
    data.labels[i] = i;
    for (int d = 0; d < dim; ++d) data.images.data()[i * dim + d] = i * 100 + d;
  }
  return data;
}

// Counts what it hands out and frees.
class CountingAllocator : public HostAllocator {
 public:
  void* Allocate(size_t bytes) override {
    ++live;
    return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  }
  void Free(void* p) override {
    --live;
    std::free(p);
  }
  std::atomic<int> live{0};
};

TEST(PrefetchingBatchSourceTest, TheInnerSourcesBatchesInOrder) {
  const Dataset data = Numbered(37, 3);
  DatasetBatchSource expected(&data, 1, 2, /*shuffle=*/true, 7);
  ASSERT_TRUE(expected.Skip(5).ok());
  CountingAllocator allocator;
  {
    PrefetchingBatchSource prefetching(
        std::make_unique<DatasetBatchSource>(&data, 1, 2, /*shuffle=*/true, 7), &allocator);
    ASSERT_TRUE(prefetching.Skip(5).ok());
    Tensor images, want_images;
    std::vector<int32_t> labels, want_labels;
    for (int step = 0; step < 12; ++step) {  // Across several epochs of the shard.
      ASSERT_TRUE(prefetching.NextBatch(4, &images, &labels).ok());
      ASSERT_TRUE(expected.NextBatch(4, &want_images, &want_labels).ok());
      EXPECT_EQ(labels, want_labels) << step;
      ASSERT_EQ(images.shape(), want_images.shape());
      for (int64_t i = 0; i < images.num_elements(); ++i) {
        ASSERT_EQ(images.data()[i], want_images.data()[i]) << step;
      }
      EXPECT_EQ(images.allocator(), &allocator) << step;
    }
    EXPECT_FALSE(prefetching.Skip(1).ok());
    const absl::Status other_size = prefetching.NextBatch(5, &images, &labels);
    EXPECT_EQ(other_size.code(), absl::StatusCode::kFailedPrecondition) << other_size;
  }
  EXPECT_EQ(allocator.live.load(), 0);
}

// Fails at its third batch.
class FailingSource : public BatchSource {
 public:
  absl::Status NextBatch(int batch_size, Tensor* images, std::vector<int32_t>* labels) override {
    if (++batches_ == 3) return absl::DataLossError("record 17 is corrupt");
    images->Resize({batch_size, 2});
    labels->assign(batch_size, batches_);
    return absl::OkStatus();
  }
  absl::Status Skip(int64_t) override { return absl::OkStatus(); }

 private:
  int batches_ = 0;
};

TEST(PrefetchingBatchSourceTest, AnErrorReachesTheCallForThatBatchAndStays) {
  PrefetchingBatchSource prefetching(std::make_unique<FailingSource>(), nullptr);
  Tensor images;
  std::vector<int32_t> labels;
  ASSERT_TRUE(prefetching.NextBatch(2, &images, &labels).ok());
  EXPECT_EQ(labels, std::vector<int32_t>({1, 1}));
  ASSERT_TRUE(prefetching.NextBatch(2, &images, &labels).ok());
  EXPECT_EQ(labels, std::vector<int32_t>({2, 2}));
  for (int i = 0; i < 2; ++i) {
    const absl::Status failed = prefetching.NextBatch(2, &images, &labels);
    EXPECT_EQ(failed.code(), absl::StatusCode::kDataLoss) << failed;
    EXPECT_NE(failed.message().find("record 17"), absl::string_view::npos) << failed;
  }
}

TEST(PrefetchingBatchSourceTest, DestroyedWhileMakingABatch) {
  const Dataset data = Numbered(1000, 500);
  PrefetchingBatchSource prefetching(
      std::make_unique<DatasetBatchSource>(&data, 0, 1, /*shuffle=*/true, 1), nullptr);
  Tensor images;
  std::vector<int32_t> labels;
  ASSERT_TRUE(prefetching.NextBatch(500, &images, &labels).ok());
  // The next batch is being made as the source goes away.
}

}  // namespace
}  // namespace psrt
