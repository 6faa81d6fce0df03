// CudaConvolutions: a GPU's Conv2D (conv.h's contract: NHWC images, HWIO
// filters, TensorFlow's SAME/VALID padding), through cuDNN
// (cudnn_library.h) where it serves, else through im2col + cuBLAS
// (layers_cuda.h).
//
// Per shape (batch included) it makes a plan once: cuDNN's descriptors, and
// for each direction (forward, backward data, backward filter) the path
// measured fastest on the first call that needs it: cuDNN's fastest
// algorithm (cudnnFind*Algorithm) in the device's math mode (fp32: FMA
// kernels only; tf32: tensor cores allowed, never fp16) within 1 GiB of
// scratch, against im2col, each timed on the stream with the call's own
// buffers (GpuConv::kAuto; kCudnn takes cuDNN's wherever it has one). The
// stream is synchronized for that, so the first step of a model takes some
// milliseconds more per layer. cuDNN's filters are KRSC, so filters and their
// gradients are transposed on the GPU; cuDNN pads both sides alike, so a
// SAME convolution with more padding after than before (stride 2 on an even
// size) copies the input into a zero-padded buffer first (and crops its
// gradient after). 1x1 stride-1 convolutions stay one cuBLAS GEMM; a shape
// cuDNN has no algorithm for (or whose tensors pass cuDNN's int limits)
// takes im2col, said once in the log.
//
// Failures of cuDNN calls are device faults recorded in the context, like a
// failed CUDA call (ops_cuda.h).
//
// Thread safety: not thread-safe; one per CudaContext (a device owns one).
#ifndef PSRT_KERNELS_CUDNN_CONV_H_
#define PSRT_KERNELS_CUDNN_CONV_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "kernels/layers_cuda.h"

struct cudnnContext;

namespace psrt {
namespace kernels {

struct CudnnLibrary;

class CudaConvolutions {
 public:
  // For `ctx`'s device, in `math`'s mode. kIm2col: never cuDNN. kAuto: the
  // faster path per shape where cuDNN loads and makes a handle, else im2col
  // (logged once with why). kCudnn: cuDNN wherever it has an algorithm, and
  // FailedPrecondition saying why where it cannot serve.
  static absl::StatusOr<std::unique_ptr<CudaConvolutions>> Create(
      const CudaContext& ctx, GpuConv mode, GpuMath math);
  ~CudaConvolutions();
  CudaConvolutions(const CudaConvolutions&) = delete;
  CudaConvolutions& operator=(const CudaConvolutions&) = delete;

  // "cuDNN 9.19.0", "the faster of cuDNN and im2col, cuDNN 9.19.0" or
  // "im2col" (with why, where cuDNN was wanted), for logs.
  const std::string& description() const { return description_; }
  bool uses_cudnn() const { return cudnn_ != nullptr; }
  // How many of the shape's directions (forward, backward data, backward
  // filter) run through cuDNN: 0 before their first call, for 1x1 stride-1
  // shapes (one GEMM) and where im2col serves. For tests and logs.
  int CudnnDirections(const Conv2DShape& shape) const;

  // conv.h's Conv2DForward and Conv2DBackward, queued on ctx's stream.
  // REQUIRES: ctx is the context this was created for.
  void Forward(const CudaContext& ctx, const Conv2DShape& shape, const float* x,
               const float* filter, float* y);
  void Backward(const CudaContext& ctx, const Conv2DShape& shape, const float* x,
                const float* filter, const float* dy, float* dx, float* dfilter);

 private:
  struct Plan;
  using ShapeKey = std::array<int64_t, 10>;
  static ShapeKey KeyOf(const Conv2DShape& shape);

  CudaConvolutions(const CudnnLibrary* cudnn, cudnnContext* handle, GpuConv mode,
                   GpuMath math, std::string description);
  // The shape's plan, made on first use; null where cuDNN does not serve it.
  Plan* PlanFor(const Conv2DShape& shape);
  // Whether cuDNN runs the direction, decided on its first call (which may
  // run both paths into the call's outputs, to time them).
  bool CudnnForward(const CudaContext& ctx, const Conv2DShape& shape, Plan* plan,
                    const float* x, const float* filter, float* y);
  bool CudnnBackwardData(const CudaContext& ctx, const Conv2DShape& shape, Plan* plan,
                         const float* x, const float* filter, const float* dy, float* dx);
  bool CudnnBackwardFilter(const CudaContext& ctx, const Conv2DShape& shape, Plan* plan,
                           const float* x, const float* filter, const float* dy,
                           float* dfilter);
  // The cuDNN paths with the plan's algorithms.
  void RunForward(const CudaContext& ctx, const Conv2DShape& shape, const Plan& plan,
                  const float* x, const float* filter, float* y);
  void RunBackwardData(const CudaContext& ctx, const Conv2DShape& shape, const Plan& plan,
                       const float* filter, const float* dy, float* dx);
  void RunBackwardFilter(const CudaContext& ctx, const Conv2DShape& shape, const Plan& plan,
                         const float* x, const float* dy, float* dfilter);
  // The input cuDNN reads: x, or x copied into the zero-padded buffer.
  const float* CudnnInput(const CudaContext& ctx, const Conv2DShape& shape, const Plan& plan,
                          const float* x);
  // `bytes` of scratch space for an algorithm (null when it needs none, or
  // on a fault, which ctx records).
  void* Scratch(const CudaContext& ctx, size_t bytes);
  bool Check(const CudaContext& ctx, const char* what, int status) const;

  const CudnnLibrary* const cudnn_;  // Null: im2col only.
  cudnnContext* const handle_;
  const GpuConv mode_;
  const GpuMath math_;
  const std::string description_;
  std::map<ShapeKey, std::unique_ptr<Plan>> plans_;
  CudaWorkspace scratch_;        // cuDNN's workspace, or im2col's columns.
  CudaWorkspace filter_;         // A filter or its gradient in cuDNN's KRSC.
  CudaWorkspace padded_input_;   // x with its padding made explicit.
  CudaWorkspace padded_dinput_;  // Its gradient, before the crop.
};

// The device ops' entry points (device_ops.h): conv.h's contract, the bias
// added (its gradient summed) by ops_cuda.h's BiasAdd kernels.
void Conv2DForward(const CudaContext& ctx, const Conv2DShape& shape,
                   const float* x, const float* filter, const float* bias,
                   float* y, CudaConvolutions* convolutions);
void Conv2DBackward(const CudaContext& ctx, const Conv2DShape& shape,
                    const float* x, const float* filter, const float* dy,
                    float* dx, float* dfilter, float* dbias,
                    CudaConvolutions* convolutions);

}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_CUDNN_CONV_H_
