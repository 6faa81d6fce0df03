// The AVX-512 path of the blocked GEMM (gemm.h, gemm_blocked.h): a 12x32
// register tile in 24 zmm accumulators; one k step = 2 loads of b, up to 12
// broadcasts of a, up to 24 FMAs. A [12, 256] slice of op(a) (12 KiB) stays
// in L1 while a strip of packed b streams past it, and a packed [256, 512]
// block of op(b) (512 KiB) in L2.
//
// Everything that uses AVX-512 instructions carries PSRT_AVX512_TARGET, so
// this file builds with the kernels' baseline -march and runs its code only
// after Avx512GemmSupported() has checked the CPU.
#include <algorithm>
#include <array>
#include <utility>

#include "glog/logging.h"
#include "kernels/gemm.h"
#include "kernels/gemm_blocked.h"

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

// The lanes of a strip's two zmm halves that hold its first `cols` columns.
struct StripMask {
  explicit StripMask(int cols)
      : lo(cols >= 16 ? 0xFFFF : (1u << cols) - 1),
        hi(cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (1u << (cols - 16)) - 1) {}
  __mmask16 lo;
  __mmask16 hi;
};

// kMaskedB: the strip is read in place and narrower than kNr, so its loads
// are masked (masked loads cost more than plain ones here).
template <int kRows, bool kTransposedA, bool kMaskedB>
PSRT_AVX512_TARGET void MicroKernel(const GemmTile& t) {
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

using MicroKernelFn = void (*)(const GemmTile&);

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
PSRT_AVX512_TARGET void PackStrips(const float* b, int64_t ldb, bool transposed,
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

// The ISA of gemm_blocked.h.
struct Avx512 {
  static constexpr int kMr = ::psrt::kernels::internal::kMr;
  static constexpr int kNr = ::psrt::kernels::internal::kNr;
  static constexpr int64_t kMaxKc = 256;
  static constexpr int64_t kMaxNc = 512;
  // op(b) is read in place (when not transposed) up to this size, where it
  // stays in L2 as a packed copy would and a copy would buy only
  // contiguity; or with at most this many row tiles, too few to pay for a
  // copy.
  static constexpr int64_t kMaxUnpackedBFloats = 64 * 1024;
  static constexpr int64_t kMaxRowTilesUnpacked = 4;
  static void PackB(const float* b, int64_t ldb, bool transposed, int64_t kc, int64_t j0,
                    int64_t nc, int64_t strip_stride, float* dst) {
    PackStrips(b, ldb, transposed, kc, j0, nc, strip_stride, dst);
  }
  static void RunTile(bool transposed_a, bool masked_b, int rows, const GemmTile& t) {
    kMicroKernels[transposed_a][masked_b][rows - 1](t);
  }
};

}  // namespace

bool Avx512GemmSupported() {
  static const bool supported = __builtin_cpu_supports("avx512f") &&
                                __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512dq") &&
                                __builtin_cpu_supports("avx512vl");
  return supported;
}

void Avx512Gemm(const BatchReduceGemm& g) { BlockedGemm<Avx512>(g); }

#else  // !PSRT_GEMM_AVX512

bool Avx512GemmSupported() { return false; }

void Avx512Gemm(const BatchReduceGemm&) {
  LOG(FATAL) << "this build has no AVX-512 GEMM";
}

#endif  // PSRT_GEMM_AVX512

}  // namespace internal
}  // namespace kernels
}  // namespace psrt
