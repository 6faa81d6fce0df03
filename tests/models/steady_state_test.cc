// After the first step at a batch size, ComputeGradients allocates nothing
// through operator new (activations, gradients, im2col buffers and pointer
// lists are all reused), for every convolutional model.
#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "gtest/gtest.h"
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

}  // namespace
}  // namespace psrt
