#include "kernels/elementwise.h"

#include <cmath>
#include <cstdint>
#include <cstring>

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

void Axpy(float a, absl::Span<const float> x, absl::Span<float> y) {
  CHECK_EQ(x.size(), y.size());
  ForEachIndex(0, y.size(), functor::Axpy{a, x.data(), y.data()});
}

double SumOfSquares(absl::Span<const float> x, double sum) {
  return SumOverIndex(0, x.size(), functor::SquaredValue{x.data()}, sum);
}

double WeightDecay(float wd, absl::Span<const float> w, absl::Span<float> g) {
  CHECK_EQ(w.size(), g.size());
  ForEachIndex(0, g.size(), functor::WeightDecayGrad{wd, w.data(), g.data()});
  return 0.5 * wd * SumOfSquares(w);
}

double ClipByGlobalNorm(float clip_norm, absl::Span<const absl::Span<float>> tensors) {
  double squares = 0;
  for (absl::Span<float> x : tensors) squares = SumOfSquares(x, squares);
  for (absl::Span<float> x : tensors) {
    ForEachIndex(0, x.size(), functor::ClipByNorm{clip_norm, &squares, x.data()});
  }
  return std::sqrt(squares);
}

int64_t FirstNonFinite(absl::Span<const float> x) {
  // Exponent bits all ones: Inf or NaN. Branch-free, so that it vectorizes.
  uint32_t bad = 0;
  for (float v : x) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    bad |= (bits & 0x7f800000u) == 0x7f800000u;
  }
  if (bad == 0) return -1;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace kernels
}  // namespace psrt
