#include "kernels/device.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "kernels/activation.h"
#include "kernels/batch_norm.h"
#include "kernels/conv.h"
#include "kernels/depthwise_conv.h"
#include "kernels/cpu_context.h"
#include "kernels/layer_ops.h"
#include "kernels/ops.h"
#include "kernels/pool.h"
#include "kernels/workspace.h"
// After the CPU ops, which it calls.
#include "kernels/device_ops.h"
#if PSRT_WITH_CUDA
#include <dlfcn.h>
#include <unistd.h>

#include <climits>

#include "kernels/cuda_device.h"
#endif

namespace psrt {
namespace kernels {
namespace {

// The CPU: ops run at once on the calling thread and the context's pool;
// memory is the aligned heap; copies are memcpy.
class CpuDevice final : public DeviceOps<CpuContext, Workspace> {
 public:
  explicit CpuDevice(int threads) : ctx_(threads) {}

  DeviceType type() const override { return DeviceType::kCpu; }
  std::string name() const override {
    return absl::StrCat("cpu (", ctx_.num_threads(), " threads)");
  }
  void Bind() override {}
  absl::Status Synchronize() override { return absl::OkStatus(); }
  absl::Status status() const override { return absl::OkStatus(); }

  void* Allocate(size_t bytes) override {
    constexpr size_t kAlignment = 256;
    const size_t rounded =
        (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, rounded);
    CHECK(p != nullptr) << "out of memory allocating " << rounded << " bytes";
    stats_.bytes_in_use += rounded;
    stats_.bytes_reserved += rounded;
    ++stats_.system_allocations;
    sizes_.emplace_back(p, rounded);
    return p;
  }
  void Free(void* p) override {
    auto it = std::find_if(sizes_.begin(), sizes_.end(),
                           [p](const auto& e) { return e.first == p; });
    CHECK(it != sizes_.end()) << "Free of memory this device did not allocate";
    stats_.bytes_in_use -= it->second;
    stats_.bytes_reserved -= it->second;
    *it = sizes_.back();
    sizes_.pop_back();
    std::free(p);
  }
  DeviceMemoryStats memory_stats() const override { return stats_; }
  HostAllocator* host_allocator() override { return nullptr; }

  void CopyToDevice(void* dst, const void* host, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, host, bytes);
  }
  void CopyOnDevice(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memmove(dst, src, bytes);
  }
  void Fill(float* x, int64_t n, float value) override {
    std::fill_n(x, n, value);
  }
  void BeginUploads() override {}
  void UploadToDevice(void* dst, const void* host, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, host, bytes);
  }
  void ComputeWaitsForUploads() override {}
  void CopyToHostAfterCompute(void* host, const void* src,
                              size_t bytes) override {
    if (bytes > 0) std::memcpy(host, src, bytes);
  }
  int MarkHostCopies() override { return 0; }
  absl::Status WaitForHostCopies(int) override { return absl::OkStatus(); }
  absl::Status WaitForHostCopies() override { return absl::OkStatus(); }
  bool HostCopiesLanded(int) override { return true; }

 protected:
  const CpuContext& ctx() const override { return ctx_; }
  Workspace* conv_workspace() override { return &workspace_; }

 private:
  CpuContext ctx_;
  Workspace workspace_;
  DeviceMemoryStats stats_;
  // Live allocations and their sizes; a model holds a few dozen.
  std::vector<std::pair<void*, size_t>> sizes_;
};

#if PSRT_WITH_CUDA
// libpsrt_kernels_cuda.so (cuda_device.h), loaded from the directory of the
// running binary on first use; `error` says why it could not be (logged
// once, with dlopen's reason).
struct CudaLibrary {
  int (*device_count)() = nullptr;
  Device* (*new_device)(int, int, int, absl::Status*) = nullptr;
  bool (*cudnn_version)(std::string*) = nullptr;
  std::string error;
};

const CudaLibrary& LoadCudaLibrary() {
  static const CudaLibrary* const library = [] {
    auto* lib = new CudaLibrary;
    std::string dir = ".";
    char exe[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
      dir.assign(exe, n);
      dir.resize(dir.rfind('/'));
    }
    const std::string path = dir + "/libpsrt_kernels_cuda.so";
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      lib->error = absl::StrCat("cannot load the CUDA kernels: ", dlerror());
    } else {
      lib->device_count =
          reinterpret_cast<int (*)()>(dlsym(handle, "PsrtCudaDeviceCount"));
      lib->new_device = reinterpret_cast<Device* (*)(int, int, int, absl::Status*)>(
          dlsym(handle, "PsrtNewCudaDevice"));
      lib->cudnn_version =
          reinterpret_cast<bool (*)(std::string*)>(dlsym(handle, "PsrtCudnnVersion"));
      if (lib->device_count == nullptr || lib->new_device == nullptr ||
          lib->cudnn_version == nullptr) {
        lib->error = absl::StrCat(path, " lacks psrt's entry points");
        lib->device_count = nullptr;
        lib->new_device = nullptr;
        lib->cudnn_version = nullptr;
      }
    }
    LOG_IF(WARNING, !lib->error.empty()) << lib->error;
    return lib;
  }();
  return *library;
}

