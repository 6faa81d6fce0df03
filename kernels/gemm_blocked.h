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
// A row-major op(a) is not packed: the micro-kernel broadcasts its elements
// straight from a (a[r * lda + p]), kMr sequential streams; with few columns
// of c (a convolution's 32 or 64 output channels) each element of a is used
// by only one or two strips, and packing it would cost as much as the
// multiply-adds it feeds; and a convolution's input, read in place with
// overlapping rows, could not be packed anyway. A transposed op(a) (a[p *
// lda + r], a filter gradient's x^T) is read in place where one strip uses
// it or where its cache lines fit in L1 beside a strip of b; otherwise each
// row tile's slice is first copied to [depth, kMr] (a cache line or two a
// depth instead of a line a depth, lda apart, which the strips would re-read
// from L2: 1.5x on ResNet-50's 1x1 filter gradients at 14x14). op(b) is
// read in place (masked past its last column) unless it is transposed, or
// both larger than the ISA's limit and used by many row tiles.
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
#include <cstring>
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

// Which of the calling thread's two packing buffers: op(b)'s or op(a)'s.
enum class GemmOperand { kB, kA };

// The calling thread's packing buffer for `operand` of at least `floats`
// floats, 64-byte aligned; it grows and is never freed before the thread
// ends, so that a training loop allocates (and faults in) its pages once.
float* GemmPackBuffer(GemmOperand operand, int64_t floats);

// Copies rows [first_row, first_row + rows) of a transposed op(a) of m
// rows, over the depths of `pieces`, to dst as [depth, kMr] (piece after
// piece), and points `packed` at them: piece i's a at its first depth, row
// 0, in dst. Each depth is one copy of kMr floats (a vector move or two):
// of rows [first_row, first_row + kMr) when op(a) has them, and otherwise of
// its last kMr rows, the slice then starting kMr - rows floats into dst;
// the micro-kernel reads only the tile's rows. REQUIRES: rows <= kMr.
template <int kMr>
void PackTransposedA(const GemmPiece* pieces, int64_t count, int64_t lda, int64_t m,
                     int64_t first_row, int rows, float* dst, GemmPiece* packed) {
  const int64_t copied_row = std::max<int64_t>(0, std::min(first_row, m - kMr));
  const int64_t skip = first_row - copied_row;  // 0 unless the last tile.
  for (int64_t i = 0; i < count; ++i) {
    packed[i].a = dst + skip;
    const float* src = pieces[i].a + copied_row;
    if (m >= kMr) {
      for (int64_t p = 0; p < pieces[i].k; ++p, src += lda, dst += kMr) {
        std::memcpy(dst, src, kMr * sizeof(float));
      }
      continue;
    }
    for (int64_t p = 0; p < pieces[i].k; ++p, src += lda, dst += kMr) {
      for (int r = 0; r < rows; ++r) dst[r] = src[r];
    }
  }
}

// Cuts the terms of g into pieces of at most max_kc and k blocks of at most
// max_kc. The pieces' b point at column 0 of op(b_i), as stored.
void PlanGemmKBlocks(const BatchReduceGemm& g, int64_t max_kc,
                     std::vector<GemmPiece>* pieces, std::vector<GemmKBlock>* blocks);

inline int64_t GemmCeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// What a micro-kernel's operands may take of a 32 KiB L1 data cache, the
// smallest of the CPUs the blocked paths run on; and a cache line.
constexpr int64_t kL1BudgetBytes = 24 * 1024;
constexpr int64_t kCacheLineFloats = 16;

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
  float* packed = pack_b ? GemmPackBuffer(GemmOperand::kB, max_block_k * nc_size) : nullptr;
  // A row tile's slice of a transposed op(a), read in place, takes a cache
  // line a depth (less where lda is short of one); it is packed when two or
  // more strips re-read it and it would not share L1 with a strip of b.
  const int64_t in_place_tile_bytes =
      max_block_k * (std::min<int64_t>(g.lda, kCacheLineFloats) + kNr) * sizeof(float);
  const bool pack_a = g.transpose_a && nc_size > kNr && in_place_tile_bytes > kL1BudgetBytes;
  float* packed_a = pack_a ? GemmPackBuffer(GemmOperand::kA, max_block_k * kMr) : nullptr;
  thread_local std::vector<GemmPiece> tile_pieces;
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
      if (pack_a) {  // The tiles' pieces: the same b, a in packed_a.
        tile_pieces = block_pieces;
        t.pieces = tile_pieces.data();
        t.lda = kMr;
        t.a_offset = 0;
      }
      // Row tiles of equal height (within one): 25 rows as 9 + 8 + 8, not
      // 12 + 12 + 1, whose one-row tile would wait on FMA latency.
      for (int64_t tile = 0, i0 = 0; tile < row_tiles; ++tile) {
        const int rows = static_cast<int>(m / row_tiles + (tile < m % row_tiles ? 1 : 0));
        if (pack_a) {
          PackTransposedA<kMr>(block_pieces.data(), block.count, g.lda, m, i0, rows, packed_a,
                               tile_pieces.data());
        } else {
          t.a_offset = g.transpose_a ? i0 : i0 * g.lda;
        }
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
