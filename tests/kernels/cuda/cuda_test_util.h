// Test helpers shared by the CPU/GPU parity tests: device arrays filled from
// and read back to host vectors, and a fixture holding a CPU context (the
// oracle) and a CUDA context, which skips the test where there is no GPU
// (or fails it under PSRT_REQUIRE_GPU=1: tests/gpu_test_util.h).
// Random inputs come from gradient_check.h (RandomVector).
#ifndef PSRT_TESTS_KERNELS_CUDA_CUDA_TEST_UTIL_H_
#define PSRT_TESTS_KERNELS_CUDA_CUDA_TEST_UTIL_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/cpu_context.h"
#include "kernels/ops_cuda.h"
#include "tests/gpu_test_util.h"
#include "tests/kernels/gradient_check.h"

namespace psrt {
namespace kernels {
namespace testing {

// A device array of T, filled from and read back to host vectors. An
// output array (made from a size) starts poisoned, every byte 0xFF (NaN for
// floats), so an op that leaves part of it unwritten fails the comparison.
// The copies and the poisoning are complete when the constructor returns
// (the device is synchronized), so ops queued afterwards on any stream, the
// contexts' non-blocking ones included, read the inputs whole.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& host) : size_(host.size()) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&data_), bytes()),
              cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data_, host.data(), bytes(), cudaMemcpyHostToDevice),
              cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  explicit DeviceArray(size_t size) : size_(size) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&data_), bytes()),
              cudaSuccess);
    EXPECT_EQ(cudaMemset(data_, 0xFF, bytes()), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  ~DeviceArray() { cudaFree(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() { return data_; }
  std::vector<T> ToHost() const {
    std::vector<T> host(size_);
    EXPECT_EQ(cudaMemcpy(host.data(), data_, bytes(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }

 private:
  size_t bytes() const { return size_ * sizeof(T); }
  size_t size_;
  T* data_ = nullptr;
};

// The parity fixture: cpu_ runs the oracle, gpu_ the op under test. Skips
// the test where there is no CUDA device.
class CudaParityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    const cudaError_t counted = cudaGetDeviceCount(&count);
    PSRT_SKIP_WITHOUT_GPU(counted == cudaSuccess ? count : 0,
                          "the CUDA runtime says "
                              << cudaGetErrorString(counted));
    absl::StatusOr<std::unique_ptr<CudaContext>> gpu = CudaContext::Create(0);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = *std::move(gpu);
  }
  void Sync() { ASSERT_TRUE(gpu_->Synchronize().ok()); }

  CpuContext cpu_{2};
  std::unique_ptr<CudaContext> gpu_;
};

}  // namespace testing
}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_TESTS_KERNELS_CUDA_CUDA_TEST_UTIL_H_
