// The CPU GEMM behind Gemm and GemmOnCallingThread (ops.h), with its paths:
//
//   kPortable  Eigen's GEMM, built for PSRT_KERNELS_MARCH: any CPU.
//   kAvx512    psrt's own blocked GEMM (gemm_blocked.h, gemm_avx512.cc): up
//              to 12x32 of c in zmm accumulators, k split into L1-sized
//              blocks, op(a) read in place, op(b) read in place or packed
//              into a per-thread buffer that is reused from call to call.
//              Only on x86-64 CPUs with AVX-512 F/BW/DQ/VL, checked at run
//              time.
//   kAvx2      the same blocked GEMM with a 6x16 tile in ymm accumulators
//              (gemm_avx2.cc), for x86-64 CPUs with AVX2 and FMA but no
//              AVX-512 (checked at run time).
//
// Beyond ops.h's Gemm, it offers GEMMs on strided storage whose rows may
// overlap (StridedGemm) and sums of such GEMMs (BatchReduceGemm): the
// direct convolution (conv_direct.h) is built on them.
//
// Gemm picks BestGemmPath() once; the *OnPath functions let tests and
// benchmarks run each path on purpose (kPortable is the oracle for the
// others). BestGemmPath prefers kAvx512, then kAvx2; PSRT_GEMM_PATH
// (portable, avx2 or avx512) overrides it, to time or test a path a CPU
// would not get by default.
// Both paths follow ops.h's contract: c = alpha * op(a) * op(b) + beta * c,
// c row-major, and with beta == 0 the old c is never read. With alpha == 0
// or k == 0 neither a nor b is read: c = beta * c.
//
// Thread safety: all functions may be called from several threads at once
// (the packing buffers are per thread).
#ifndef PSRT_KERNELS_GEMM_H_
#define PSRT_KERNELS_GEMM_H_

#include <cstdint>

#include "kernels/cpu_context.h"
#include "kernels/ops.h"

namespace psrt {
namespace kernels {

enum class GemmPath {
  kPortable,
  kAvx512,
  kAvx2,
};

// "portable", "avx512", "avx2".
const char* GemmPathName(GemmPath path);

// Whether this build and this CPU can run `path` (kPortable always can).
bool GemmPathSupported(GemmPath path);

// The fastest supported path; what Gemm and GemmOnCallingThread use.
GemmPath BestGemmPath();

// Gemm and GemmOnCallingThread (ops.h) on a chosen path.
// REQUIRES: GemmPathSupported(path) (CHECKed); as for Gemm.
void GemmOnPath(GemmPath path, const CpuContext& ctx, const MatMulShape& shape,
                float alpha, const float* a, const float* b, float beta,
                float* c);
void GemmOnCallingThreadOnPath(GemmPath path, const MatMulShape& shape,
                               float alpha, const float* a, const float* b,
                               float beta, float* c);

// A GEMM on strided storage: op(a) [m, k], op(b) [k, n] and c [m, n], each
// stored row-major with an explicit leading dimension (the distance between
// consecutive rows as stored: a is stored [m, k], or [k, m] when
// transposed). Rows of a or of b may overlap, so that a convolution can read
// the windows of its input in place (row stride = one pixel's channels, row
// length = a window row); rows of c must not.
struct StridedGemm {
  MatMulShape shape;
  float alpha;
  const float* a;
  int64_t lda;
  const float* b;
  int64_t ldb;
  float beta;
  float* c;
  int64_t ldc;
};

// A StridedGemm on the calling thread, on the best path or a chosen one.
// REQUIRES: as for Gemm; GemmPathSupported(path).
void StridedGemmOnCallingThread(const StridedGemm& gemm);
void StridedGemmOnPath(GemmPath path, const StridedGemm& gemm);

// One term of a BatchReduceGemm: op(a) [m, k] times op(b) [k, n].
struct GemmTerm {
  const float* a;
  const float* b;
  int64_t k;
};

// A batch-reduce GEMM: c = alpha * sum_i op(a_i) op(b_i) + beta * c over
// `count` terms that share m, n, the transposes and the leading dimensions
// (storage as in StridedGemm; rows of a_i or b_i may overlap), each with its
// own depth. The AVX-512 path sums all terms in registers and writes c once
// per k block: a direct convolution is one, summing over the rows of a
// filter window (or, for the filter's gradient, over output rows) without a
// column matrix.
struct BatchReduceGemm {
  int64_t m;
  int64_t n;
  bool transpose_a;
  bool transpose_b;
  const GemmTerm* terms;
  int64_t count;
  int64_t lda;
  int64_t ldb;
  float alpha;
  float beta;
  float* c;
  int64_t ldc;
};

// A BatchReduceGemm on the calling thread, on the best path or a chosen one.
// REQUIRES: m, n, count, every k >= 0; GemmPathSupported(path).
void BatchReduceGemmOnCallingThread(const BatchReduceGemm& gemm);
void BatchReduceGemmOnPath(GemmPath path, const BatchReduceGemm& gemm);

namespace internal {

// The AVX-512 and AVX2 paths on the calling thread (gemm_avx512.cc,
// gemm_avx2.cc).
// REQUIRES: Avx512GemmSupported() (Avx2GemmSupported()); m, n >= 1; some
// term's k >= 1; alpha != 0.
bool Avx512GemmSupported();
void Avx512Gemm(const BatchReduceGemm& gemm);
bool Avx2GemmSupported();
void Avx2Gemm(const BatchReduceGemm& gemm);

// Rows and columns of c in one register tile: the grains in which the
// parallel GEMM splits c between threads.
constexpr int64_t kAvx512TileRows = 12;
constexpr int64_t kAvx512TileCols = 32;
constexpr int64_t kAvx2TileRows = 6;
constexpr int64_t kAvx2TileCols = 16;

}  // namespace internal
}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_GEMM_H_
