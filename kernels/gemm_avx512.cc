// The AVX-512 GEMM path (see gemm.h), in the style of BLIS / GotoBLAS:
//
//   for each block of kMaxNc columns of c:
//     for each block of at most kMaxKc of the k dimension:
//       pack that [kc, nc] block of op(b) into strips of kNr columns
//       (each strip kc rows of kNr floats, zero-padded), kept in L2;
//       for each kMr-row tile of c:       (its [kMr, kc] slice of op(a)
//         for each strip of the block:     stays in L1 across the strips)
//           micro-kernel: a kMr x kNr tile of c in 24 zmm accumulators,
//           one k step = 2 loads of b, 12 broadcasts of a, 24 FMAs.
//
// op(a) is never packed: the micro-kernel broadcasts its elements straight
// from a, row-major (a[r * lda + p]) or transposed (a[p * lda + r]); with
// few columns of c (a convolution's 32 or 64 output channels) each element
// of a is used by only one or two strips, and packing it would cost as much
// as the multiply-adds it feeds. op(b) is read in place, unpacked, when it is
// laid out as packed strips would be (not transposed, whole strips) and small
// enough to stay in L2 by itself (a convolution's filter or output gradient).
//
// Everything that uses AVX-512 instructions carries PSRT_AVX512_TARGET, so
// this file builds with the kernels' baseline -march and runs its code only
// after Avx512GemmSupported() has checked the CPU.
#include <algorithm>
#include <array>
#include <cstdlib>
#include <utility>

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
// op(b) is read in place (when its layout allows) up to this size, where it
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

// One micro-kernel call: c[rows, cols] = alpha * a-slice * b-strip + beta * c.
struct Tile {
  const float* a;  // Element (r, p) of the slice at a[r * lda + p], or at
  int64_t lda;     // a[p * lda + r] when a is transposed.
  const float* b;  // Row p of the strip: kNr floats at b + p * b_step.
  int64_t b_step;
  int64_t kc;
  float* c;
  int64_t ldc;
  int cols;  // Columns of c to write, 1..kNr (the strip is padded).
  float alpha;
  float beta;
};

template <int kRows, bool kTransposedA>
PSRT_AVX512_TARGET void MicroKernel(const Tile& t) {
  // Locals, so that the stores to c cannot alias what the loops read from t;
  // every loop over the rows is unrolled, so that the accumulators live in
  // registers.
  const float* a = t.a;
  const float* b = t.b;
  const int64_t lda = t.lda, b_step = t.b_step, kc = t.kc, ldc = t.ldc;
  float* const c = t.c;
  const int cols = t.cols;
  const float alpha = t.alpha, beta = t.beta;
  __m512 lo[kRows], hi[kRows];
#pragma GCC unroll 12
  for (int r = 0; r < kRows; ++r) lo[r] = hi[r] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kc; ++p) {
    const __m512 b_lo = _mm512_loadu_ps(b);
    const __m512 b_hi = _mm512_loadu_ps(b + 16);
#pragma GCC unroll 12
    for (int r = 0; r < kRows; ++r) {
      const __m512 ar = _mm512_set1_ps(kTransposedA ? a[r] : a[r * lda]);
      lo[r] = _mm512_fmadd_ps(ar, b_lo, lo[r]);
      hi[r] = _mm512_fmadd_ps(ar, b_hi, hi[r]);
    }
    a += kTransposedA ? lda : 1;
    b += b_step;
  }
  const __m512 alpha_v = _mm512_set1_ps(alpha);
  const __m512 beta_v = _mm512_set1_ps(beta);
  const StripMask mask(cols);
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

