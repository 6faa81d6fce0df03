// The AVX-512 GEMM path (see gemm.h), in the style of BLIS / GotoBLAS, for
// batch-reduce GEMMs c = alpha * sum_i op(a_i) op(b_i) + beta * c (a plain
// GEMM is one term):
//
//   cut the terms' depths into pieces of at most kMaxKc, and group
//   consecutive pieces into k blocks of at most kMaxKc (one long term makes
//   several blocks; many short terms share one);
//   for each block of kMaxNc columns of c:
//     for each k block:
//       if op(b) is packed: copy the block's [kc, nc] of op(b) into strips
//       of kNr columns (each strip kc rows of kNr floats, zero-padded);
//       for each row tile of c (<= kMr rows; its slice of op(a) stays in L1
//       across the strips):
//         for each strip of kNr columns:
//           micro-kernel: the tile in up to 24 zmm accumulators, summed over
//           the block's pieces; one k step = 2 loads of b, up to 12
//           broadcasts of a, up to 24 FMAs.
//
// op(a) is never packed: the micro-kernel broadcasts its elements straight
// from a, row-major (a[r * lda + p]) or transposed (a[p * lda + r]); with
// few columns of c (a convolution's 32 or 64 output channels) each element
// of a is used by only one or two strips, and packing it would cost as much
// as the multiply-adds it feeds; and a convolution's input, read in place
// with overlapping rows, could not be packed anyway. op(b) is read in place
// (masked past its last column) unless it is transposed, or both larger than
// L2 and used by many row tiles.
//
// Everything that uses AVX-512 instructions carries PSRT_AVX512_TARGET, so
// this file builds with the kernels' baseline -march and runs its code only
// after Avx512GemmSupported() has checked the CPU.
#include <algorithm>
#include <array>
#include <cstdlib>
#include <utility>
#include <vector>

#include "glog/logging.h"
#include "kernels/gemm.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PSRT_GEMM_AVX512 1
#include <immintrin.h>
#else
#define PSRT_GEMM_AVX512 0
#endif

