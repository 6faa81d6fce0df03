// Error checks for CUDA runtime and cuBLAS calls, shared by the .cu files
// and the host-compiled CUDA code (cuda_device.cc). Internal to kernels/.
//   PSRT_CUDA_RECORD(ctx, call): a failure is recorded in the CudaContext
//     (a device fault the step fails with: device_fault.h); evaluates to
//     whether the call succeeded.
//   PSRT_CUDA_CHECK(call): a failure is a broken invariant (freeing what
//     was allocated): CHECK, naming the call and CUDA's message.
#ifndef PSRT_KERNELS_CUDA_CHECK_H_
#define PSRT_KERNELS_CUDA_CHECK_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "glog/logging.h"

#define PSRT_CUDA_CHECK(expr)                              \
  do {                                                     \
    const cudaError_t psrt_err_ = (expr);                  \
    CHECK_EQ(psrt_err_, cudaSuccess)                       \
        << #expr << ": " << cudaGetErrorString(psrt_err_); \
  } while (0)

#define PSRT_CUDA_RECORD(ctx, expr) ((ctx).Record(#expr, (expr)))

#define PSRT_CUBLAS_CHECK(expr)                              \
  do {                                                       \
    const cublasStatus_t psrt_st_ = (expr);                  \
    CHECK_EQ(psrt_st_, CUBLAS_STATUS_SUCCESS)                \
        << #expr << ": " << cublasGetStatusString(psrt_st_); \
  } while (0)

#endif  // PSRT_KERNELS_CUDA_CHECK_H_
