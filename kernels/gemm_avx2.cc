// The AVX2 + FMA path of the blocked GEMM (gemm.h, gemm_blocked.h), for x86
// CPUs without AVX-512 (a Zen 3, many servers): a 6x16 register tile in 12
// ymm accumulators, plus two for a row of b and one broadcast of a, out of
// the 16 ymm registers; one k step = 2 loads of b, up to 6 broadcasts of a,
// up to 12 FMAs. A [6, 256] slice of op(a) (6 KiB) stays in L1 while a
// strip of packed b streams past it, and a packed [256, 256] block of op(b)
// (256 KiB) in an L2 of 512 KiB.
//
// Everything that uses AVX2 or FMA instructions carries PSRT_AVX2_TARGET, so
// this file builds with the kernels' baseline -march and runs its code only
// after Avx2GemmSupported() has checked the CPU.
#include <algorithm>
#include <array>
#include <utility>

#include "glog/logging.h"
#include "kernels/gemm.h"
#include "kernels/gemm_blocked.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PSRT_GEMM_AVX2 1
#include <immintrin.h>
#else
#define PSRT_GEMM_AVX2 0
#endif

namespace psrt {
namespace kernels {
namespace internal {

#if PSRT_GEMM_AVX2

#define PSRT_AVX2_TARGET __attribute__((target("avx2,fma")))

namespace {

constexpr int kMr = static_cast<int>(kAvx2TileRows);
constexpr int kNr = static_cast<int>(kAvx2TileCols);
static_assert(kNr == 16, "the micro-kernel holds a tile row in two ymm");

// The lanes of a strip's two ymm halves that hold its first `cols` columns,
// as the sign bits _mm256_maskload_ps and _mm256_maskstore_ps take.
struct StripMask {
  PSRT_AVX2_TARGET explicit StripMask(int cols) {
    alignas(32) int32_t lanes[16];
    for (int j = 0; j < 16; ++j) lanes[j] = j < cols ? -1 : 0;
    lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes));
    hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes + 8));
  }
  __m256i lo;
  __m256i hi;
};

// kMaskedB: the strip is read in place and narrower than kNr, so its loads
// are masked.
template <int kRows, bool kTransposedA, bool kMaskedB>
PSRT_AVX2_TARGET void MicroKernel(const GemmTile& t) {
  // Locals, so that the stores to c cannot alias what the loops read from t;
  // every loop over the rows is unrolled, so that the accumulators live in
  // registers.
  const int64_t lda = t.lda, b_step = t.b_step, ldc = t.ldc;
  float* const c = t.c;
  const int cols = t.cols;
  const float alpha = t.alpha, beta = t.beta;
  const StripMask mask(cols);
  __m256 lo[kRows], hi[kRows];
#pragma GCC unroll 6
  for (int r = 0; r < kRows; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
  for (int64_t i = 0; i < t.count; ++i) {
    const float* a = t.pieces[i].a + t.a_offset;
    const float* b = t.pieces[i].b + t.b_offset;
#pragma GCC unroll 4
    for (int64_t p = t.pieces[i].k; p > 0; --p) {
      const __m256 b_lo = kMaskedB ? _mm256_maskload_ps(b, mask.lo) : _mm256_loadu_ps(b);
      const __m256 b_hi =
          kMaskedB ? _mm256_maskload_ps(b + 8, mask.hi) : _mm256_loadu_ps(b + 8);
#pragma GCC unroll 6
      for (int r = 0; r < kRows; ++r) {
        const __m256 ar = _mm256_broadcast_ss(kTransposedA ? a + r : a + r * lda);
        lo[r] = _mm256_fmadd_ps(ar, b_lo, lo[r]);
        hi[r] = _mm256_fmadd_ps(ar, b_hi, hi[r]);
      }
      a += kTransposedA ? lda : 1;
      b += b_step;
    }
  }
  const __m256 alpha_v = _mm256_set1_ps(alpha);
  const __m256 beta_v = _mm256_set1_ps(beta);
#pragma GCC unroll 6
  for (int r = 0; r < kRows; ++r) {
    float* const c_row = c + r * ldc;
    __m256 v_lo = _mm256_mul_ps(lo[r], alpha_v);
    __m256 v_hi = _mm256_mul_ps(hi[r], alpha_v);
    if (beta != 0.0f) {  // With beta == 0, c may hold NaNs: never read it.
      v_lo = _mm256_fmadd_ps(beta_v, _mm256_maskload_ps(c_row, mask.lo), v_lo);
      v_hi = _mm256_fmadd_ps(beta_v, _mm256_maskload_ps(c_row + 8, mask.hi), v_hi);
    }
    if (cols == kNr) {
      _mm256_storeu_ps(c_row, v_lo);
      _mm256_storeu_ps(c_row + 8, v_hi);
    } else {
      _mm256_maskstore_ps(c_row, mask.lo, v_lo);
      _mm256_maskstore_ps(c_row + 8, mask.hi, v_hi);
    }
  }
}

using MicroKernelFn = void (*)(const GemmTile&);

// kMicroKernels[transposed_a][masked_b][rows - 1].
template <bool kTransposedA, bool kMaskedB, size_t... kRowsMinus1>
constexpr std::array<MicroKernelFn, kMr> MicroKernelsFor(std::index_sequence<kRowsMinus1...>) {
  return {&MicroKernel<kRowsMinus1 + 1, kTransposedA, kMaskedB>...};
}
const std::array<MicroKernelFn, kMr> kMicroKernels[2][2] = {
    {MicroKernelsFor<false, false>(std::make_index_sequence<kMr>()),
     MicroKernelsFor<false, true>(std::make_index_sequence<kMr>())},
    {MicroKernelsFor<true, false>(std::make_index_sequence<kMr>()),
     MicroKernelsFor<true, true>(std::make_index_sequence<kMr>())},
};

// Transposes the 8x8 block held one row per register in r, in place.
PSRT_AVX2_TARGET void Transpose8x8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {  // Pairs of rows, within 128-bit lanes.
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int g = 0; g < 8; g += 4) {  // Quads of rows.
    u[g] = _mm256_shuffle_ps(t[g], t[g + 2], 0x44);
    u[g + 1] = _mm256_shuffle_ps(t[g], t[g + 2], 0xEE);
    u[g + 2] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0x44);
    u[g + 3] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0xEE);
  }
  for (int q = 0; q < 4; ++q) {  // The two 128-bit lanes.
    r[q] = _mm256_permute2f128_ps(u[q], u[4 + q], 0x20);
    r[4 + q] = _mm256_permute2f128_ps(u[q], u[4 + q], 0x31);
  }
}

