#include "kernels/dot_interaction.h"

#include <algorithm>

namespace psrt {
namespace kernels {

namespace {

// Partial sums in kLanes independent accumulators, so that the compiler
// vectorizes the dot products without reordering a sum it must keep in
// order (no -ffast-math); the lanes are added at the end.
constexpr int64_t kLanes = 8;

float Dot(const float* __restrict a, const float* __restrict b, int64_t dim) {
  float lanes[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= dim; j += kLanes) {
    for (int64_t k = 0; k < kLanes; ++k) lanes[k] += a[j + k] * b[j + k];
  }
  float dot = 0;
  for (; j < dim; ++j) dot += a[j] * b[j];
  for (int64_t k = 0; k < kLanes; ++k) dot += lanes[k];
  return dot;
}

// y += g * x.
void Axpy(float g, const float* __restrict x, float* __restrict y, int64_t dim) {
  for (int64_t j = 0; j < dim; ++j) y[j] += g * x[j];
}

}  // namespace

void DotInteractionForward(const CpuContext& ctx, const float* features, int64_t batch,
                           int64_t n, int64_t dim, float* out) {
  const int64_t pairs = DotInteractionPairs(n);
  ctx.ParallelFor(batch, 16, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const float* t = features + b * n * dim;
      float* y = out + b * pairs;
      for (int64_t i = 1; i < n; ++i) {
        for (int64_t l = 0; l < i; ++l) *y++ = Dot(t + i * dim, t + l * dim, dim);
      }
    }
  });
}

void DotInteractionBackward(const CpuContext& ctx, const float* features, const float* dout,
                            int64_t batch, int64_t n, int64_t dim, float* dfeatures) {
  const int64_t pairs = DotInteractionPairs(n);
  ctx.ParallelFor(batch, 16, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const float* t = features + b * n * dim;
      const float* dy = dout + b * pairs;
      float* dt = dfeatures + b * n * dim;
      std::fill_n(dt, n * dim, 0.0f);
      for (int64_t i = 1; i < n; ++i) {
        for (int64_t l = 0; l < i; ++l) {  // Rows i and l differ: no overlap.
          const float g = *dy++;
          Axpy(g, t + l * dim, dt + i * dim, dim);
          Axpy(g, t + i * dim, dt + l * dim, dim);
        }
      }
    }
  });
}

}  // namespace kernels
}  // namespace psrt
