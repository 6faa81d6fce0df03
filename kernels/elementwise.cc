#include "kernels/elementwise.h"

#include "glog/logging.h"
#include "kernels/functors.h"

namespace psrt {
namespace kernels {

void ApplySgd(float lr, absl::Span<const float> grad, absl::Span<float> var) {
  CHECK_EQ(grad.size(), var.size());
  ForEachIndex(0, var.size(), functor::SgdUpdate{lr, grad.data(), var.data()});
}

void ApplyMomentum(float lr, float momentum, absl::Span<const float> grad,
                   absl::Span<float> accum, absl::Span<float> var) {
  CHECK_EQ(grad.size(), var.size());
  CHECK_EQ(accum.size(), var.size());
  ForEachIndex(0, var.size(),
               functor::MomentumUpdate{lr, momentum, grad.data(), accum.data(),
                                       var.data()});
}

void Accumulate(absl::Span<const float> grad, absl::Span<float> acc) {
  CHECK_EQ(grad.size(), acc.size());
  ForEachIndex(0, acc.size(), functor::Accumulate{grad.data(), acc.data()});
}

void Scale(float scale, absl::Span<float> x) {
  ForEachIndex(0, x.size(), functor::Scale{scale, x.data()});
}

}  // namespace kernels
}  // namespace psrt
