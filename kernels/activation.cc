#include "kernels/activation.h"

#include "kernels/activation_functors.h"
#include "kernels/elementwise.h"

namespace psrt {
namespace kernels {
namespace {

constexpr int64_t kElementGrain = 1 << 14;

// Runs functor f over [0, n), a run of indices per task.
struct RunOver {
  const CpuContext& ctx;
  int64_t n;
  template <class F>
  void operator()(const F& f) const {
    ctx.ParallelFor(n, kElementGrain,
                    [&](int64_t begin, int64_t end) { ForEachIndex(begin, end, f); });
  }
};

}  // namespace

void ActivationForward(const CpuContext& ctx, const ActivationSpec& spec, const float* x,
                       int64_t n, float* y) {
  functor::DispatchActivation<functor::ActivationFn>(spec, RunOver{ctx, n}, x, y);
}

void ActivationBackward(const CpuContext& ctx, const ActivationSpec& spec, const float* x,
                        const float* dy, int64_t n, float* dx) {
  functor::DispatchActivation<functor::ActivationGrad>(spec, RunOver{ctx, n}, x, dy, dx);
}

}  // namespace kernels
}  // namespace psrt
