#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "kernels/cuda_launch.cuh"
#include "kernels/device_fault.h"
#include "kernels/functors.h"
#include "kernels/matmul_backward.h"
#include "kernels/ops_cuda.h"

namespace psrt {
namespace kernels {
namespace {

using cuda::BlocksFor;
using cuda::kThreadsPerBlock;
using cuda::LaunchForEachIndex;

// Adds every row's share of the mean loss into *loss (zeroed beforehand).
__global__ void SoftmaxLossKernel(functor::SoftmaxCrossEntropyRow f,
                                  float* loss) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < f.rows;
       r += int64_t{blockDim.x} * gridDim.x) {
    atomicAdd(loss, f(r));
  }
}

// Adds 1 into *correct for every row predicted right (zeroed beforehand).
__global__ void CountCorrectKernel(functor::CorrectPrediction f, int64_t rows,
                                   int32_t* correct) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < rows;
       r += int64_t{blockDim.x} * gridDim.x) {
    if (f(r)) atomicAdd(correct, 1);
  }
}

// Adds f(0) + ... + f(n - 1) (doubles) into *sum: per thread, then per
// block in shared memory, then one atomic add per block.
template <class F>
__global__ void SumKernel(int64_t n, F f, double* sum) {
  __shared__ double partial[kThreadsPerBlock];
  double mine = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    mine += f(i);
  }
  partial[threadIdx.x] = mine;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(sum, partial[0]);
}

template <class F>
void LaunchSum(const CudaContext& ctx, int64_t n, const F& f, double* sum) {
  if (n <= 0) return;
  SumKernel<<<BlocksFor(n), kThreadsPerBlock, 0, ctx.stream()>>>(n, f, sum);
  PSRT_CUDA_RECORD(ctx, cudaGetLastError());
}

absl::Status CudaError(const char* what, cudaError_t err) {
  return absl::FailedPreconditionError(
      absl::StrCat(what, ": ", cudaGetErrorString(err)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaContext>> CudaContext::Create(int device,
                                                                 GpuMath math) {
  cudaError_t err = cudaSetDevice(device);
  if (err != cudaSuccess) {
    return CudaError(absl::StrCat("cudaSetDevice(", device, ")").c_str(), err);
  }
  cudaStream_t stream;
  err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (err != cudaSuccess) return CudaError("cudaStreamCreate", err);
  cublasHandle_t cublas = nullptr;
  cublasStatus_t st = cublasCreate(&cublas);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetStream(cublas, stream);
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasSetMathMode(cublas, math == GpuMath::kTf32
                                       ? CUBLAS_TF32_TENSOR_OP_MATH
                                       : CUBLAS_DEFAULT_MATH);
  }
  if (st != CUBLAS_STATUS_SUCCESS) {
    if (cublas != nullptr) cublasDestroy(cublas);
    cudaStreamDestroy(stream);
    return absl::FailedPreconditionError(
        absl::StrCat("cuBLAS: ", cublasGetStatusString(st)));
  }
  return std::unique_ptr<CudaContext>(new CudaContext(device, stream, cublas));
}

CudaContext::~CudaContext() {
  cublasDestroy(cublas_);
  cudaStreamDestroy(stream_);
}

absl::Status CudaContext::Synchronize() const {
  Record("cudaStreamSynchronize", cudaStreamSynchronize(stream_));
  return status_;
}

bool CudaContext::Record(const char* what, cudaError_t err) const {
  if (err == cudaSuccess) return true;
  return RecordFailure(what, cudaGetErrorString(err));
}

bool CudaContext::Record(const char* what, cublasStatus_t status) const {
  if (status == CUBLAS_STATUS_SUCCESS) return true;
  return RecordFailure(what, cublasGetStatusString(status));
}

bool CudaContext::RecordFailure(const char* what, const char* message) const {
  if (status_.ok()) {
    status_ = DeviceFault(absl::StrCat("gpu:", device_, ": ", what, ": ", message));
  }
  return false;
}

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // Clear the error, which is not sticky.
    return 0;
  }
  return count;
}

// cuBLAS is column-major. A row-major [r, c] matrix is the column-major
// [c, r] matrix of the same memory, its transpose; so row-major
// c = op(a) op(b) is column-major c^T = op(b)^T op(a)^T: swap the operands
// and keep the flags.
void Gemm(const CudaContext& ctx, const MatMulShape& s, float alpha,
          const float* a, const float* b, float beta, float* c) {
  CHECK(s.m >= 0 && s.n >= 0 && s.k >= 0)
      << "negative GEMM dimension: m=" << s.m << " n=" << s.n << " k=" << s.k;
  if (s.m == 0 || s.n == 0) return;
  const int64_t lda = s.transpose_a ? s.m : s.k;
  const int64_t ldb = s.transpose_b ? s.k : s.n;
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  CHECK(s.m <= kMaxInt && s.n <= kMaxInt && s.k <= kMaxInt && lda <= kMaxInt &&
        ldb <= kMaxInt)
      << "GEMM dimension past cuBLAS's int: m=" << s.m << " n=" << s.n
      << " k=" << s.k;
  PSRT_CUDA_RECORD(ctx, cublasSgemm(
      ctx.cublas(), s.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N,
      s.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(s.n),
      static_cast<int>(s.m), static_cast<int>(s.k), &alpha, b,
      static_cast<int>(std::max<int64_t>(ldb, 1)), a,
      static_cast<int>(std::max<int64_t>(lda, 1)), &beta, c,
      static_cast<int>(s.n)));
}

