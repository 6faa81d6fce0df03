// CPU loops that run the functors of functors.h, and the element-wise
// helpers built on them that other modules call directly (the PS optimizers
// and the sync aggregator).
//
// These run on the calling thread only; callers that want parallelism split
// their work (the PS applies different variables on different threads).
//
// Thread safety: stateless; concurrent calls on disjoint outputs are safe.
#ifndef PSRT_KERNELS_ELEMENTWISE_H_
#define PSRT_KERNELS_ELEMENTWISE_H_

#include <cstdint>

#include "absl/types/span.h"

namespace psrt {
namespace kernels {

// Calls f(i) for i in [begin, end), in order. Works on a local copy of the
// functor: otherwise every store through its output pointer might change
// its fields (for all the compiler knows), which reloads them per element
// and keeps the loop from vectorizing.
template <class F>
void ForEachIndex(int64_t begin, int64_t end, const F& f) {
  const F local = f;
  for (int64_t i = begin; i < end; ++i) local(i);
}

// Calls f(r, c) for r in [row_begin, row_end) and c in [0, cols), row by row.
// Also on a local copy of the functor.
template <class F>
void ForEachRowCol(int64_t row_begin, int64_t row_end, int64_t cols,
                   const F& f) {
  const F local = f;
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int64_t c = 0; c < cols; ++c) local(r, c);
  }
}

// sum + f(begin) + ... + f(end - 1), added in that order in double.
template <class F>
double SumOverIndex(int64_t begin, int64_t end, const F& f, double sum = 0) {
  const F local = f;
  for (int64_t i = begin; i < end; ++i) sum += local(i);
  return sum;
}

// var -= lr * grad.
// REQUIRES: grad.size() == var.size().
void ApplySgd(float lr, absl::Span<const float> grad, absl::Span<float> var);

// TensorFlow's MomentumOptimizer (no Nesterov):
//   accum = momentum * accum + grad;  var -= lr * accum.
// REQUIRES: grad, accum and var have the same size.
void ApplyMomentum(float lr, float momentum, absl::Span<const float> grad,
                   absl::Span<float> accum, absl::Span<float> var);

// acc += grad.
// REQUIRES: grad.size() == acc.size().
void Accumulate(absl::Span<const float> grad, absl::Span<float> acc);

// x *= scale.
void Scale(float scale, absl::Span<float> x);

// y += a * x (a tower's gradient into the towers' weighted average).
// REQUIRES: x.size() == y.size().
void Axpy(float a, absl::Span<const float> x, absl::Span<float> y);

// sum + the squares of x, added in order in double.
double SumOfSquares(absl::Span<const float> x, double sum = 0);

// L2 weight decay of one weight tensor, forward and backward in one pass:
// adds wd * w into g (the penalty's gradient) and returns the penalty
// wd / 2 * sum(w^2), summed in double.
// REQUIRES: w.size() == g.size().
double WeightDecay(float wd, absl::Span<const float> w, absl::Span<float> g);

// TensorFlow's clip_by_global_norm: when the 2-norm of all the tensors
// together exceeds clip_norm, scales every one of them by clip_norm / norm.
// Returns the norm before clipping.
double ClipByGlobalNorm(float clip_norm, absl::Span<const absl::Span<float>> tensors);

// The index of the first NaN or Inf in `x`, or -1 (one vectorized pass when
// every element is finite).
int64_t FirstNonFinite(absl::Span<const float> x);

}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_ELEMENTWISE_H_
