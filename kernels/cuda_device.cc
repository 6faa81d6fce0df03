#include "kernels/cuda_device.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "kernels/cuda_check.h"
#include "kernels/cudnn_conv.h"
#include "kernels/cudnn_library.h"
#include "kernels/layers_cuda.h"
#include "kernels/ops_cuda.h"
// After the CUDA ops, which it calls.
#include "kernels/device_ops.h"

namespace psrt {
namespace kernels {
namespace {

absl::Status CudaStatus(const char* what, cudaError_t err) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(err)));
}

// Page-locked host memory (cudaHostAlloc, portable to every GPU of the
// process), so that copies between a tensor and any device are DMA
// transfers that return at once. One for the process: tensors outlive the
// devices they were copied to. Where CUDA cannot give page-locked memory
// (after a device fault every call fails; or the system's limit), it gives
// ordinary memory, which copies still read and write, only slower.
//
// Thread safety: thread-safe.
class PinnedHostAllocator final : public HostAllocator {
 public:
  void* Allocate(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (err == cudaSuccess) return p;
    if (err == cudaErrorMemoryAllocation) cudaGetLastError();  // Not sticky: clear it.
    LOG_FIRST_N(WARNING, 1) << "cudaHostAlloc of " << bytes << " bytes: "
                            << cudaGetErrorString(err)
                            << "; using pageable memory (slower copies)";
    constexpr size_t kAlignment = 256;
    p = std::aligned_alloc(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
    if (p == nullptr) return nullptr;  // The caller reports.
    absl::MutexLock lock(&mu_);
    pageable_.insert(p);
    return p;
  }
  void Free(void* p) override {
    {
      absl::MutexLock lock(&mu_);
      if (pageable_.erase(p) > 0) {
        std::free(p);
        return;
      }
    }
    // Not fatal: tensors may outlive a failed or torn-down CUDA context.
    const cudaError_t err = cudaFreeHost(p);
    LOG_IF(ERROR, err != cudaSuccess) << "cudaFreeHost: " << cudaGetErrorString(err);
  }

 private:
  absl::Mutex mu_;
  std::unordered_set<void*> pageable_ ABSL_GUARDED_BY(mu_);  // Not page-locked.
};

HostAllocator* PinnedAllocator() {
  static HostAllocator* const allocator = new PinnedHostAllocator;
  return allocator;
}

// A caching allocator for one device: freed blocks are kept, keyed by their
// rounded size, and handed out again, so cudaMalloc (and the device-wide
// synchronization of cudaFree) happens only while a model grows its buffers,
// in its first step. All work is on one stream, so a block freed by the host
// may be reused at once: later work on that stream runs after the work that
// used it. Sizes round up to 512 bytes, or to 2 MiB above 1 MiB. Out of
// memory on a healthy device is fatal; any other failure of cudaMalloc (a
// device fault, recorded in the context) gives null, which only the
// device's own ops, failing too, ever see.
//
// Thread safety: not thread-safe (one per CudaDevice).
class CachingAllocator {
 public:
  // REQUIRES: `ctx` outlives the allocator.
  explicit CachingAllocator(const CudaContext& ctx) : ctx_(ctx), device_(ctx.device()) {}
  ~CachingAllocator() {
    LOG_IF(ERROR, !in_use_.empty())
        << "gpu:" << device_ << ": " << in_use_.size()
        << " blocks still in use when the device closes";
    ReleaseCached();
  }

  void* Allocate(size_t bytes) {
    const size_t size = RoundUp(bytes);
    auto cached = free_.find(size);
    void* p = nullptr;
    if (cached != free_.end() && !cached->second.empty()) {
      p = cached->second.back();
      cached->second.pop_back();
    } else {
      cudaError_t err = cudaMalloc(&p, size);
      if (err == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        ReleaseCached();
        err = cudaMalloc(&p, size);
      }
      CHECK(err != cudaErrorMemoryAllocation || !ctx_.status().ok())
          << "gpu:" << device_ << ": cudaMalloc of " << size
          << " bytes: " << cudaGetErrorString(err) << " ("
          << stats_.bytes_reserved << " bytes held by psrt)";
      if (!ctx_.Record("cudaMalloc", err)) return nullptr;
      ++stats_.system_allocations;
      stats_.bytes_reserved += size;
    }
    in_use_.emplace(p, size);
    stats_.bytes_in_use += size;
    return p;
  }

