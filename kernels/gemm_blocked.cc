#include "kernels/gemm_blocked.h"

#include <cstdlib>

namespace psrt {
namespace kernels {
namespace internal {

float* GemmPackBuffer(GemmOperand operand, int64_t floats) {
  struct Buffer {
    float* data = nullptr;
    int64_t capacity = 0;
    ~Buffer() { std::free(data); }
  };
  thread_local Buffer buffers[2];
  Buffer& buffer = buffers[operand == GemmOperand::kA ? 1 : 0];
  if (buffer.capacity < floats) {
    std::free(buffer.data);
    const size_t bytes = GemmCeilDiv(floats * sizeof(float), 64) * 64;
    buffer.data = static_cast<float*>(std::aligned_alloc(64, bytes));
    CHECK(buffer.data != nullptr) << "out of memory for a GEMM buffer";
    buffer.capacity = floats;
  }
  return buffer.data;
}

void PlanGemmKBlocks(const BatchReduceGemm& g, int64_t max_kc,
                     std::vector<GemmPiece>* pieces, std::vector<GemmKBlock>* blocks) {
  pieces->clear();
  blocks->clear();
  for (int64_t i = 0; i < g.count; ++i) {
    const GemmTerm& term = g.terms[i];
    if (term.k == 0) continue;
    const int64_t parts = GemmCeilDiv(term.k, max_kc);
    for (int64_t q = 0, p0 = 0; q < parts; ++q) {
      const int64_t depth = term.k / parts + (q < term.k % parts ? 1 : 0);
      pieces->push_back(GemmPiece{g.transpose_a ? term.a + p0 * g.lda : term.a + p0,
                                  g.transpose_b ? term.b + p0 : term.b + p0 * g.ldb, depth});
      p0 += depth;
    }
  }
  for (int64_t i = 0; i < static_cast<int64_t>(pieces->size()); ++i) {
    const int64_t k = (*pieces)[i].k;
    if (blocks->empty() || blocks->back().k + k > max_kc) {
      blocks->push_back(GemmKBlock{i, 0, 0});
    }
    ++blocks->back().count;
    blocks->back().k += k;
  }
}

}  // namespace internal
}  // namespace kernels
}  // namespace psrt