// Packs kc rows and columns [j0, j0 + nc) of op(b) into strips of kNr
// columns (gemm_blocked.h's PackB).
PSRT_AVX2_TARGET void PackStrips(const float* b, int64_t ldb, bool transposed, int64_t kc,
                                 int64_t j0, int64_t nc, int64_t strip_stride, float* dst) {
  for (int64_t s0 = 0; s0 < nc; s0 += kNr, dst += strip_stride) {
    const int cols = static_cast<int>(std::min<int64_t>(kNr, nc - s0));
    if (!transposed) {
      const StripMask mask(cols);
      const float* src = b + j0 + s0;
      for (int64_t p = 0; p < kc; ++p, src += ldb) {
        _mm256_store_ps(dst + p * kNr, _mm256_maskload_ps(src, mask.lo));
        _mm256_store_ps(dst + p * kNr + 8, _mm256_maskload_ps(src + 8, mask.hi));
      }
      continue;
    }
    // Column j of op(b) is row j of b. Each half of the strip is transposed
    // in 8x8 blocks: 8 rows of b (columns of op(b), zero past nc) by 8 of
    // their elements (rows of op(b); masked past kc).
    for (int half = 0; half < 2; ++half) {
      const int half_cols = std::clamp(cols - 8 * half, 0, 8);
      // Rows of b past op(b)'s last column are never read (zeros instead).
      const float* src = half_cols > 0 ? b + (j0 + s0 + 8 * half) * ldb : b;
      for (int64_t p = 0; p < kc; p += 8) {
        const int depth = static_cast<int>(std::min<int64_t>(8, kc - p));
        const StripMask load_mask(depth);
        __m256 block[8];
        for (int j = 0; j < 8; ++j) {
          block[j] = j < half_cols ? _mm256_maskload_ps(src + j * ldb + p, load_mask.lo)
                                   : _mm256_setzero_ps();
        }
        Transpose8x8(block);
        for (int q = 0; q < depth; ++q) {
          _mm256_store_ps(dst + (p + q) * kNr + 8 * half, block[q]);
        }
      }
    }
  }
}

// The ISA of gemm_blocked.h.
struct Avx2 {
  static constexpr int kMr = ::psrt::kernels::internal::kMr;
  static constexpr int kNr = ::psrt::kernels::internal::kNr;
  static constexpr int64_t kMaxKc = 256;
  static constexpr int64_t kMaxNc = 256;
  // Read op(b) in place while it fits in L1 (strided rows of b from L2 cost
  // more than a copy), or when too few row tiles use it to pay for a copy.
  static constexpr int64_t kMaxUnpackedBFloats = 8 * 1024;
  static constexpr int64_t kMaxRowTilesUnpacked = 8;
  static void PackB(const float* b, int64_t ldb, bool transposed, int64_t kc, int64_t j0,
                    int64_t nc, int64_t strip_stride, float* dst) {
    PackStrips(b, ldb, transposed, kc, j0, nc, strip_stride, dst);
  }
  static void RunTile(bool transposed_a, bool masked_b, int rows, const GemmTile& t) {
    kMicroKernels[transposed_a][masked_b][rows - 1](t);
  }
};

}  // namespace

bool Avx2GemmSupported() {
  static const bool supported =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return supported;
}

void Avx2Gemm(const BatchReduceGemm& g) { BlockedGemm<Avx2>(g); }

#else  // !PSRT_GEMM_AVX2

bool Avx2GemmSupported() { return false; }

void Avx2Gemm(const BatchReduceGemm&) { LOG(FATAL) << "this build has no AVX2 GEMM"; }

#endif  // PSRT_GEMM_AVX2

}  // namespace internal
}  // namespace kernels
}  // namespace psrt
