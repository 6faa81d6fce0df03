// The CUDA implementation of Device (device.h), built when PSRT_CUDA is on
// into the shared library libpsrt_kernels_cuda.so, which device.cc loads at
// run time and enters through the two C functions below. Internal to
// kernels/: callers use NewDevice and VisibleGpuCount.
#ifndef PSRT_KERNELS_CUDA_DEVICE_H_
#define PSRT_KERNELS_CUDA_DEVICE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/device.h"

namespace psrt {
namespace kernels {

// GPU `gpu` of the visible ones: a non-blocking compute stream with its
// cuBLAS handle (in `math`'s mode), its convolutions (cudnn_conv.h, as
// `conv` says), side streams for uploads and for copies to the host, a
// caching allocator and page-locked host memory. FailedPrecondition where
// there is no such GPU or no usable driver, with the CUDA runtime's reason,
// or where `conv` is kCudnn and cuDNN cannot serve.
absl::StatusOr<std::unique_ptr<Device>> NewCudaDevice(int gpu, GpuMath math,
                                                     GpuConv conv);

}  // namespace kernels
}  // namespace psrt

// The library's entry points, looked up by these unmangled names.
extern "C" {
// The number of CUDA devices this process sees; 0 without a driver.
int PsrtCudaDeviceCount();
// NewCudaDevice(gpu, GpuMath(math), GpuConv(conv)): the device (the caller
// owns it), or null with the error in *status.
psrt::kernels::Device* PsrtNewCudaDevice(int gpu, int math, int conv,
                                         absl::Status* status);
// cuDNN's version ("9.19.0") in *version_or_error and true, or why it
// cannot load and false (cudnn_library.h; no GPU needed).
bool PsrtCudnnVersion(std::string* version_or_error);
}

#endif  // PSRT_KERNELS_CUDA_DEVICE_H_
