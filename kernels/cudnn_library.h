// cuDNN 9, loaded at run time (dlopen), so that a GPU machine's own cuDNN
// serves psrt's convolutions and a machine without one still trains (on the
// im2col path, layers_cuda.h). Only the entry points psrt calls, bound by
// name; the types come from cudnn.h at build time. Internal to kernels/
// (libpsrt_kernels_cuda.so).
//
// Where it looks: libcudnn.so.9 by the loader's rules (LD_LIBRARY_PATH, the
// RUNPATH, ldconfig), then the copy in the CUDA toolkit psrt was built with.
#ifndef PSRT_KERNELS_CUDNN_LIBRARY_H_
#define PSRT_KERNELS_CUDNN_LIBRARY_H_

#include <cudnn.h>

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace psrt {
namespace kernels {

// The bound entry points. Immutable once loaded.
struct CudnnLibrary {
  std::string path;  // What dlopen loaded.
  size_t version = 0;  // cudnnGetVersion(): 91900 is 9.19.0.
  decltype(&cudnnGetVersion) GetVersion = nullptr;
  decltype(&cudnnGetErrorString) GetErrorString = nullptr;
  decltype(&cudnnCreate) Create = nullptr;
  decltype(&cudnnDestroy) Destroy = nullptr;
  decltype(&cudnnSetStream) SetStream = nullptr;
  decltype(&cudnnCreateTensorDescriptor) CreateTensorDescriptor = nullptr;
  decltype(&cudnnSetTensor4dDescriptor) SetTensor4dDescriptor = nullptr;
  decltype(&cudnnDestroyTensorDescriptor) DestroyTensorDescriptor = nullptr;
  decltype(&cudnnCreateFilterDescriptor) CreateFilterDescriptor = nullptr;
  decltype(&cudnnSetFilter4dDescriptor) SetFilter4dDescriptor = nullptr;
  decltype(&cudnnDestroyFilterDescriptor) DestroyFilterDescriptor = nullptr;
  decltype(&cudnnCreateConvolutionDescriptor) CreateConvolutionDescriptor = nullptr;
  decltype(&cudnnSetConvolution2dDescriptor) SetConvolution2dDescriptor = nullptr;
  decltype(&cudnnSetConvolutionMathType) SetConvolutionMathType = nullptr;
  decltype(&cudnnDestroyConvolutionDescriptor) DestroyConvolutionDescriptor = nullptr;
  decltype(&cudnnGetConvolution2dForwardOutputDim) GetConvolution2dForwardOutputDim = nullptr;
  decltype(&cudnnFindConvolutionForwardAlgorithm) FindConvolutionForwardAlgorithm = nullptr;
  decltype(&cudnnFindConvolutionBackwardDataAlgorithm) FindConvolutionBackwardDataAlgorithm =
      nullptr;
  decltype(&cudnnFindConvolutionBackwardFilterAlgorithm) FindConvolutionBackwardFilterAlgorithm =
      nullptr;
  decltype(&cudnnConvolutionForward) ConvolutionForward = nullptr;
  decltype(&cudnnConvolutionBackwardData) ConvolutionBackwardData = nullptr;
  decltype(&cudnnConvolutionBackwardFilter) ConvolutionBackwardFilter = nullptr;
};

// The library, loaded and checked on the first call (every entry point
// bound, a version of 9 or later, and a convolution descriptor made and
// destroyed, which loads libcudnn_cnn: no GPU needed); FailedPrecondition
// saying why not (dlopen's reason, the missing symbol, the old version),
// the same on every call. Thread-safe.
absl::StatusOr<const CudnnLibrary*> LoadCudnn();

// "9.19.0" for 91900.
std::string CudnnVersionString(size_t version);

}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_CUDNN_LIBRARY_H_
