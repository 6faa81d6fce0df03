// Device: where a model's forward and backward run, chosen at run time.
//
// One interface over the CPU (CpuContext, the ops of ops.h, conv.h, ...) and
// a CUDA GPU (CudaContext, the ops of ops_cuda.h and layers_cuda.h), so that
// a model is written once against it (models/net.cc). Each op has the
// contract of the CPU op of the same name; pointers are the device's memory
// (host memory on the CPU). The two implementations only forward: the math
// lives in the kernels and their shared functors.
//
// Faults: a GPU's failed call does not end the process; the device records
// it (status(), sticky), and the waits (WaitForHostCopies, Synchronize)
// return it. Out of memory in Allocate on a healthy device is still fatal;
// after a fault Allocate gives null (which only the failing ops see).
//
// Memory: Allocate/Free go through the device's caching allocator (the heap
// on the CPU; on a GPU freed blocks are kept for reuse, so a step that frees
// and allocates the same sizes calls cudaMalloc and cudaFree never).
// host_allocator() gives page-locked host memory on a GPU (null on the CPU)
// for the tensors the worker pulls into and pushes from, so that copies
// between them and the device are asynchronous.
//
// Ordering: everything is queued in order on the device's compute stream
// (the CPU runs it at once), except two kinds of copies on side streams:
// - Uploads (UploadToDevice) run on an upload stream, so that a layer's
//   parameters travel while the layers before it compute. BeginUploads makes
//   the upload stream wait for the compute stream's work so far (which may
//   still read the destinations); ComputeWaitsForUploads makes the compute
//   stream's later work wait for the uploads queued so far.
// - CopyToHostAfterCompute queues a copy on a download stream that starts
//   when the compute work queued so far is done and overlaps the work queued
//   after it. MarkHostCopies names the downloads queued so far, so that
//   WaitForHostCopies(mark) waits for those alone (a layer's gradients);
//   WaitForHostCopies() waits for all, and ends the marks handed out;
//   HostCopiesLanded(mark) asks without waiting.
// Synchronize waits for everything.
//
// Thread safety: not thread-safe; one device per thread (towers own one
// each). REQUIRES: Bind() on the calling thread before the first call there.
#ifndef PSRT_KERNELS_DEVICE_H_
#define PSRT_KERNELS_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/tensor.h"
#include "kernels/activation.h"
#include "kernels/batch_norm.h"
#include "kernels/layer_ops.h"
#include "kernels/ops.h"
#include "kernels/window.h"

namespace psrt {
namespace kernels {

enum class DeviceType { kCpu, kGpu };

// How a GPU runs its convolutions (kernels/cudnn_conv.h): kAuto, per shape
// and direction, the faster of cuDNN and im2col + cuBLAS, measured on first
// use (im2col alone, with a warning, where cuDNN does not load); kCudnn
// through cuDNN wherever it has an algorithm, a device without cuDNN being
// an error; kIm2col never through cuDNN (the fallback, and the path its
// tests compare with).
enum class GpuConv { kAuto, kCudnn, kIm2col };

struct DeviceSpec {
  DeviceType type = DeviceType::kCpu;
  int gpu = 0;          // kGpu: the CUDA device ordinal (of the visible ones).
  int cpu_threads = 0;  // kCpu: intra-op threads; 0 is one per core.
  GpuMath gpu_math = GpuMath::kFp32;  // kGpu only (ops.h).
  GpuConv gpu_conv = GpuConv::kAuto;  // kGpu only.
};

// "fp32" or "tf32" (the --gpu_math flag); InvalidArgument naming the value
// otherwise.
absl::StatusOr<GpuMath> ParseGpuMath(const std::string& name);
// "auto", "cudnn" or "im2col" (the --gpu_conv flag); InvalidArgument naming
// the value otherwise.
absl::StatusOr<GpuConv> ParseGpuConv(const std::string& name);

// Counters of a device's allocator, for tests and memory reports.
struct DeviceMemoryStats {
  int64_t bytes_in_use = 0;
  int64_t bytes_reserved = 0;     // In use plus cached for reuse.
  int64_t system_allocations = 0;  // cudaMalloc calls (heap calls on the CPU).
};

class Device {
 public:
  virtual ~Device() = default;

