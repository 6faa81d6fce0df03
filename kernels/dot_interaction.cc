#include "kernels/dot_interaction.h"

#include <algorithm>

namespace psrt {
namespace kernels {

void DotInteractionForward(const CpuContext& ctx, const float* features, int64_t batch,
                           int64_t n, int64_t dim, float* out) {
  const int64_t pairs = DotInteractionPairs(n);
  ctx.ParallelFor(batch, 16, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const float* t = features + b * n * dim;
      float* y = out + b * pairs;
      for (int64_t i = 1; i < n; ++i) {
        for (int64_t l = 0; l < i; ++l) {
          float dot = 0;
          for (int64_t j = 0; j < dim; ++j) dot += t[i * dim + j] * t[l * dim + j];
          *y++ = dot;
        }
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
        for (int64_t l = 0; l < i; ++l) {
          const float g = *dy++;
          for (int64_t j = 0; j < dim; ++j) {
            dt[i * dim + j] += g * t[l * dim + j];
            dt[l * dim + j] += g * t[i * dim + j];
          }
        }
      }
    }
  });
}

}  // namespace kernels
}  // namespace psrt