// The driver's count of the GPUs this process may use, through libcuda's
// driver API (cuInit, cuDeviceGetCount), so that asking loads neither cudart
// nor cuBLAS. 0 without a driver.
int DriverGpuCount() {
  static const int count = [] {
    void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) return 0;  // No driver: no GPU, nothing to say.
    // CUresult cuInit(unsigned), cuDeviceGetCount(int*); 0 is CUDA_SUCCESS.
    auto init = reinterpret_cast<int (*)(unsigned)>(dlsym(handle, "cuInit"));
    auto get_count =
        reinterpret_cast<int (*)(int*)>(dlsym(handle, "cuDeviceGetCount"));
    int n = 0;
    if (init == nullptr || get_count == nullptr || init(0) != 0 ||
        get_count(&n) != 0) {
      return 0;
    }
    return n;
  }();
  return count;
}
#endif

}  // namespace

bool BuiltWithCuda() { return PSRT_WITH_CUDA != 0; }

absl::StatusOr<GpuMath> ParseGpuMath(const std::string& name) {
  if (name == "fp32") return GpuMath::kFp32;
  if (name == "tf32") return GpuMath::kTf32;
  return absl::InvalidArgumentError(
      absl::StrCat("--gpu_math=", name, ": want fp32 or tf32"));
}

absl::StatusOr<GpuConv> ParseGpuConv(const std::string& name) {
  if (name == "auto") return GpuConv::kAuto;
  if (name == "cudnn") return GpuConv::kCudnn;
  if (name == "im2col") return GpuConv::kIm2col;
  return absl::InvalidArgumentError(
      absl::StrCat("--gpu_conv=", name, ": want auto, cudnn or im2col"));
}

int VisibleGpuCount() {
#if PSRT_WITH_CUDA
  return DriverGpuCount();
#else
  return 0;
#endif
}

absl::StatusOr<int> LoadCudaKernels() {
#if PSRT_WITH_CUDA
  const CudaLibrary& cuda = LoadCudaLibrary();
  if (cuda.device_count == nullptr) {
    return absl::FailedPreconditionError(cuda.error);
  }
  return cuda.device_count();
#else
  return absl::FailedPreconditionError(
      "this psrt was built without CUDA (no nvcc when it was configured)");
#endif
}

absl::StatusOr<std::string> CudnnVersion() {
#if PSRT_WITH_CUDA
  const CudaLibrary& cuda = LoadCudaLibrary();
  if (cuda.cudnn_version == nullptr) {
    return absl::FailedPreconditionError(cuda.error);
  }
  std::string version_or_error;
  if (!cuda.cudnn_version(&version_or_error)) {
    return absl::FailedPreconditionError(version_or_error);
  }
  return version_or_error;
#else
  return absl::FailedPreconditionError(
      "this psrt was built without CUDA (no nvcc when it was configured)");
#endif
}

absl::StatusOr<std::unique_ptr<Device>> NewDevice(const DeviceSpec& spec) {
  if (spec.type == DeviceType::kCpu) {
    return std::unique_ptr<Device>(new CpuDevice(spec.cpu_threads));
  }
#if PSRT_WITH_CUDA
  const CudaLibrary& cuda = LoadCudaLibrary();
  if (cuda.new_device == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("gpu:", spec.gpu, " asked for: ", cuda.error));
  }
  absl::Status status;
  std::unique_ptr<Device> device(cuda.new_device(
      spec.gpu, static_cast<int>(spec.gpu_math), static_cast<int>(spec.gpu_conv), &status));
  if (device == nullptr) return status;
  return device;
#else
  return absl::FailedPreconditionError(absl::StrCat(
      "gpu:", spec.gpu,
      " asked for, but this psrt was built without CUDA (no nvcc when it was "
      "configured); rebuild with the CUDA toolkit, or use --device=cpu"));
#endif
}

}  // namespace kernels
}  // namespace psrt