  virtual DeviceType type() const = 0;
  // "cpu" or "gpu:N (name)", for logs.
  virtual std::string name() const = 0;
  // Whether device pointers are host pointers (the CPU): a model then uses
  // the caller's tensors in place and copies nothing.
  bool host_memory() const { return type() == DeviceType::kCpu; }
  // Makes this device current on the calling thread (cudaSetDevice).
  virtual void Bind() = 0;
  // Waits for everything queued; status() after.
  virtual absl::Status Synchronize() = 0;
  // The device's first fault (device_fault.h: a failed CUDA call, launch
  // or copy, naming the device and the call), sticky: once it is not OK,
  // what the device computed since is meaningless, and waits return it.
  // Always OK on the CPU.
  virtual absl::Status status() const = 0;

  // ---- Memory. ----
  // At least `bytes` bytes, 256-byte aligned; never null while status() is
  // OK (out of memory is fatal). REQUIRES for Free: p came from Allocate on this device, and no
  // queued work uses it any more except work on the compute stream.
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* p) = 0;
  virtual DeviceMemoryStats memory_stats() const = 0;
  virtual HostAllocator* host_allocator() = 0;

  // Copies on the compute stream, in order with the ops. CopyToDevice may
  // return before `host` has been read: keep it unchanged until the next
  // Synchronize (or until the copy's result is waited for).
  virtual void CopyToDevice(void* dst, const void* host, size_t bytes) = 0;
  virtual void CopyOnDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual void Fill(float* x, int64_t n, float value) = 0;
  // See Ordering above. `host` should be page-locked (host_allocator()) for
  // the copy to be asynchronous. REQUIRES: `host` is unchanged until the
  // compute stream has waited for the upload (ComputeWaitsForUploads) and
  // that work has run.
  virtual void BeginUploads() = 0;
  virtual void UploadToDevice(void* dst, const void* host, size_t bytes) = 0;
  virtual void ComputeWaitsForUploads() = 0;
  // See Ordering above. REQUIRES: `src` is not written before
  // WaitForHostCopies returns.
  virtual void CopyToHostAfterCompute(void* host, const void* src,
                                      size_t bytes) = 0;
  virtual int MarkHostCopies() = 0;
  // REQUIRES: `mark` came from MarkHostCopies since the last
  // WaitForHostCopies().
  virtual absl::Status WaitForHostCopies(int mark) = 0;
  virtual absl::Status WaitForHostCopies() = 0;
  // Whether WaitForHostCopies(mark) would return at once: the copies have
  // landed (or the device faulted, which the wait then returns). Never
  // blocks. REQUIRES: as WaitForHostCopies(mark).
  virtual bool HostCopiesLanded(int mark) = 0;

  // ---- Ops (ops.h). ----
  virtual void MatMulForward(const MatMulShape& shape, const float* a,
                             const float* b, float* c) = 0;
  virtual void MatMulBackward(const MatMulShape& shape, const float* a,
                              const float* b, const float* dc, float* da,
                              float* db) = 0;
  virtual void BiasAddForward(const float* x, const float* bias, int64_t rows,
                              int64_t cols, float* y) = 0;
  virtual void BiasAddBackward(const float* dy, int64_t rows, int64_t cols,
                               float* dbias) = 0;
  virtual void ReluForward(const float* x, int64_t n, float* y) = 0;
  virtual void ReluBackward(const float* y, const float* dy, int64_t n,
                            float* dx) = 0;
  // Writes the batch's mean loss to the device scalar *loss.
  virtual void SoftmaxCrossEntropyForward(const float* logits,
                                          const int32_t* labels, int64_t batch,
                                          int64_t classes, float* loss) = 0;
  virtual void SoftmaxCrossEntropyBackward(const float* logits,
                                           const int32_t* labels, int64_t batch,
                                           int64_t classes, float* dlogits) = 0;
  // Writes to the device scalar *correct the number of rows whose arg-max
  // (the first, on ties) is the label.
  virtual void CountCorrect(const float* logits, const int32_t* labels,
                            int64_t batch, int64_t classes,
                            int32_t* correct) = 0;
  // acc[i] += x[i].
  virtual void Accumulate(const float* x, float* acc, int64_t n) = 0;

