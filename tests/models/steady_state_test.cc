// After the first step at a batch size, ComputeGradients allocates nothing
// through operator new (activations, gradients, im2col buffers and pointer
// lists are all reused), for every convolutional model and the CTR models.
#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/embedding_bag.h"
#include "models/model.h"
#include "tests/models/model_test_util.h"

namespace {
std::atomic<bool> counting{false};
std::atomic<int64_t> allocations{0};
}  // namespace

void* operator new(std::size_t size) {
  if (counting.load(std::memory_order_relaxed)) {
    allocations.fetch_add(1, std::memory_order_relaxed);
  }
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace psrt {
namespace {

class SteadyStateTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SteadyStateTest, SecondStepAllocatesNothing) {
  ModelOptions options;
  options.input_height = options.input_width = 20;
  options.intra_op_threads = 2;
  absl::StatusOr<std::unique_ptr<Model>> model = NewModel(GetParam(), options);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<Tensor> params, grads;
  (*model)->Initialize(1, &params);
  const Tensor images = testing::RandomImages(8, 400, 2);
  const std::vector<int32_t> labels = {0, 1, 2, 3, 4, 5, 6, 7};
  (*model)->ComputeGradients(params, images, labels, &grads);
  allocations = 0;
  counting = true;
  (*model)->ComputeGradients(params, images, labels, &grads);
  (*model)->ComputeGradients(params, images, labels, &grads);
  counting = false;
  EXPECT_EQ(allocations.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Models, SteadyStateTest,
                         ::testing::Values("mlp", "lenet", "inception_mini"));

class CtrSteadyStateTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CtrSteadyStateTest, SecondStepAllocatesNothing) {
  ModelOptions options;
  options.num_dense_features = 5;
  options.num_sparse_fields = 6;
  options.embedding_dim = 8;
  options.hidden_units = {16};
  options.intra_op_threads = 2;
  absl::StatusOr<std::unique_ptr<Model>> model = NewModel(GetParam(), options);
  ASSERT_TRUE(model.ok()) << model.status();
  constexpr int64_t kBatch = 8;
  SparseFeatures features;
  features.num_fields = options.num_sparse_fields;
  for (int64_t i = 0; i < kBatch * features.num_fields; ++i) features.ids.push_back(i % 13);
  kernels::Deduplicate(features.ids, &features.unique);
  for (const TableDef& table : (*model)->tables()) {
    features.rows.push_back(testing::RandomImages(13, table.dim, 3));
  }
  (*model)->SetSparseFeatures(&features);
  std::vector<Tensor> params, grads;
  (*model)->Initialize(1, &params);
  const Tensor dense = testing::RandomImages(kBatch, options.num_dense_features, 2);
  const std::vector<int32_t> labels = {0, 1, 0, 0, 1, 1, 0, 1};
  (*model)->ComputeGradients(params, dense, labels, &grads);
  allocations = 0;
  counting = true;
  (*model)->ComputeGradients(params, dense, labels, &grads);
  (*model)->ComputeGradients(params, dense, labels, &grads);
  counting = false;
  EXPECT_EQ(allocations.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Models, CtrSteadyStateTest, ::testing::Values("wide_deep", "dlrm"));

}  // namespace
}  // namespace psrt
