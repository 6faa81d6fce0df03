// The CUDA implementation of Device (device.h), built when PSRT_CUDA is on.
// Internal to kernels/: callers use NewDevice.
#ifndef PSRT_KERNELS_CUDA_DEVICE_H_
#define PSRT_KERNELS_CUDA_DEVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/device.h"

namespace psrt {
namespace kernels {

// GPU `gpu` of the visible ones: a non-blocking compute stream with its
// cuBLAS handle, a side stream for copies to the host, a caching allocator
// and page-locked host memory. FailedPrecondition where there is no such GPU
// or no driver.
absl::StatusOr<std::unique_ptr<Device>> NewCudaDevice(int gpu);

}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_CUDA_DEVICE_H_
