// The activations on a GPU (activation.h's contract; layers_cuda.h).
#include "kernels/activation_functors.h"
#include "kernels/cuda_launch.cuh"
#include "kernels/layers_cuda.h"

namespace psrt {
namespace kernels {
namespace {

// Launches functor f over [0, n) on the context's stream.
struct LaunchOver {
  const CudaContext& ctx;
  int64_t n;
  template <class F>
  void operator()(const F& f) const {
    cuda::LaunchForEachIndex(ctx, n, f);
  }
};

}  // namespace

void ActivationForward(const CudaContext& ctx, const ActivationSpec& spec, const float* x,
                       int64_t n, float* y) {
  functor::DispatchActivation<functor::ActivationFn>(spec, LaunchOver{ctx, n}, x, y);
}

void ActivationBackward(const CudaContext& ctx, const ActivationSpec& spec, const float* x,
                        const float* dy, int64_t n, float* dx) {
  functor::DispatchActivation<functor::ActivationGrad>(spec, LaunchOver{ctx, n}, x, dy, dx);
}

}  // namespace kernels
}  // namespace psrt