  void Free(void* p) {
    if (p == nullptr) return;  // A failed Allocate's.
    auto it = in_use_.find(p);
    CHECK(it != in_use_.end()) << "Free of a block this device did not give";
    stats_.bytes_in_use -= it->second;
    free_[it->second].push_back(p);
    in_use_.erase(it);
  }

  const DeviceMemoryStats& stats() const { return stats_; }

 private:
  static size_t RoundUp(size_t bytes) {
    constexpr size_t kSmall = 512;
    constexpr size_t kLarge = size_t{2} << 20;
    const size_t unit = bytes <= (size_t{1} << 20) ? kSmall : kLarge;
    return (std::max<size_t>(bytes, 1) + unit - 1) / unit * unit;
  }
  void ReleaseCached() {
    for (auto& [size, blocks] : free_) {
      for (void* p : blocks) {
        // Not fatal: after a device fault every call fails, teardown too.
        const cudaError_t err = cudaFree(p);
        LOG_IF(ERROR, err != cudaSuccess)
            << "gpu:" << device_ << ": cudaFree: " << cudaGetErrorString(err);
        stats_.bytes_reserved -= size;
      }
      blocks.clear();
    }
  }

  const CudaContext& ctx_;
  const int device_;
  std::map<size_t, std::vector<void*>> free_;
  std::unordered_map<void*, size_t> in_use_;
  DeviceMemoryStats stats_;
};

// A side stream and the events that order it against the compute stream.
// Fields are null until Create succeeds; the destructor frees what exists.
struct SideStreams {
  cudaStream_t upload = nullptr;    // Host to device, ahead of compute.
  cudaStream_t download = nullptr;  // Device to host, after compute.
  cudaEvent_t compute_done = nullptr;
  cudaEvent_t uploads_done = nullptr;

  absl::Status Create() {
    RETURN_IF_ERROR(CudaStatus(
        "cudaStreamCreate(upload)",
        cudaStreamCreateWithFlags(&upload, cudaStreamNonBlocking)));
    RETURN_IF_ERROR(CudaStatus(
        "cudaStreamCreate(download)",
        cudaStreamCreateWithFlags(&download, cudaStreamNonBlocking)));
    RETURN_IF_ERROR(CudaStatus(
        "cudaEventCreate",
        cudaEventCreateWithFlags(&compute_done, cudaEventDisableTiming)));
    return CudaStatus(
        "cudaEventCreate",
        cudaEventCreateWithFlags(&uploads_done, cudaEventDisableTiming));
  }
  ~SideStreams() {
    if (uploads_done != nullptr) cudaEventDestroy(uploads_done);
    if (compute_done != nullptr) cudaEventDestroy(compute_done);
    if (download != nullptr) cudaStreamDestroy(download);
    if (upload != nullptr) cudaStreamDestroy(upload);
  }
};

class CudaDevice final : public DeviceOps<CudaContext, CudaConvolutions> {
 public:
  CudaDevice(std::unique_ptr<CudaContext> ctx,
             std::unique_ptr<SideStreams> side,
             std::unique_ptr<CudaConvolutions> convolutions,
             std::string gpu_name)
      : ctx_(std::move(ctx)),
        side_(std::move(side)),
        name_(absl::StrCat("gpu:", ctx_->device(), " (", gpu_name, ")")),
        allocator_(*ctx_),
        convolutions_(std::move(convolutions)) {
    LOG(INFO) << name_ << ": convolutions through " << convolutions_->description();
  }

  ~CudaDevice() override {
    Bind();
    const absl::Status synced = Synchronize();
    LOG_IF(ERROR, !synced.ok()) << name_ << ": " << synced;
    for (cudaEvent_t mark : marks_) cudaEventDestroy(mark);
  }

