// The CUDA ops: the ops of ops.h with a CudaContext in place of the
// CpuContext and device pointers in place of host pointers; the same
// contracts (overwrite or add, aliasing) hold. GEMM goes through cuBLAS; the
// element-wise ops are grid-stride kernels over the functors of functors.h,
// the same code the CPU ops run. The CPU ops are the oracle for these.
//
// Everything is queued on the context's stream and returns without waiting;
// nothing here copies between host and device. A failed CUDA or cuBLAS
// call (a launch, or an earlier asynchronous fault surfacing) is recorded in
// the context (CudaContext::status, a device fault: device_fault.h) instead
// of ending the process; the ops after it still run, and what they compute
// is meaningless.
//
// This header compiles with the host compiler too (no CUDA syntax), so host
// code and tests include it directly; they link psrt_kernels_cuda.
#ifndef PSRT_KERNELS_OPS_CUDA_H_
#define PSRT_KERNELS_OPS_CUDA_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/ops.h"

namespace psrt {
namespace kernels {

// CudaContext: one device, one stream and a cuBLAS handle bound to it; the
// GPU counterpart of CpuContext, passed explicitly to every CUDA op.
//
// Thread safety: ops on one context must not be called concurrently (the
// cuBLAS handle is not thread-safe); use one context per thread.
// REQUIRES (every op): the calling thread's current device is device().
class CudaContext {
 public:
  // Makes `device` current on the calling thread and creates a non-blocking
  // stream and a cuBLAS handle on it, in `math`'s mode (ops.h). Fails
  // (FailedPrecondition) where there is no such device or no driver.
  static absl::StatusOr<std::unique_ptr<CudaContext>> Create(
      int device = 0, GpuMath math = GpuMath::kFp32);
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }

  // Waits until everything queued on the stream is done; a failure is
  // recorded too.
  absl::Status Synchronize() const;

  // The first failed call recorded on this context, sticky (a device fault
  // naming the device and the call); OK while none failed.
  const absl::Status& status() const { return status_; }
  // Records `what` as failed unless it succeeded (the first failure
  // counts); returns whether it succeeded. Const: ops take a const context.
  bool Record(const char* what, cudaError_t err) const;
  bool Record(const char* what, cublasStatus_t status) const;
  // Records `what` as failed with `message` (a library's own error text,
  // cuDNN's say), as Record does; returns false.
  bool RecordFailure(const char* what, const char* message) const;

 private:
  CudaContext(int device, cudaStream_t stream, cublasHandle_t cublas)
      : device_(device), stream_(stream), cublas_(cublas) {}
  int device_;
  cudaStream_t stream_;
  cublasHandle_t cublas_;
  mutable absl::Status status_;
};

// Number of CUDA devices; 0 where there is no GPU or no driver.
int CudaDeviceCount();

// ---- The ops of ops.h (same contracts; pointers are device pointers). ----

// REQUIRES (CHECKed): every dimension and leading dimension fits cuBLAS's
// int.
void Gemm(const CudaContext& ctx, const MatMulShape& shape, float alpha,
          const float* a, const float* b, float beta, float* c);
void MatMulForward(const CudaContext& ctx, const MatMulShape& shape,
                   const float* a, const float* b, float* c);
void MatMulBackward(const CudaContext& ctx, const MatMulShape& shape,
                    const float* a, const float* b, const float* dc, float* da,
                    float* db);

void BiasAddForward(const CudaContext& ctx, const float* x, const float* bias,
                    int64_t rows, int64_t cols, float* y);
void BiasAddBackward(const CudaContext& ctx, const float* dy, int64_t rows,
                     int64_t cols, float* dbias);

void ReluForward(const CudaContext& ctx, const float* x, int64_t n, float* y);
void ReluBackward(const CudaContext& ctx, const float* y, const float* dy,
                  int64_t n, float* dx);

// Unlike the CPU op, writes the mean loss to the device scalar *loss instead
// of returning it (returning would need a hidden copy and a wait).
// REQUIRES: 0 <= labels[i] < classes (not checked on the device).
void SoftmaxCrossEntropyForward(const CudaContext& ctx, const float* logits,
                                const int32_t* labels, int64_t batch,
                                int64_t classes, float* loss);
void SoftmaxCrossEntropyBackward(const CudaContext& ctx, const float* logits,
                                 const int32_t* labels, int64_t batch,
                                 int64_t classes, float* dlogits);
// Writes the number of rows predicted right to the device scalar *correct.
void CountCorrect(const CudaContext& ctx, const float* logits,
                  const int32_t* labels, int64_t batch, int64_t classes,
                  int32_t* correct);

// ---- The element-wise helpers of elementwise.h, over n device floats. ----

void ApplySgd(const CudaContext& ctx, float lr, const float* grad, float* var,
              int64_t n);
void ApplyMomentum(const CudaContext& ctx, float lr, float momentum,
                   const float* grad, float* accum, float* var, int64_t n);
void Accumulate(const CudaContext& ctx, const float* grad, float* acc,
                int64_t n);
void Scale(const CudaContext& ctx, float scale, float* x, int64_t n);
// x[i] = value.
void Fill(const CudaContext& ctx, float value, float* x, int64_t n);
void Axpy(const CudaContext& ctx, float a, const float* x, float* y, int64_t n);
// Adds the squares of x into the device scalar *sum (in double; the order
// of the terms is not the CPU's).
void SumOfSquares(const CudaContext& ctx, const float* x, int64_t n, double* sum);
// g += wd * w, and sum(w^2) added into the device scalar *squares: the
// penalty is wd / 2 * *squares (the CPU op returns it; here that would need
// a hidden copy and a wait).
void WeightDecay(const CudaContext& ctx, float wd, const float* w, float* g, int64_t n,
                 double* squares);
// One tensor's part of ClipByGlobalNorm: x *= clip_norm / sqrt(*squares)
// when that norm exceeds clip_norm, where the device scalar *squares holds
// every tensor's SumOfSquares.
void ClipByNorm(const CudaContext& ctx, float clip_norm, const double* squares, float* x,
                int64_t n);

}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_OPS_CUDA_H_
