#include "kernels/gemm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "Eigen/Core"
#include "glog/logging.h"

namespace psrt {
namespace kernels {
namespace {

// GEMMs with fewer multiply-adds than this run on one thread.
constexpr int64_t kMinParallelGemmWork = 1 << 18;
// Rows or columns per block of the portable path: a multiple of Eigen's
// register blocking.
constexpr int64_t kEigenGrain = 32;

using Stride = Eigen::OuterStride<>;
template <int Order>
using ConstMatrixMap = Eigen::Map<
    const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Order>, 0,
    Stride>;
using RowMajorMap = Eigen::Map<
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0,
    Stride>;

// The portable path: Eigen's single-threaded GEMM on one block.
void PortableGemm(const StridedGemm& g) {
  const MatMulShape& s = g.shape;
  RowMajorMap c(g.c, s.m, s.n, Stride(g.ldc));
  auto multiply = [&](const auto& a, const auto& b) {
    if (g.beta == 0.0f) {
      c.noalias() = g.alpha * a * b;
      return;
    }
    if (g.beta != 1.0f) c *= g.beta;
    c.noalias() += g.alpha * a * b;
  };
  auto with_a = [&](const auto& b) {
    if (s.transpose_a) {
      multiply(ConstMatrixMap<Eigen::ColMajor>(g.a, s.m, s.k, Stride(g.lda)),
               b);
    } else {
      multiply(ConstMatrixMap<Eigen::RowMajor>(g.a, s.m, s.k, Stride(g.lda)),
               b);
    }
  };
  if (s.transpose_b) {
    with_a(ConstMatrixMap<Eigen::ColMajor>(g.b, s.k, s.n, Stride(g.ldb)));
  } else {
    with_a(ConstMatrixMap<Eigen::RowMajor>(g.b, s.k, s.n, Stride(g.ldb)));
  }
}

// c = beta * c, for GEMMs that multiply nothing (k == 0 or alpha == 0).
void ScaleC(int64_t m, int64_t n, float beta, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    float* row = c + i * ldc;
    if (beta == 0.0f) {
      std::fill_n(row, n, 0.0f);
    } else {
      for (int64_t j = 0; j < n; ++j) row[j] *= beta;
    }
  }
}

// Runs a batch-reduce GEMM on the calling thread on `path`.
void RunBatchReduce(GemmPath path, const BatchReduceGemm& g) {
  int64_t total_k = 0;
  for (int64_t i = 0; i < g.count; ++i) total_k += g.terms[i].k;
  if (total_k == 0 || g.alpha == 0.0f) {
    ScaleC(g.m, g.n, g.beta, g.c, g.ldc);
    return;
  }
  if (path == GemmPath::kAvx512) {
    internal::Avx512Gemm(g);
    return;
  }
  if (path == GemmPath::kAvx2) {
    internal::Avx2Gemm(g);
    return;
  }
  float beta = g.beta;  // The first term scales c, the others add to it.
  for (int64_t i = 0; i < g.count; ++i) {
    const GemmTerm& term = g.terms[i];
    if (term.k == 0) continue;
    PortableGemm(StridedGemm{
        MatMulShape{g.m, g.n, term.k, g.transpose_a, g.transpose_b}, g.alpha,
        term.a, g.lda, term.b, g.ldb, beta, g.c, g.ldc});
    beta = 1.0f;
  }
}

// Runs a whole GEMM block on the calling thread on `path`.
void RunBlock(GemmPath path, const StridedGemm& g) {
  const GemmTerm term{g.a, g.b, g.shape.k};
  RunBatchReduce(path, BatchReduceGemm{g.shape.m, g.shape.n,
                                       g.shape.transpose_a,
                                       g.shape.transpose_b, &term, 1, g.lda,
                                       g.ldb, g.alpha, g.beta, g.c, g.ldc});
}

// Rows [begin, end) of c, with the rows of op(a) they need.
StridedGemm Rows(const StridedGemm& g, int64_t begin, int64_t end) {
  StridedGemm r = g;
  r.shape.m = end - begin;
  r.a += g.shape.transpose_a ? begin : begin * g.lda;
  r.c += begin * g.ldc;
  return r;
}

// Columns [begin, end) of c, with the columns of op(b) they need.
StridedGemm Cols(const StridedGemm& g, int64_t begin, int64_t end) {
  StridedGemm r = g;
  r.shape.n = end - begin;
  r.b += g.shape.transpose_b ? begin * g.ldb : begin;
  r.c += begin;
  return r;
}

void CheckShape(const MatMulShape& s) {
  CHECK(s.m >= 0 && s.n >= 0 && s.k >= 0)
      << "negative GEMM dimension: m=" << s.m << " n=" << s.n << " k=" << s.k;
}

// The GEMM of ops.h's contract: operands stored densely.
StridedGemm WholeGemm(const MatMulShape& s, float alpha, const float* a,
                      const float* b, float beta, float* c) {
  return StridedGemm{s,    alpha, a, s.transpose_a ? s.m : s.k,
                     b,    s.transpose_b ? s.k : s.n,
                     beta, c,     s.n};
}

void CheckSupported(GemmPath path) {
  CHECK(GemmPathSupported(path))
      << "GEMM path " << static_cast<int>(path) << " is not supported here";
}

}  // namespace

bool GemmPathSupported(GemmPath path) {
  switch (path) {
    case GemmPath::kPortable:
      return true;
    case GemmPath::kAvx512:
      return internal::Avx512GemmSupported();
    case GemmPath::kAvx2:
      return internal::Avx2GemmSupported();
  }
  return false;
}

const char* GemmPathName(GemmPath path) {
  switch (path) {
    case GemmPath::kPortable:
      return "portable";
    case GemmPath::kAvx512:
      return "avx512";
    case GemmPath::kAvx2:
      return "avx2";
  }
  return "?";
}

GemmPath BestGemmPath() {
  static const GemmPath best = [] {
    if (const char* forced = std::getenv("PSRT_GEMM_PATH")) {
      for (GemmPath path : {GemmPath::kPortable, GemmPath::kAvx2, GemmPath::kAvx512}) {
        if (std::strcmp(forced, GemmPathName(path)) != 0) continue;
        CHECK(GemmPathSupported(path))
            << "PSRT_GEMM_PATH=" << forced << ": this CPU cannot run that path";
        return path;
      }
      LOG(FATAL) << "PSRT_GEMM_PATH=" << forced << " is not portable, avx2 or avx512";
    }
    for (GemmPath path : {GemmPath::kAvx512, GemmPath::kAvx2}) {
      if (GemmPathSupported(path)) return path;
    }
    return GemmPath::kPortable;
  }();
  return best;
}

void StridedGemmOnPath(GemmPath path, const StridedGemm& gemm) {
  CheckSupported(path);
  CheckShape(gemm.shape);
  if (gemm.shape.m == 0 || gemm.shape.n == 0) return;
  RunBlock(path, gemm);
}

void StridedGemmOnCallingThread(const StridedGemm& gemm) {
  StridedGemmOnPath(BestGemmPath(), gemm);
}

void BatchReduceGemmOnPath(GemmPath path, const BatchReduceGemm& gemm) {
  CheckSupported(path);
  CHECK(gemm.m >= 0 && gemm.n >= 0 && gemm.count >= 0)
      << "negative batch-reduce GEMM dimension: m=" << gemm.m
      << " n=" << gemm.n << " count=" << gemm.count;
  for (int64_t i = 0; i < gemm.count; ++i) {
    CHECK_GE(gemm.terms[i].k, 0) << "term " << i;
  }
  if (gemm.m == 0 || gemm.n == 0) return;
  RunBatchReduce(path, gemm);
}

void BatchReduceGemmOnCallingThread(const BatchReduceGemm& gemm) {
  BatchReduceGemmOnPath(BestGemmPath(), gemm);
}

void GemmOnCallingThreadOnPath(GemmPath path, const MatMulShape& shape,
                               float alpha, const float* a, const float* b,
                               float beta, float* c) {
  StridedGemmOnPath(path, WholeGemm(shape, alpha, a, b, beta, c));
}

// Splits c along its larger dimension into one block per thread: column
// blocks of c pair with column blocks of op(b), row blocks with row blocks of
// op(a). Each thread packs what its block needs on its own.
void GemmOnPath(GemmPath path, const CpuContext& ctx, const MatMulShape& shape,
                float alpha, const float* a, const float* b, float beta,
                float* c) {
  CheckSupported(path);
  CheckShape(shape);
  const StridedGemm g = WholeGemm(shape, alpha, a, b, beta, c);
  const int64_t m = shape.m, n = shape.n;
  if (m == 0 || n == 0) return;
  const bool small = m * n * shape.k < kMinParallelGemmWork;
  if (n >= m) {
    const int64_t grain = path == GemmPath::kAvx512 ? internal::kAvx512TileCols
                          : path == GemmPath::kAvx2 ? internal::kAvx2TileCols
                                                    : kEigenGrain;
    ctx.ParallelFor(n, small ? n : grain, [&](int64_t begin, int64_t end) {
      RunBlock(path, Cols(g, begin, end));
    });
  } else {
    const int64_t grain = path == GemmPath::kAvx512 ? internal::kAvx512TileRows
                          : path == GemmPath::kAvx2 ? internal::kAvx2TileRows
                                                    : kEigenGrain;
    ctx.ParallelFor(m, small ? m : grain, [&](int64_t begin, int64_t end) {
      RunBlock(path, Rows(g, begin, end));
    });
  }
}

void Gemm(const CpuContext& ctx, const MatMulShape& shape, float alpha,
          const float* a, const float* b, float beta, float* c) {
  GemmOnPath(BestGemmPath(), ctx, shape, alpha, a, b, beta, c);
}

void GemmOnCallingThread(const MatMulShape& shape, float alpha, const float* a,
                         const float* b, float beta, float* c) {
  GemmOnCallingThreadOnPath(BestGemmPath(), shape, alpha, a, b, beta, c);
}

}  // namespace kernels
}  // namespace psrt
