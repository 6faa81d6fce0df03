// The blocked GEMM driver that the AVX-512 and AVX2 paths (gemm.h) share,
// in the style of BLIS / GotoBLAS, for batch-reduce GEMMs
// c = alpha * sum_i op(a_i) op(b_i) + beta * c (a plain GEMM is one term):
//
//   cut the terms' depths into pieces of at most Isa::kMaxKc, and group
//   consecutive pieces into k blocks of at most kMaxKc (one long term makes
//   several blocks; many short terms share one);
//   for each block of about Isa::kMaxNc columns of c:
//     for each k block:
//       if op(b) is packed: copy the block's [kc, nc] of op(b) into strips
//       of kNr columns (each strip kc rows of kNr floats, zero-padded);
//       for each row tile of c (<= kMr rows; its slice of op(a) stays in L1
//       across the strips):
//         for each strip of kNr columns: the ISA's micro-kernel, the tile in
//         registers, summed over the block's pieces.
//
// op(a) is never packed: the micro-kernel broadcasts its elements straight
// from a, row-major (a[r * lda + p]) or transposed (a[p * lda + r]); with
// few columns of c (a convolution's 32 or 64 output channels) each element
// of a is used by only one or two strips, and packing it would cost as much
// as the multiply-adds it feeds; and a convolution's input, read in place
// with overlapping rows, could not be packed anyway. op(b) is read in place
// (masked past its last column) unless it is transposed, or both larger than
// the ISA's limit and used by many row tiles.
//
// An ISA (gemm_avx512.cc, gemm_avx2.cc) is a struct with
//   static constexpr int kMr, kNr;            the register tile
//   static constexpr int64_t kMaxKc, kMaxNc;  the k and column blocks
//   static constexpr int64_t kMaxUnpackedBFloats, kMaxRowTilesUnpacked;
//   static void PackB(const float* b, int64_t ldb, bool transposed,
//                     int64_t kc, int64_t j0, int64_t nc,
//                     int64_t strip_stride, float* dst);
//     kc rows and columns [j0, j0 + nc) of op(b) into strips of kNr
//     columns: strip s holds row p at dst[s * strip_stride + p * kNr],
//     zero-padded past column nc (b as in GemmPiece; dst 64-byte aligned);
//   static void RunTile(bool transposed_a, bool masked_b, int rows,
//                       const GemmTile& tile);
//     the micro-kernel: c[rows, cols] = alpha * sum over the pieces of
//     a-slice * b-strip + beta * c, b's loads masked past `cols` when
//     masked_b (a strip read in place and narrower than kNr).
// Both carry their ISA's target attribute; the driver is plain C++.
//
// Thread safety: as gemm.h (the lists and the packing buffer are per thread).
#ifndef PSRT_KERNELS_GEMM_BLOCKED_H_
#define PSRT_KERNELS_GEMM_BLOCKED_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "glog/logging.h"
#include "kernels/gemm.h"