  // ---- Layer ops (conv.h, depthwise_conv.h, pool.h, batch_norm.h, layer_ops.h,
  // activation.h). ----
  // The convolutions use the device's own workspace. Conv2D's bias (and
  // its gradient) may be null: none.
  virtual void Conv2DForward(const Conv2DShape& shape, const float* x,
                             const float* filter, const float* bias,
                             float* y) = 0;
  virtual void Conv2DBackward(const Conv2DShape& shape, const float* x,
                              const float* filter, const float* dy, float* dx,
                              float* dfilter, float* dbias) = 0;
  virtual void DepthwiseConv2DForward(const DepthwiseConv2DShape& shape, const float* x,
                                      const float* filter, float* y) = 0;
  virtual void DepthwiseConv2DBackward(const DepthwiseConv2DShape& shape, const float* x,
                                       const float* filter, const float* dy, float* dx,
                                       float* dfilter) = 0;
  virtual void MaxPoolForward(const Pool2DShape& shape, const float* x,
                              float* y) = 0;
  virtual void MaxPoolBackward(const Pool2DShape& shape, const float* x,
                               const float* y, const float* dy, float* dx) = 0;
  virtual void AvgPoolForward(const Pool2DShape& shape, const float* x,
                              float* y) = 0;
  virtual void AvgPoolBackward(const Pool2DShape& shape, const float* dy,
                               float* dx) = 0;
  virtual void GlobalAvgPoolForward(const float* x, int64_t batch,
                                    int64_t pixels, int64_t channels,
                                    float* y) = 0;
  virtual void GlobalAvgPoolBackward(const float* dy, int64_t batch,
                                     int64_t pixels, int64_t channels,
                                     float* dx) = 0;
  virtual void BatchNormTrainingForward(const BatchNormShape& s, const float* x,
                                        const float* gamma, const float* beta,
                                        float* moving_mean, float* moving_var,
                                        float* saved_mean,
                                        float* saved_inv_std, float* y) = 0;
  virtual void BatchNormTrainingBackward(
      const BatchNormShape& s, const float* x, const float* dy,
      const float* gamma, const float* saved_mean, const float* saved_inv_std,
      float* dx, float* dgamma, float* dbeta) = 0;
  virtual void BatchNormInferenceForward(const BatchNormShape& s,
                                         const float* x, const float* gamma,
                                         const float* beta,
                                         const float* moving_mean,
                                         const float* moving_var, float* y) = 0;
  // kernels/batch_norm.h's layer norm.
  virtual void LayerNormForward(const LayerNormShape& s, const float* x, const float* gamma,
                                const float* beta, float* saved_mean, float* saved_inv_std,
                                float* y) = 0;
  virtual void LayerNormBackward(const LayerNormShape& s, const float* x, const float* dy,
                                 const float* gamma, const float* saved_mean,
                                 const float* saved_inv_std, float* row_scratch, float* dx,
                                 float* dgamma, float* dbeta) = 0;
  // `inputs` and `dinputs` are host arrays of device pointers.
  virtual void ConcatChannelsForward(int64_t pixels,
                                     absl::Span<const float* const> inputs,
                                     absl::Span<const int64_t> channels,
                                     float* y) = 0;
  virtual void ConcatChannelsBackward(int64_t pixels, const float* dy,
                                      absl::Span<const int64_t> channels,
                                      absl::Span<float* const> dinputs) = 0;
  virtual void ActivationForward(const ActivationSpec& spec, const float* x, int64_t n,
                                 float* y) = 0;
  virtual void ActivationBackward(const ActivationSpec& spec, const float* x, const float* dy,
                                  int64_t n, float* dx) = 0;
  virtual void ChannelAffineForward(const float* x, const float* scale, const float* offset,
                                    int64_t pixels, int64_t channels, float* y) = 0;
  virtual void MultiplyForward(const MultiplyShape& shape, const float* a, const float* b,
                               float* y) = 0;
  virtual void MultiplyBackward(const MultiplyShape& shape, const float* a, const float* b,
                                const float* dy, float* da, float* db) = 0;
  virtual void ZeroPad2DForward(const Pad2DShape& shape, const float* x, float* y) = 0;
  virtual void ZeroPad2DBackward(const Pad2DShape& shape, const float* dy, float* dx) = 0;
  virtual void DropoutForward(const float* x, int64_t n, float keep_prob,
                              uint64_t seed, float* y, const DropoutNoise& noise) = 0;
  virtual void DropoutBackward(const float* dy, int64_t n, float keep_prob,
                               uint64_t seed, float* dx, const DropoutNoise& noise) = 0;
};

// The number of CUDA devices this process sees (CUDA_VISIBLE_DEVICES
// applies); 0 without a GPU, a driver, or a CUDA build. Asks the driver
// (libcuda) alone: it loads neither the CUDA kernels nor cudart and cuBLAS,
// so a process that then runs on the CPU never maps them.
int VisibleGpuCount();

// Whether this binary was built with the CUDA kernels.
bool BuiltWithCuda();

// Loads the CUDA kernels (libpsrt_kernels_cuda.so beside the binary, which
// loads cudart and cuBLAS) and returns the number of GPUs the CUDA runtime
// sees, 0 on a machine without one. FailedPrecondition with dlopen's reason
// where the library cannot be loaded (a missing cudart or cuBLAS, say), or
// in a build without CUDA. NewDevice does the same load; this is for
// checks that must tell "no GPU" from "cannot load" (psrtctl devices, tests).
absl::StatusOr<int> LoadCudaKernels();

// cuDNN's version ("9.19.0"), loaded as a GPU device would load it
// (cudnn_library.h: no GPU needed), or FailedPrecondition saying why it
// cannot be: the CUDA kernels do not load, or cuDNN does not.
absl::StatusOr<std::string> CudnnVersion();

// The device of `spec`. FailedPrecondition naming the GPU where there is no
// such GPU, no driver, or no CUDA build.
absl::StatusOr<std::unique_ptr<Device>> NewDevice(const DeviceSpec& spec);

// DeviceArray: a growable array of T in a device's memory, the device
// counterpart of a Tensor's storage. Reserve keeps the storage when it is
// large enough, so buffers reused from step to step allocate once.
//
// Thread safety: as the device's.
template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  ~DeviceArray() { Release(); }
  DeviceArray(DeviceArray&& other) noexcept { *this = std::move(other); }
  DeviceArray& operator=(DeviceArray&& other) noexcept {
    if (this != &other) {
      Release();
      device_ = other.device_;
      data_ = other.data_;
      capacity_ = other.capacity_;
      other.data_ = nullptr;
      other.capacity_ = 0;
    }
    return *this;
  }

  // At least n elements on `device`; contents unspecified after a growth.
  // REQUIRES: the same device on every call.
  T* Reserve(Device* device, int64_t n) {
    if (n > capacity_ || device_ != device) {
      Release();
      device_ = device;
      data_ = static_cast<T*>(device->Allocate(sizeof(T) * (n > 0 ? n : 1)));
      capacity_ = n;
    }
    return data_;
  }
  T* data() const { return data_; }
  int64_t capacity() const { return capacity_; }

 private:
  void Release() {
    if (data_ != nullptr) device_->Free(data_);
    data_ = nullptr;
    capacity_ = 0;
  }
  Device* device_ = nullptr;
  T* data_ = nullptr;
  int64_t capacity_ = 0;
};

}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_DEVICE_H_