  DeviceType type() const override { return DeviceType::kGpu; }
  std::string name() const override { return name_; }
  void Bind() override { PSRT_CUDA_RECORD(*ctx_, cudaSetDevice(ctx_->device())); }
  absl::Status Synchronize() override {
    (void)ctx_->Synchronize();  // Recorded in the context; returned below.
    PSRT_CUDA_RECORD(*ctx_, cudaStreamSynchronize(side_->upload));
    return WaitForHostCopies();
  }
  absl::Status status() const override { return ctx_->status(); }

  void* Allocate(size_t bytes) override { return allocator_.Allocate(bytes); }
  void Free(void* p) override { allocator_.Free(p); }
  DeviceMemoryStats memory_stats() const override { return allocator_.stats(); }
  HostAllocator* host_allocator() override { return PinnedAllocator(); }

  void CopyToDevice(void* dst, const void* host, size_t bytes) override {
    if (bytes == 0) return;
    PSRT_CUDA_RECORD(*ctx_, cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice,
                                 ctx_->stream()));
  }
  void CopyOnDevice(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    PSRT_CUDA_RECORD(*ctx_, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                                 ctx_->stream()));
  }
  void Fill(float* x, int64_t n, float value) override {
    kernels::Fill(*ctx_, value, x, n);
  }
  // One event serves each direction: cudaStreamWaitEvent takes the record
  // made just before it.
  void BeginUploads() override {
    PSRT_CUDA_RECORD(*ctx_, cudaEventRecord(side_->compute_done, ctx_->stream()));
    PSRT_CUDA_RECORD(*ctx_, 
        cudaStreamWaitEvent(side_->upload, side_->compute_done, 0));
  }
  void UploadToDevice(void* dst, const void* host, size_t bytes) override {
    if (bytes == 0) return;
    PSRT_CUDA_RECORD(*ctx_, cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice,
                                    side_->upload));
  }
  void ComputeWaitsForUploads() override {
    PSRT_CUDA_RECORD(*ctx_, cudaEventRecord(side_->uploads_done, side_->upload));
    PSRT_CUDA_RECORD(*ctx_, 
        cudaStreamWaitEvent(ctx_->stream(), side_->uploads_done, 0));
  }
  void CopyToHostAfterCompute(void* host, const void* src,
                              size_t bytes) override {
    if (bytes == 0) return;
    // The download stream waits for the compute stream's work so far, then
    // copies while the compute stream goes on.
    PSRT_CUDA_RECORD(*ctx_, cudaEventRecord(side_->compute_done, ctx_->stream()));
    PSRT_CUDA_RECORD(*ctx_, 
        cudaStreamWaitEvent(side_->download, side_->compute_done, 0));
    PSRT_CUDA_RECORD(*ctx_, cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost,
                                    side_->download));
  }
  int MarkHostCopies() override {
    if (next_mark_ == marks_.size()) {
      // Blocking sync: a waiting thread sleeps instead of spinning on a core
      // that the pushes of the gradients already copied need.
      cudaEvent_t mark = nullptr;
      if (!PSRT_CUDA_RECORD(*ctx_, cudaEventCreateWithFlags(
                                       &mark, cudaEventDisableTiming | cudaEventBlockingSync))) {
        return -1;  // Waiting for it returns the fault.
      }
      marks_.push_back(mark);
    }
    PSRT_CUDA_RECORD(*ctx_, cudaEventRecord(marks_[next_mark_], side_->download));
    return static_cast<int>(next_mark_++);
  }
  absl::Status WaitForHostCopies(int mark) override {
    CHECK(mark < 0 || static_cast<size_t>(mark) < next_mark_)
        << "mark " << mark << " was not handed out since the last wait";
    if (mark >= 0) PSRT_CUDA_RECORD(*ctx_, cudaEventSynchronize(marks_[mark]));
    return ctx_->status();
  }
  bool HostCopiesLanded(int mark) override {
    CHECK(mark < 0 || static_cast<size_t>(mark) < next_mark_)
        << "mark " << mark << " was not handed out since the last wait";
    if (mark < 0 || !ctx_->status().ok()) return true;
    const cudaError_t landed = cudaEventQuery(marks_[mark]);
    if (landed == cudaErrorNotReady) {
      // Not an error; clear it where the runtime kept it as the last one,
      // so that the next launch's check does not take it for its own.
      if (cudaPeekAtLastError() == cudaErrorNotReady) cudaGetLastError();
      return false;
    }
    PSRT_CUDA_RECORD(*ctx_, landed);  // A fault: the wait returns it.
    return true;
  }
  absl::Status WaitForHostCopies() override {
    next_mark_ = 0;
    PSRT_CUDA_RECORD(*ctx_, cudaStreamSynchronize(side_->download));
    return ctx_->status();
  }

 protected:
  const CudaContext& ctx() const override { return *ctx_; }
  CudaConvolutions* conv_workspace() override { return convolutions_.get(); }

 private:
  const std::unique_ptr<CudaContext> ctx_;
  const std::unique_ptr<SideStreams> side_;
  const std::string name_;
  // MarkHostCopies's events, reused: [0, next_mark_) are handed out.
  std::vector<cudaEvent_t> marks_;
  size_t next_mark_ = 0;
  CachingAllocator allocator_;
  const std::unique_ptr<CudaConvolutions> convolutions_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Device>> NewCudaDevice(int gpu, GpuMath math,
                                                     GpuConv conv) {
  int count = 0;
  const cudaError_t counted = cudaGetDeviceCount(&count);
  if (counted != cudaSuccess) {
    cudaGetLastError();  // Not sticky: clear it.
    return absl::FailedPreconditionError(absl::StrCat(
        "gpu:", gpu, " asked for, but the CUDA runtime finds no usable GPU: ",
        cudaGetErrorString(counted)));
  }
  if (gpu < 0 || gpu >= count) {
    return absl::FailedPreconditionError(absl::StrCat(
        "gpu:", gpu, " asked for, but this process sees ", count,
        " GPU(s) (CUDA_VISIBLE_DEVICES may hide some)"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<CudaContext> ctx,
                   CudaContext::Create(gpu, math));
  cudaDeviceProp prop;
  RETURN_IF_ERROR(CudaStatus("cudaGetDeviceProperties",
                             cudaGetDeviceProperties(&prop, gpu)));
  auto side = std::make_unique<SideStreams>();
  RETURN_IF_ERROR(side->Create());
  ASSIGN_OR_RETURN(std::unique_ptr<CudaConvolutions> convolutions,
                   CudaConvolutions::Create(*ctx, conv, math));
  return std::unique_ptr<Device>(new CudaDevice(
      std::move(ctx), std::move(side), std::move(convolutions), prop.name));
}

}  // namespace kernels
}  // namespace psrt

extern "C" int PsrtCudaDeviceCount() { return psrt::kernels::CudaDeviceCount(); }

extern "C" psrt::kernels::Device* PsrtNewCudaDevice(int gpu, int math, int conv,
                                                    absl::Status* status) {
  absl::StatusOr<std::unique_ptr<psrt::kernels::Device>> device =
      psrt::kernels::NewCudaDevice(gpu, static_cast<psrt::kernels::GpuMath>(math),
                                   static_cast<psrt::kernels::GpuConv>(conv));
  if (!device.ok()) {
    *status = device.status();
    return nullptr;
  }
  *status = absl::OkStatus();
  return device->release();
}

extern "C" bool PsrtCudnnVersion(std::string* version_or_error) {
  absl::StatusOr<const psrt::kernels::CudnnLibrary*> cudnn = psrt::kernels::LoadCudnn();
  if (!cudnn.ok()) {
    *version_or_error = std::string(cudnn.status().message());
    return false;
  }
  *version_or_error = psrt::kernels::CudnnVersionString((*cudnn)->version);
  return true;
}