namespace psrt {
namespace kernels {
namespace internal {

#if PSRT_GEMM_AVX512

#define PSRT_AVX512_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))

namespace {

constexpr int kMr = static_cast<int>(kAvx512TileRows);
constexpr int kNr = static_cast<int>(kAvx512TileCols);
static_assert(kNr == 32, "the micro-kernel holds a tile row in two zmm");
// A k block: the [kMr, kc] slice of op(a) (12 KiB) stays in L1 while a
// strip of packed b streams past it.
constexpr int64_t kMaxKc = 256;
// A column block: the packed [kc, nc] block of op(b) (512 KiB) stays in L2.
constexpr int64_t kMaxNc = 512;
// op(b) is read in place (when not transposed) up to this size, where it
// stays in L2 as a packed copy would and a copy would buy only contiguity;
// or with at most this many row tiles, too few to pay for a copy.
constexpr int64_t kMaxUnpackedBFloats = 64 * 1024;
constexpr int64_t kMaxRowTilesUnpacked = 4;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The calling thread's packing buffer of at least `floats` floats, 64-byte
// aligned; it grows and is never freed before the thread ends, so that a
// training loop allocates (and faults in) its pages once.
float* PackBuffer(int64_t floats) {
  struct Buffer {
    float* data = nullptr;
    int64_t capacity = 0;
    ~Buffer() { std::free(data); }
  };
  thread_local Buffer buffer;
  if (buffer.capacity < floats) {
    std::free(buffer.data);
    const size_t bytes = CeilDiv(floats * sizeof(float), 64) * 64;
    buffer.data = static_cast<float*>(std::aligned_alloc(64, bytes));
    CHECK(buffer.data != nullptr) << "out of memory for a GEMM buffer";
    buffer.capacity = floats;
  }
  return buffer.data;
}

// The lanes of a strip's two zmm halves that hold its first `cols` columns.
struct StripMask {
  explicit StripMask(int cols)
      : lo(cols >= 16 ? 0xFFFF : (1u << cols) - 1),
        hi(cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (1u << (cols - 16)) - 1) {}
  __mmask16 lo;
  __mmask16 hi;
};

// A piece of a k block: depth k of one term. a points at its first depth in
// row 0 of op(a); b at its first depth in column 0 of the block's op(b)
// (read in place) or of the block's packed strip 0.
struct Piece {
  const float* a;
  const float* b;
  int64_t k;
};

// One micro-kernel call: c[rows, cols] = alpha * sum over the pieces of
// a-slice * b-strip + beta * c.
struct Tile {
  const Piece* pieces;
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

// kMaskedB: the strip is read in place and narrower than kNr, so its loads
// are masked (masked loads cost more than plain ones here).
template <int kRows, bool kTransposedA, bool kMaskedB>
PSRT_AVX512_TARGET void MicroKernel(const Tile& t) {
  // Locals, so that the stores to c cannot alias what the loops read from t;
  // every loop over the rows is unrolled, so that the accumulators live in
  // registers.
  const int64_t lda = t.lda, b_step = t.b_step, ldc = t.ldc;
  float* const c = t.c;
  const int cols = t.cols;
  const float alpha = t.alpha, beta = t.beta;
  const StripMask mask(cols);
  __m512 lo[kRows], hi[kRows];
#pragma GCC unroll 12
  for (int r = 0; r < kRows; ++r) lo[r] = hi[r] = _mm512_setzero_ps();
  for (int64_t i = 0; i < t.count; ++i) {
    const float* a = t.pieces[i].a + t.a_offset;
    const float* b = t.pieces[i].b + t.b_offset;
    for (int64_t p = t.pieces[i].k; p > 0; --p) {
      const __m512 b_lo = kMaskedB ? _mm512_maskz_loadu_ps(mask.lo, b)
                                   : _mm512_loadu_ps(b);
      const __m512 b_hi = kMaskedB ? _mm512_maskz_loadu_ps(mask.hi, b + 16)
                                   : _mm512_loadu_ps(b + 16);
#pragma GCC unroll 12
      for (int r = 0; r < kRows; ++r) {
        const __m512 ar = _mm512_set1_ps(kTransposedA ? a[r] : a[r * lda]);
        lo[r] = _mm512_fmadd_ps(ar, b_lo, lo[r]);
        hi[r] = _mm512_fmadd_ps(ar, b_hi, hi[r]);
      }
      a += kTransposedA ? lda : 1;
      b += b_step;
    }
  }
  const __m512 alpha_v = _mm512_set1_ps(alpha);
  const __m512 beta_v = _mm512_set1_ps(beta);
#pragma GCC unroll 12
  for (int r = 0; r < kRows; ++r) {
    float* const c_row = c + r * ldc;
    __m512 v_lo = _mm512_mul_ps(lo[r], alpha_v);
    __m512 v_hi = _mm512_mul_ps(hi[r], alpha_v);
    if (beta != 0.0f) {  // With beta == 0, c may hold NaNs: never read it.
      v_lo = _mm512_fmadd_ps(beta_v, _mm512_maskz_loadu_ps(mask.lo, c_row),
                             v_lo);
      v_hi = _mm512_fmadd_ps(
          beta_v, _mm512_maskz_loadu_ps(mask.hi, c_row + 16), v_hi);
    }
    if (cols == kNr) {
      _mm512_storeu_ps(c_row, v_lo);
      _mm512_storeu_ps(c_row + 16, v_hi);
    } else {
      _mm512_mask_storeu_ps(c_row, mask.lo, v_lo);
      _mm512_mask_storeu_ps(c_row + 16, mask.hi, v_hi);
    }
  }
}

using MicroKernelFn = void (*)(const Tile&);

// kMicroKernels[transposed_a][masked_b][rows - 1].
template <bool kTransposedA, bool kMaskedB, size_t... kRowsMinus1>
constexpr std::array<MicroKernelFn, kMr> MicroKernelsFor(
    std::index_sequence<kRowsMinus1...>) {
  return {&MicroKernel<kRowsMinus1 + 1, kTransposedA, kMaskedB>...};
}
const std::array<MicroKernelFn, kMr> kMicroKernels[2][2] = {
    {MicroKernelsFor<false, false>(std::make_index_sequence<kMr>()),
     MicroKernelsFor<false, true>(std::make_index_sequence<kMr>())},
    {MicroKernelsFor<true, false>(std::make_index_sequence<kMr>()),
     MicroKernelsFor<true, true>(std::make_index_sequence<kMr>())},
};

// Transposes the 16x16 block held one row per register in r, in place.
PSRT_AVX512_TARGET void Transpose16x16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {  // Pairs of rows, within 128-bit lanes.
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  // Quads of rows: u[4g + q] holds column 4L + q of rows 4g..4g+3 in lane L.
  __m512 u[16];
  for (int g = 0; g < 16; g += 4) {
    const __m512d t0 = _mm512_castps_pd(t[g]), t1 = _mm512_castps_pd(t[g + 1]);
    const __m512d t2 = _mm512_castps_pd(t[g + 2]);
    const __m512d t3 = _mm512_castps_pd(t[g + 3]);
    u[g] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
    u[g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
    u[g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
    u[g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
  }
  // Gather lane L of u[q], u[4 + q], u[8 + q], u[12 + q] into column 4L + q.
  for (int q = 0; q < 4; ++q) {
    const __m512 w0 = _mm512_shuffle_f32x4(u[q], u[4 + q], 0x88);
    const __m512 w1 = _mm512_shuffle_f32x4(u[q], u[4 + q], 0xDD);
    const __m512 w2 = _mm512_shuffle_f32x4(u[8 + q], u[12 + q], 0x88);
    const __m512 w3 = _mm512_shuffle_f32x4(u[8 + q], u[12 + q], 0xDD);
    r[q] = _mm512_shuffle_f32x4(w0, w2, 0x88);
    r[4 + q] = _mm512_shuffle_f32x4(w1, w3, 0x88);
    r[8 + q] = _mm512_shuffle_f32x4(w0, w2, 0xDD);
    r[12 + q] = _mm512_shuffle_f32x4(w1, w3, 0xDD);
  }
}

// Packs kc rows and columns [j0, j0 + nc) of op(b) into strips of kNr
// columns: strip s holds row p at dst[s * strip_stride + p * kNr],
// zero-padded past column nc. b points at the rows' first element in column
// 0 of op(b) (stored [k, n] with row stride ldb, or [n, k] if transposed).
PSRT_AVX512_TARGET void PackB(const float* b, int64_t ldb, bool transposed,
                              int64_t kc, int64_t j0, int64_t nc,
                              int64_t strip_stride, float* dst) {
  for (int64_t s0 = 0; s0 < nc; s0 += kNr, dst += strip_stride) {
    const int cols = static_cast<int>(std::min<int64_t>(kNr, nc - s0));
    if (!transposed) {
      const StripMask mask(cols);
      const float* src = b + j0 + s0;
      for (int64_t p = 0; p < kc; ++p, src += ldb) {
        _mm512_store_ps(dst + p * kNr, _mm512_maskz_loadu_ps(mask.lo, src));
        _mm512_store_ps(dst + p * kNr + 16,
                        _mm512_maskz_loadu_ps(mask.hi, src + 16));
      }
      continue;
    }
    // Column j of op(b) is row j of b. Each half of the strip is transposed
    // in 16x16 blocks: 16 rows of b (columns of op(b), zero past nc) by 16
    // of their elements (rows of op(b); masked past kc).
    for (int half = 0; half < 2; ++half) {
      const int half_cols = std::clamp(cols - 16 * half, 0, 16);
      const float* src = b + (j0 + s0 + 16 * half) * ldb;
      for (int64_t p = 0; p < kc; p += 16) {
        const int depth = static_cast<int>(std::min<int64_t>(16, kc - p));
        const __mmask16 load_mask = (1u << depth) - 1;
        __m512 block[16];
        for (int j = 0; j < 16; ++j) {
          block[j] = j < half_cols
                         ? _mm512_maskz_loadu_ps(load_mask, src + j * ldb + p)
                         : _mm512_setzero_ps();
        }
        Transpose16x16(block);
        for (int q = 0; q < depth; ++q) {
          _mm512_store_ps(dst + (p + q) * kNr + 16 * half, block[q]);
        }
      }
    }
  }
}

// A k block: pieces [first, first + count) of the call's pieces, of total
// depth k.
struct KBlock {
  int64_t first;
  int64_t count;
  int64_t k;
};

// Cuts the terms of g into pieces and k blocks (see the top of the file).
// The pieces' b point at column 0 of op(b_i), as stored.
void PlanKBlocks(const BatchReduceGemm& g, std::vector<Piece>* pieces,
                 std::vector<KBlock>* blocks) {
  pieces->clear();
  blocks->clear();
  for (int64_t i = 0; i < g.count; ++i) {
    const GemmTerm& term = g.terms[i];
    if (term.k == 0) continue;
    const int64_t parts = CeilDiv(term.k, kMaxKc);
    for (int64_t q = 0, p0 = 0; q < parts; ++q) {
      const int64_t depth = term.k / parts + (q < term.k % parts ? 1 : 0);
      pieces->push_back(
          Piece{g.transpose_a ? term.a + p0 * g.lda : term.a + p0,
                g.transpose_b ? term.b + p0 : term.b + p0 * g.ldb, depth});
      p0 += depth;
    }
  }
  for (int64_t i = 0; i < static_cast<int64_t>(pieces->size()); ++i) {
    const int64_t k = (*pieces)[i].k;
    if (blocks->empty() || blocks->back().k + k > kMaxKc) {
      blocks->push_back(KBlock{i, 0, 0});
    }
    ++blocks->back().count;
    blocks->back().k += k;
  }
}

}  // namespace

bool Avx512GemmSupported() {
  static const bool supported = __builtin_cpu_supports("avx512f") &&
                                __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512dq") &&
                                __builtin_cpu_supports("avx512vl");
  return supported;
}

void Avx512Gemm(const BatchReduceGemm& g) {
  const int64_t m = g.m, n = g.n;
  CHECK(m >= 1 && n >= 1 && g.alpha != 0.0f);
  // Per-thread lists, reused from call to call.
  thread_local std::vector<Piece> pieces, block_pieces;
  thread_local std::vector<KBlock> blocks;
  PlanKBlocks(g, &pieces, &blocks);
  CHECK(!blocks.empty()) << "a GEMM of depth 0 reached the AVX-512 path";
  int64_t total_k = 0, max_block_k = 0;
  for (const KBlock& block : blocks) {
    total_k += block.k;
    max_block_k = std::max(max_block_k, block.k);
  }
  const int64_t row_tiles = CeilDiv(m, kMr);
  const bool pack_b = g.transpose_b || (total_k * n > kMaxUnpackedBFloats &&
                                        row_tiles > kMaxRowTilesUnpacked);
  // Equal column blocks rather than full ones and a sliver.
  const int64_t nc_size =
      pack_b ? CeilDiv(CeilDiv(n, CeilDiv(n, kMaxNc)), kNr) * kNr : n;
  float* packed = pack_b ? PackBuffer(max_block_k * nc_size) : nullptr;
  const auto& kernels = kMicroKernels[g.transpose_a];
  for (int64_t j0 = 0; j0 < n; j0 += nc_size) {
    const int64_t nc = std::min(nc_size, n - j0);
    for (size_t bi = 0; bi < blocks.size(); ++bi) {
      const KBlock& block = blocks[bi];
      Tile t;
      t.lda = g.lda;
      t.ldc = g.ldc;
      t.alpha = g.alpha;
      t.beta = bi == 0 ? g.beta : 1.0f;  // Later k blocks add to the first.
      block_pieces.assign(pieces.begin() + block.first,
                          pieces.begin() + block.first + block.count);
      int64_t strip_stride;
      if (pack_b) {
        for (int64_t i = 0, depth = 0; i < block.count; ++i) {
          Piece& piece = block_pieces[i];
          PackB(piece.b, g.ldb, g.transpose_b, piece.k, j0, nc,
                block.k * kNr, packed + depth * kNr);
          piece.b = packed + depth * kNr;
          depth += piece.k;
        }
        t.b_step = kNr;
        strip_stride = block.k * kNr;
      } else {
        for (Piece& piece : block_pieces) piece.b += j0;
        t.b_step = g.ldb;
        strip_stride = kNr;
      }
      t.pieces = block_pieces.data();
      t.count = block.count;
      // Row tiles of equal height (within one): 25 rows as 9 + 8 + 8, not
      // 12 + 12 + 1, whose one-row tile would wait on FMA latency.
      for (int64_t tile = 0, i0 = 0; tile < row_tiles; ++tile) {
        const int rows = static_cast<int>(m / row_tiles +
                                          (tile < m % row_tiles ? 1 : 0));
        t.a_offset = g.transpose_a ? i0 : i0 * g.lda;
        for (int64_t s0 = 0, s = 0; s0 < nc; s0 += kNr, ++s) {
          t.b_offset = s * strip_stride;
          t.c = g.c + i0 * g.ldc + j0 + s0;
          t.cols = static_cast<int>(std::min<int64_t>(kNr, nc - s0));
          kernels[!pack_b && t.cols < kNr][rows - 1](t);
        }
        i0 += rows;
      }
    }
  }
}

#else  // !PSRT_GEMM_AVX512

bool Avx512GemmSupported() { return false; }

void Avx512Gemm(const BatchReduceGemm&) {
  LOG(FATAL) << "this build has no AVX-512 GEMM";
}

#endif  // PSRT_GEMM_AVX512

}  // namespace internal
}  // namespace kernels
}  // namespace psrt
