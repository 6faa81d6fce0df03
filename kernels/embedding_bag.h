// The worker's side of sparse embeddings (design.md, "Sparse embedding
// tables"): a batch's ids deduplicated, so that only the distinct rows
// travel; the gather of those rows into bags (the sum of each bag's rows:
// one id per bag is a plain lookup, several are sum pooling, as
// nn.EmbeddingBag(mode="sum") and TensorFlow's embedding_lookup_sparse with
// combiner "sum"); and its backward, a scatter-add that yields one
// gradient row per distinct id, what a worker pushes.
//
// Layout: rows [num_unique, dim] row-major, in UniqueIds order; bag b
// holds the positions [offsets[b], offsets[b + 1]) of `index`, each an
// index into rows; out and dout are [num_bags, dim].
#ifndef PSRT_KERNELS_EMBEDDING_BAG_H_
#define PSRT_KERNELS_EMBEDDING_BAG_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "kernels/cpu_context.h"

namespace psrt {
namespace kernels {

// A batch's distinct ids in first-seen order, and for each id of the batch
// its position among them: ids[i] == unique[index[i]].
struct UniqueIds {
  std::vector<uint64_t> unique;
  std::vector<int32_t> index;
};

// Overwrites *out (its storage reused from call to call).
void Deduplicate(absl::Span<const uint64_t> ids, UniqueIds* out);

// out[b] = the sum of rows[index[p]] over bag b's positions p (zeros for an
// empty bag). Overwrites out.
// REQUIRES: offsets ascending from 0 to index.size(); 0 <= index[p] < the
// rows' count; out does not overlap rows.
void EmbeddingBagForward(const CpuContext& ctx, const float* rows, int64_t dim,
                         absl::Span<const int32_t> index, absl::Span<const int64_t> offsets,
                         float* out);

// The backward of EmbeddingBagForward: drows[u] = the sum of dout[b] over
// the positions p of every bag b with index[p] == u. Overwrites drows
// [num_unique, dim] (rows no bag touches get zeros).
void EmbeddingBagBackward(const CpuContext& ctx, const float* dout, int64_t dim,
                          absl::Span<const int32_t> index, absl::Span<const int64_t> offsets,
                          int64_t num_unique, float* drows);

}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_EMBEDDING_BAG_H_
