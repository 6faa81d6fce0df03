#include "kernels/cudnn_library.h"

#include <dlfcn.h>

#include <memory>
#include <type_traits>

#include "absl/strings/str_cat.h"

namespace psrt {
namespace kernels {
namespace {

// Binds every entry point; the first missing one is the error.
absl::Status Bind(void* handle, CudnnLibrary* lib) {
  absl::Status status;
  auto bind = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
    if (fn == nullptr && status.ok()) {
      status = absl::FailedPreconditionError(
          absl::StrCat(lib->path, " lacks ", name, " (not cuDNN 9's legacy convolution API)"));
    }
  };
  bind(lib->GetVersion, "cudnnGetVersion");
  bind(lib->GetErrorString, "cudnnGetErrorString");
  bind(lib->Create, "cudnnCreate");
  bind(lib->Destroy, "cudnnDestroy");
  bind(lib->SetStream, "cudnnSetStream");
  bind(lib->CreateTensorDescriptor, "cudnnCreateTensorDescriptor");
  bind(lib->SetTensor4dDescriptor, "cudnnSetTensor4dDescriptor");
  bind(lib->DestroyTensorDescriptor, "cudnnDestroyTensorDescriptor");
  bind(lib->CreateFilterDescriptor, "cudnnCreateFilterDescriptor");
  bind(lib->SetFilter4dDescriptor, "cudnnSetFilter4dDescriptor");
  bind(lib->DestroyFilterDescriptor, "cudnnDestroyFilterDescriptor");
  bind(lib->CreateConvolutionDescriptor, "cudnnCreateConvolutionDescriptor");
  bind(lib->SetConvolution2dDescriptor, "cudnnSetConvolution2dDescriptor");
  bind(lib->SetConvolutionMathType, "cudnnSetConvolutionMathType");
  bind(lib->DestroyConvolutionDescriptor, "cudnnDestroyConvolutionDescriptor");
  bind(lib->GetConvolution2dForwardOutputDim, "cudnnGetConvolution2dForwardOutputDim");
  bind(lib->FindConvolutionForwardAlgorithm, "cudnnFindConvolutionForwardAlgorithm");
  bind(lib->FindConvolutionBackwardDataAlgorithm, "cudnnFindConvolutionBackwardDataAlgorithm");
  bind(lib->FindConvolutionBackwardFilterAlgorithm,
       "cudnnFindConvolutionBackwardFilterAlgorithm");
  bind(lib->ConvolutionForward, "cudnnConvolutionForward");
  bind(lib->ConvolutionBackwardData, "cudnnConvolutionBackwardData");
  bind(lib->ConvolutionBackwardFilter, "cudnnConvolutionBackwardFilter");
  return status;
}

// The library at `path`, bound and checked; the handle is closed again on
// failure.
absl::StatusOr<const CudnnLibrary*> LoadFrom(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("cannot load cuDNN: ", dlerror()));
  }
  auto lib = std::make_unique<CudnnLibrary>();
  lib->path = path;
  absl::Status status = Bind(handle, lib.get());
  if (status.ok()) {
    lib->version = lib->GetVersion();
    if (lib->version < 90000) {
      status = absl::FailedPreconditionError(absl::StrCat(
          path, " is cuDNN ", lib->version, ": psrt needs cuDNN 9 or later"));
    }
  }
  if (status.ok()) {
    // The convolution calls live in libcudnn_cnn, which libcudnn.so.9 loads
    // on first use: make that happen now, so that a broken install is said
    // here.
    cudnnConvolutionDescriptor_t conv = nullptr;
    cudnnStatus_t st = lib->CreateConvolutionDescriptor(&conv);
    if (st == CUDNN_STATUS_SUCCESS) {
      st = lib->SetConvolution2dDescriptor(conv, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                           CUDNN_DATA_FLOAT);
      lib->DestroyConvolutionDescriptor(conv);
    }
    if (st != CUDNN_STATUS_SUCCESS) {
      status = absl::FailedPreconditionError(absl::StrCat(
          path, " (cuDNN ", CudnnVersionString(lib->version),
          ") cannot make a convolution descriptor: ", lib->GetErrorString(st)));
    }
  }
  if (!status.ok()) {
    dlclose(handle);
    return status;
  }
  return lib.release();  // Lives as long as the process, like the mapping.
}

// libcudnn.so.9 by the loader's rules, then the toolkit's copy; the first
// failure is the one said.
absl::StatusOr<const CudnnLibrary*> Load() {
  absl::StatusOr<const CudnnLibrary*> loaded = LoadFrom("libcudnn.so.9");
#ifdef PSRT_CUDNN_BUILD_PATH
  if (!loaded.ok()) {
    absl::StatusOr<const CudnnLibrary*> fallback = LoadFrom(PSRT_CUDNN_BUILD_PATH);
    if (fallback.ok()) return fallback;
  }
#endif
  return loaded;
}

}  // namespace

absl::StatusOr<const CudnnLibrary*> LoadCudnn() {
  static const absl::StatusOr<const CudnnLibrary*>* const loaded =
      new absl::StatusOr<const CudnnLibrary*>(Load());
  return *loaded;
}

std::string CudnnVersionString(size_t version) {
  return absl::StrCat(version / 10000, ".", version / 100 % 100, ".", version % 100);
}

}  // namespace kernels
}  // namespace psrt