namespace psrt {
namespace kernels {
namespace internal {

// A piece of a k block: depth k of one term. a points at its first depth in
// row 0 of op(a); b at its first depth in column 0 of the block's op(b)
// (read in place) or of the block's packed strip 0.
struct GemmPiece {
  const float* a;
  const float* b;
  int64_t k;
};

// One micro-kernel call.
struct GemmTile {
  const GemmPiece* pieces;
  int64_t count;
  int64_t a_offset;  // Added to each piece's a: the tile's first row.
  int64_t b_offset;  // Added to each piece's b: the strip's first column.
  int64_t lda;       // Element (r, p) of a slice at a[r * lda + p], or at
                     // a[p * lda + r] when a is transposed.
  int64_t b_step;    // Row p of a strip: kNr floats at b + p * b_step.
  float* c;
  int64_t ldc;
  int cols;  // Columns of c to write, 1..kNr; b is not read past them.
  float alpha;
  float beta;
};

// A k block: pieces [first, first + count) of the call's pieces, of total
// depth k.
struct GemmKBlock {
  int64_t first;
  int64_t count;
  int64_t k;
};

// The calling thread's packing buffer of at least `floats` floats, 64-byte
// aligned; it grows and is never freed before the thread ends, so that a
// training loop allocates (and faults in) its pages once.
float* GemmPackBuffer(int64_t floats);

// Cuts the terms of g into pieces of at most max_kc and k blocks of at most
// max_kc. The pieces' b point at column 0 of op(b_i), as stored.
void PlanGemmKBlocks(const BatchReduceGemm& g, int64_t max_kc,
                     std::vector<GemmPiece>* pieces, std::vector<GemmKBlock>* blocks);

inline int64_t GemmCeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The driver. REQUIRES: as gemm.h's internal paths (m, n >= 1, some term's
// k >= 1, alpha != 0) and a CPU that runs Isa.
template <class Isa>
void BlockedGemm(const BatchReduceGemm& g) {
  constexpr int kMr = Isa::kMr, kNr = Isa::kNr;
  const int64_t m = g.m, n = g.n;
  CHECK(m >= 1 && n >= 1 && g.alpha != 0.0f);
  // Per-thread lists, reused from call to call.
  thread_local std::vector<GemmPiece> pieces, block_pieces;
  thread_local std::vector<GemmKBlock> blocks;
  PlanGemmKBlocks(g, Isa::kMaxKc, &pieces, &blocks);
  CHECK(!blocks.empty()) << "a GEMM of depth 0 reached a blocked path";
  int64_t total_k = 0, max_block_k = 0;
  for (const GemmKBlock& block : blocks) {
    total_k += block.k;
    max_block_k = std::max(max_block_k, block.k);
  }
  const int64_t row_tiles = GemmCeilDiv(m, kMr);
  const bool pack_b = g.transpose_b || (total_k * n > Isa::kMaxUnpackedBFloats &&
                                        row_tiles > Isa::kMaxRowTilesUnpacked);
  // Equal column blocks rather than full ones and a sliver.
  const int64_t nc_size =
      pack_b ? GemmCeilDiv(GemmCeilDiv(n, GemmCeilDiv(n, Isa::kMaxNc)), kNr) * kNr : n;
  float* packed = pack_b ? GemmPackBuffer(max_block_k * nc_size) : nullptr;
  for (int64_t j0 = 0; j0 < n; j0 += nc_size) {
    const int64_t nc = std::min(nc_size, n - j0);
    for (size_t bi = 0; bi < blocks.size(); ++bi) {
      const GemmKBlock& block = blocks[bi];
      GemmTile t;
      t.lda = g.lda;
      t.ldc = g.ldc;
      t.alpha = g.alpha;
      t.beta = bi == 0 ? g.beta : 1.0f;  // Later k blocks add to the first.
      block_pieces.assign(pieces.begin() + block.first,
                          pieces.begin() + block.first + block.count);
      int64_t strip_stride;
      if (pack_b) {
        for (int64_t i = 0, depth = 0; i < block.count; ++i) {
          GemmPiece& piece = block_pieces[i];
          Isa::PackB(piece.b, g.ldb, g.transpose_b, piece.k, j0, nc, block.k * kNr,
                     packed + depth * kNr);
          piece.b = packed + depth * kNr;
          depth += piece.k;
        }
        t.b_step = kNr;
        strip_stride = block.k * kNr;
      } else {
        for (GemmPiece& piece : block_pieces) piece.b += j0;
        t.b_step = g.ldb;
        strip_stride = kNr;
      }
      t.pieces = block_pieces.data();
      t.count = block.count;
      // Row tiles of equal height (within one): 25 rows as 9 + 8 + 8, not
      // 12 + 12 + 1, whose one-row tile would wait on FMA latency.
      for (int64_t tile = 0, i0 = 0; tile < row_tiles; ++tile) {
        const int rows = static_cast<int>(m / row_tiles + (tile < m % row_tiles ? 1 : 0));
        t.a_offset = g.transpose_a ? i0 : i0 * g.lda;
        for (int64_t s0 = 0, s = 0; s0 < nc; s0 += kNr, ++s) {
          t.b_offset = s * strip_stride;
          t.c = g.c + i0 * g.ldc + j0 + s0;
          t.cols = static_cast<int>(std::min<int64_t>(kNr, nc - s0));
          Isa::RunTile(g.transpose_a, !pack_b && t.cols < kNr, rows, t);
        }
        i0 += rows;
      }
    }
  }
}

}  // namespace internal
}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_GEMM_BLOCKED_H_