void MatMulForward(const CudaContext& ctx, const MatMulShape& shape,
                   const float* a, const float* b, float* c) {
  Gemm(ctx, shape, 1.0f, a, b, 0.0f, c);
}

void MatMulBackward(const CudaContext& ctx, const MatMulShape& shape,
                    const float* a, const float* b, const float* dc, float* da,
                    float* db) {
  internal::MatMulBackwardWith(ctx, shape, a, b, dc, da, db);
}

void BiasAddForward(const CudaContext& ctx, const float* x, const float* bias,
                    int64_t rows, int64_t cols, float* y) {
  cuda::LaunchForEachRowCol(ctx, rows, cols,
                            functor::BiasAdd{x, bias, cols, y});
}

void BiasAddBackward(const CudaContext& ctx, const float* dy, int64_t rows,
                     int64_t cols, float* dbias) {
  // The column-reduction kernel: a column per thread of a 32-wide strip, the
  // rows shared among blocks (one thread per column would leave a GPU idle).
  cuda::ColumnSums(ctx, rows, cols, cuda::ScaledValue{dy, cols, 1.0f}, dbias);
}

void ReluForward(const CudaContext& ctx, const float* x, int64_t n, float* y) {
  LaunchForEachIndex(ctx, n, functor::Relu{x, y});
}

void ReluBackward(const CudaContext& ctx, const float* y, const float* dy,
                  int64_t n, float* dx) {
  LaunchForEachIndex(ctx, n, functor::ReluGrad{y, dy, dx});
}

void SoftmaxCrossEntropyForward(const CudaContext& ctx, const float* logits,
                                const int32_t* labels, int64_t batch,
                                int64_t classes, float* loss) {
  CHECK_GE(batch, 1);
  CHECK_GE(classes, 1);
  PSRT_CUDA_RECORD(ctx, cudaMemsetAsync(loss, 0, sizeof(float), ctx.stream()));
  SoftmaxLossKernel<<<BlocksFor(batch), kThreadsPerBlock, 0, ctx.stream()>>>(
      functor::SoftmaxCrossEntropyRow{logits, labels, batch, classes,
                                      /*dlogits=*/nullptr},
      loss);
  PSRT_CUDA_RECORD(ctx, cudaGetLastError());
}

void SoftmaxCrossEntropyBackward(const CudaContext& ctx, const float* logits,
                                 const int32_t* labels, int64_t batch,
                                 int64_t classes, float* dlogits) {
  CHECK_GE(batch, 1);
  CHECK_GE(classes, 1);
  LaunchForEachIndex(
      ctx, batch,
      functor::SoftmaxCrossEntropyRow{logits, labels, batch, classes, dlogits});
}

void ApplySgd(const CudaContext& ctx, float lr, const float* grad, float* var,
              int64_t n) {
  LaunchForEachIndex(ctx, n, functor::SgdUpdate{lr, grad, var});
}

void ApplyMomentum(const CudaContext& ctx, float lr, float momentum,
                   const float* grad, float* accum, float* var, int64_t n) {
  LaunchForEachIndex(ctx, n,
                     functor::MomentumUpdate{lr, momentum, grad, accum, var});
}

void CountCorrect(const CudaContext& ctx, const float* logits,
                  const int32_t* labels, int64_t batch, int64_t classes,
                  int32_t* correct) {
  PSRT_CUDA_RECORD(ctx, cudaMemsetAsync(correct, 0, sizeof(int32_t), ctx.stream()));
  if (batch <= 0) return;
  CountCorrectKernel<<<BlocksFor(batch), kThreadsPerBlock, 0, ctx.stream()>>>(
      functor::CorrectPrediction{logits, labels, classes}, batch, correct);
  PSRT_CUDA_RECORD(ctx, cudaGetLastError());
}

void Accumulate(const CudaContext& ctx, const float* grad, float* acc,
                int64_t n) {
  LaunchForEachIndex(ctx, n, functor::Accumulate{grad, acc});
}

void Scale(const CudaContext& ctx, float scale, float* x, int64_t n) {
  LaunchForEachIndex(ctx, n, functor::Scale{scale, x});
}

void Fill(const CudaContext& ctx, float value, float* x, int64_t n) {
  LaunchForEachIndex(ctx, n, functor::Fill{value, x});
}

void Axpy(const CudaContext& ctx, float a, const float* x, float* y, int64_t n) {
  LaunchForEachIndex(ctx, n, functor::Axpy{a, x, y});
}

void SumOfSquares(const CudaContext& ctx, const float* x, int64_t n, double* sum) {
  LaunchSum(ctx, n, functor::SquaredValue{x}, sum);
}

void WeightDecay(const CudaContext& ctx, float wd, const float* w, float* g, int64_t n,
                 double* squares) {
  LaunchForEachIndex(ctx, n, functor::WeightDecayGrad{wd, w, g});
  SumOfSquares(ctx, w, n, squares);
}

void ClipByNorm(const CudaContext& ctx, float clip_norm, const double* squares, float* x,
                int64_t n) {
  LaunchForEachIndex(ctx, n, functor::ClipByNorm{clip_norm, squares, x});
}

}  // namespace kernels
}  // namespace psrt
