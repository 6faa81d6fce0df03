// Device selection (device.h): the --gpu_math names, counting GPUs without
// loading CUDA's libraries, and, in a CUDA build, that the CUDA kernels'
// library loads: CI has no GPU, so there it must load and report 0 GPUs,
// never fail to load (which would make every GPU test skip on a GPU
// machine too).
#include "kernels/device.h"

#include <fstream>
#include <sstream>
#include <string>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/device_fault.h"
#include "tests/gpu_test_util.h"

namespace psrt {
namespace kernels {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(DeviceTest, GpuMathNames) {
  EXPECT_EQ(*ParseGpuMath("fp32"), GpuMath::kFp32);
  EXPECT_EQ(*ParseGpuMath("tf32"), GpuMath::kTf32);
  const absl::StatusOr<GpuMath> bad = ParseGpuMath("fp16");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("--gpu_math=fp16"));
}

bool Mapped(const std::string& library) {
  std::ifstream maps("/proc/self/maps");
  std::stringstream text;
  text << maps.rdbuf();
  return text.str().find(library) != std::string::npos;
}

// In a fresh process (the death test re-runs this binary for this test
// alone), counting GPUs and choosing the CPU map none of CUDA's runtime
// libraries: cuBLAS alone is about 540 MB.
TEST(DeviceTest, CountingGpusLoadsNeitherCudartNorCublas) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        VisibleGpuCount();
        DeviceSpec cpu;
        absl::StatusOr<std::unique_ptr<Device>> device = NewDevice(cpu);
        const bool clean = device.ok() && !Mapped("libcublas") &&
                           !Mapped("libcudart") &&
                           !Mapped("libpsrt_kernels_cuda");
        std::exit(clean ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(DeviceTest, TheCudaKernelsLoadInACudaBuild) {
  const absl::StatusOr<int> runtime_gpus = LoadCudaKernels();
  if (!BuiltWithCuda()) {
    ASSERT_FALSE(runtime_gpus.ok());
    EXPECT_THAT(std::string(runtime_gpus.status().message()),
                HasSubstr("without CUDA"));
    return;
  }
  ASSERT_TRUE(runtime_gpus.ok()) << runtime_gpus.status();
  EXPECT_TRUE(Mapped("libpsrt_kernels_cuda"));
  EXPECT_EQ(*runtime_gpus, VisibleGpuCount())
      << "the CUDA runtime and the driver count different GPUs";
  if (*runtime_gpus > 0) return;
  // No GPU here: asking for one says so, and not that something failed to
  // load.
  DeviceSpec gpu;
  gpu.type = DeviceType::kGpu;
  const absl::StatusOr<std::unique_ptr<Device>> device = NewDevice(gpu);
  ASSERT_FALSE(device.ok());
  const std::string message(device.status().message());
  EXPECT_THAT(message, HasSubstr("gpu:0 asked for"));
  EXPECT_THAT(message, Not(HasSubstr("cannot load")));
}

TEST(DeviceFaultTest, IsMarkedAndKeepsItsMessage) {
  const absl::Status fault = DeviceFault("gpu:0: cudaMemcpyAsync(...): an illegal memory access");
  EXPECT_TRUE(IsDeviceFault(fault));
  EXPECT_EQ(fault.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(fault.message(), "gpu:0: cudaMemcpyAsync(...): an illegal memory access");
  EXPECT_FALSE(IsDeviceFault(absl::InternalError("gpu:0: something else")));
  EXPECT_FALSE(IsDeviceFault(absl::OkStatus()));
  // 128-255: what launch.sh's ExitCode policy retries.
  EXPECT_GE(kDeviceFaultExitCode, 128);
  EXPECT_LE(kDeviceFaultExitCode, 255);
}

TEST(DeviceFaultTest, TheCpuNeverFaults) {
  absl::StatusOr<std::unique_ptr<Device>> cpu = NewDevice(DeviceSpec{});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_TRUE((*cpu)->status().ok());
}

// gpu:0, bound to this thread.
absl::StatusOr<std::unique_ptr<Device>> BoundGpu() {
  DeviceSpec spec;
  spec.type = DeviceType::kGpu;
  absl::StatusOr<std::unique_ptr<Device>> gpu = NewDevice(spec);
  if (gpu.ok()) (*gpu)->Bind();
  return gpu;
}

// A failed copy on a GPU is recorded, named, returned by the waits and
// sticky; the process goes on.
TEST(DeviceFaultTest, AFailedGpuCopyIsAStatusNotAnAbort) {
  PSRT_SKIP_WITHOUT_GPU(VisibleGpuCount(), "the driver reports none");
  absl::StatusOr<std::unique_ptr<Device>> gpu = BoundGpu();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  Device& device = **gpu;
  EXPECT_TRUE(device.status().ok());
  const float host[4] = {1, 2, 3, 4};
  // Not a device pointer: cudaMemcpyAsync refuses it.
  device.CopyToDevice(reinterpret_cast<void*>(uintptr_t{8}), host, sizeof(host));
  const absl::Status fault = device.status();
  ASSERT_FALSE(fault.ok());
  EXPECT_TRUE(IsDeviceFault(fault)) << fault;
  EXPECT_THAT(std::string(fault.message()), HasSubstr("gpu:0"));
  EXPECT_THAT(std::string(fault.message()), HasSubstr("cudaMemcpyAsync"));
  EXPECT_EQ(device.WaitForHostCopies(), fault);
  EXPECT_EQ(device.Synchronize(), fault);
}

TEST(DeviceTest, TheCpusHostCopiesHaveAlwaysLanded) {
  absl::StatusOr<std::unique_ptr<Device>> cpu = NewDevice(DeviceSpec{});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_TRUE((*cpu)->HostCopiesLanded((*cpu)->MarkHostCopies()));
}

// HostCopiesLanded answers without waiting: once it says yes the copy's
// bytes are on the host, and its "not yet" is no fault (the next launch and
// the waits still succeed).
TEST(DeviceTest, HostCopiesLandedAsksWithoutWaiting) {
  PSRT_SKIP_WITHOUT_GPU(VisibleGpuCount(), "the driver reports none");
  absl::StatusOr<std::unique_ptr<Device>> gpu = BoundGpu();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  Device& device = **gpu;
  constexpr int64_t kFloats = int64_t{1} << 24;  // 64 MB: some copying to do.
  float* on_device = static_cast<float*>(device.Allocate(kFloats * sizeof(float)));
  float* host = static_cast<float*>(device.host_allocator()->Allocate(kFloats * sizeof(float)));
  ASSERT_NE(on_device, nullptr);
  ASSERT_NE(host, nullptr);
  host[kFloats - 1] = 0;
  device.Fill(on_device, kFloats, 3.0f);
  device.CopyToHostAfterCompute(host, on_device, kFloats * sizeof(float));
  const int mark = device.MarkHostCopies();
  int asked = 0;
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (!device.HostCopiesLanded(mark) && absl::Now() < give_up) ++asked;
  ASSERT_TRUE(device.HostCopiesLanded(mark)) << "not landed after 30 s";
  EXPECT_EQ(host[kFloats - 1], 3.0f) << "landed, but the bytes are not there (asked "
                                     << asked << " times before)";
  EXPECT_TRUE(device.status().ok()) << device.status();
  device.Fill(on_device, kFloats, 4.0f);  // A launch checks the last error.
  EXPECT_TRUE(device.status().ok()) << device.status();
  EXPECT_TRUE(device.WaitForHostCopies(mark).ok());
  EXPECT_TRUE(device.WaitForHostCopies().ok());
  EXPECT_TRUE(device.Synchronize().ok());
  device.host_allocator()->Free(host);
  device.Free(on_device);
}

}  // namespace
}  // namespace kernels
}  // namespace psrt
