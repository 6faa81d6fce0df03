#include "kernels/embedding_bag.h"

#include <algorithm>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "glog/logging.h"

namespace psrt {
namespace kernels {

void Deduplicate(absl::Span<const uint64_t> ids, UniqueIds* out) {
  out->unique.clear();
  out->index.resize(ids.size());
  absl::flat_hash_map<uint64_t, int32_t> position;
  position.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    auto [it, made] = position.try_emplace(ids[i], static_cast<int32_t>(out->unique.size()));
    if (made) out->unique.push_back(ids[i]);
    out->index[i] = it->second;
  }
}

void EmbeddingBagForward(const CpuContext& ctx, const float* rows, int64_t dim,
                         absl::Span<const int32_t> index, absl::Span<const int64_t> offsets,
                         float* out) {
  CHECK(!offsets.empty() && offsets.front() == 0 &&
        offsets.back() == static_cast<int64_t>(index.size()))
      << "bag offsets must run from 0 to the number of ids";
  const int64_t bags = static_cast<int64_t>(offsets.size()) - 1;
  // Bags are independent: each thread sums its own.
  ctx.ParallelFor(bags, std::max<int64_t>(1, 4096 / std::max<int64_t>(dim, 1)),
                  [&](int64_t begin, int64_t end) {
                    for (int64_t b = begin; b < end; ++b) {
                      float* y = out + b * dim;
                      std::fill_n(y, dim, 0.0f);
                      for (int64_t p = offsets[b]; p < offsets[b + 1]; ++p) {
                        const float* row = rows + int64_t{index[p]} * dim;
                        for (int64_t j = 0; j < dim; ++j) y[j] += row[j];
                      }
                    }
                  });
}

void EmbeddingBagBackward(const CpuContext& /*ctx*/, const float* dout, int64_t dim,
                          absl::Span<const int32_t> index, absl::Span<const int64_t> offsets,
                          int64_t num_unique, float* drows) {
  CHECK(!offsets.empty() && offsets.front() == 0 &&
        offsets.back() == static_cast<int64_t>(index.size()))
      << "bag offsets must run from 0 to the number of ids";
  // One thread: rows shared by several bags would race, and a batch's
  // scatter is small beside the dense layers.
  std::fill_n(drows, num_unique * dim, 0.0f);
  const int64_t bags = static_cast<int64_t>(offsets.size()) - 1;
  for (int64_t b = 0; b < bags; ++b) {
    const float* dy = dout + b * dim;
    for (int64_t p = offsets[b]; p < offsets[b + 1]; ++p) {
      float* row = drows + int64_t{index[p]} * dim;
      for (int64_t j = 0; j < dim; ++j) row[j] += dy[j];
    }
  }
}

}  // namespace kernels
}  // namespace psrt