// kMicroKernels[transposed_a][rows - 1].
template <bool kTransposedA, size_t... kRowsMinus1>
constexpr std::array<MicroKernelFn, kMr> MicroKernelsFor(
    std::index_sequence<kRowsMinus1...>) {
  return {&MicroKernel<kRowsMinus1 + 1, kTransposedA>...};
}
const std::array<MicroKernelFn, kMr> kMicroKernels[2] = {
    MicroKernelsFor<false>(std::make_index_sequence<kMr>()),
    MicroKernelsFor<true>(std::make_index_sequence<kMr>()),
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

// Packs rows [p0, p0 + kc) and columns [j0, j0 + nc) of op(b) into strips of
// kNr columns: strip s holds row p at dst[(s * kc + p) * kNr], zero-padded
// past column nc.
PSRT_AVX512_TARGET void PackB(const StridedGemm& g, int64_t p0, int64_t kc,
                              int64_t j0, int64_t nc, float* dst) {
  for (int64_t s0 = 0; s0 < nc; s0 += kNr, dst += kc * kNr) {
    const int cols = static_cast<int>(std::min<int64_t>(kNr, nc - s0));
    if (!g.shape.transpose_b) {
      const StripMask mask(cols);
      const float* src = g.b + p0 * g.ldb + j0 + s0;
      for (int64_t p = 0; p < kc; ++p, src += g.ldb) {
        _mm512_store_ps(dst + p * kNr, _mm512_maskz_loadu_ps(mask.lo, src));
        _mm512_store_ps(dst + p * kNr + 16,
                        _mm512_maskz_loadu_ps(mask.hi, src + 16));
      }
      continue;
    }
    // b is stored [n, k]: column j of op(b) is row j of b. Each half of the
    // strip is transposed in 16x16 blocks: 16 rows of b (columns of op(b),
    // zero past nc) by 16 of their elements (rows of op(b); masked past kc).
    for (int half = 0; half < 2; ++half) {
      const int half_cols = std::clamp(cols - 16 * half, 0, 16);
      const float* src = g.b + (j0 + s0 + 16 * half) * g.ldb + p0;
      for (int64_t p = 0; p < kc; p += 16) {
        const int depth = static_cast<int>(std::min<int64_t>(16, kc - p));
        const __mmask16 load_mask = (1u << depth) - 1;
        __m512 block[16];
        for (int j = 0; j < 16; ++j) {
          block[j] = j < half_cols ? _mm512_maskz_loadu_ps(
                                         load_mask, src + j * g.ldb + p)
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

}  // namespace

bool Avx512GemmSupported() {
  static const bool supported = __builtin_cpu_supports("avx512f") &&
                                __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512dq") &&
                                __builtin_cpu_supports("avx512vl");
  return supported;
}

void Avx512Gemm(const StridedGemm& g) {
  const int64_t m = g.shape.m, n = g.shape.n, k = g.shape.k;
  const bool ta = g.shape.transpose_a, tb = g.shape.transpose_b;
  CHECK(m >= 1 && n >= 1 && k >= 1 && g.alpha != 0.0f);
  const int64_t row_tiles = CeilDiv(m, kMr);
  const bool pack_b = tb || n % kNr != 0 ||
                      (k * n > kMaxUnpackedBFloats &&
                       row_tiles > kMaxRowTilesUnpacked);
  // Equal blocks rather than full ones and a sliver.
  const int64_t kc_size = CeilDiv(k, CeilDiv(k, kMaxKc));
  const int64_t nc_size =
      pack_b ? CeilDiv(CeilDiv(n, CeilDiv(n, kMaxNc)), kNr) * kNr : n;
  float* packed = pack_b ? PackBuffer(kc_size * nc_size) : nullptr;
  const std::array<MicroKernelFn, kMr>& kernels = kMicroKernels[ta];
  for (int64_t j0 = 0; j0 < n; j0 += nc_size) {
    const int64_t nc = std::min(nc_size, n - j0);
    for (int64_t p0 = 0; p0 < k; p0 += kc_size) {
      Tile t;
      t.kc = std::min(kc_size, k - p0);
      t.lda = g.lda;
      t.ldc = g.ldc;
      t.alpha = g.alpha;
      t.beta = p0 == 0 ? g.beta : 1.0f;  // Later k blocks add to the first.
      const float* b_block;
      int64_t strip_stride;
      if (pack_b) {
        PackB(g, p0, t.kc, j0, nc, packed);
        b_block = packed;
        t.b_step = kNr;
        strip_stride = t.kc * kNr;
      } else {
        b_block = g.b + p0 * g.ldb + j0;
        t.b_step = g.ldb;
        strip_stride = kNr;
      }
      // Row tiles of equal height (within one): 25 rows as 9 + 8 + 8, not
      // 12 + 12 + 1, whose one-row tile would wait on FMA latency.
      for (int64_t tile = 0, i0 = 0; tile < row_tiles; ++tile) {
        const int rows = static_cast<int>(m / row_tiles +
                                          (tile < m % row_tiles ? 1 : 0));
        const MicroKernelFn kernel = kernels[rows - 1];
        t.a = ta ? g.a + p0 * g.lda + i0 : g.a + i0 * g.lda + p0;
        for (int64_t s0 = 0, s = 0; s0 < nc; s0 += kNr, ++s) {
          t.b = b_block + s * strip_stride;
          t.c = g.c + i0 * g.ldc + j0 + s0;
          t.cols = static_cast<int>(std::min<int64_t>(kNr, nc - s0));
          kernel(t);
        }
        i0 += rows;
      }
    }
  }
}

#else  // !PSRT_GEMM_AVX512

bool Avx512GemmSupported() { return false; }

void Avx512Gemm(const StridedGemm&) {
  LOG(FATAL) << "this build has no AVX-512 GEMM";
}

#endif  // PSRT_GEMM_AVX512

}  // namespace internal
}  // namespace kernels
}  // namespace psrt
