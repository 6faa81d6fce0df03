// DLRM's feature interaction (Naumov et al. 2019; facebookresearch/dlrm's
// interact_features with arch_interaction_op "dot"): the dot products of
// every pair of a sample's feature vectors (the bottom MLP's output and one
// embedding per field), the strictly lower triangle of their Gram matrix in
// row-major order: (1,0), (2,0), (2,1), (3,0), ...
//
// Layout: features [batch, n, dim] row-major (n vectors of dim per
// sample); out [batch, n * (n - 1) / 2].
#ifndef PSRT_KERNELS_DOT_INTERACTION_H_
#define PSRT_KERNELS_DOT_INTERACTION_H_

#include <cstdint>

#include "kernels/cpu_context.h"

namespace psrt {
namespace kernels {

// The number of pairs of n vectors: n * (n - 1) / 2.
inline int64_t DotInteractionPairs(int64_t n) { return n * (n - 1) / 2; }

// Overwrites out. REQUIRES: out does not overlap features.
void DotInteractionForward(const CpuContext& ctx, const float* features, int64_t batch,
                           int64_t n, int64_t dim, float* out);

// dfeatures[b, i] = sum over pairs (i, l) and (l, i) of dout[b, pair] *
// features[b, l]. Overwrites dfeatures. REQUIRES: dfeatures overlaps
// neither input.
void DotInteractionBackward(const CpuContext& ctx, const float* features, const float* dout,
                            int64_t batch, int64_t n, int64_t dim, float* dfeatures);

}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_DOT_INTERACTION_H_
