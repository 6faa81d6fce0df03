// Tests of every CPU GEMM path (gemm.h) against a naive double-precision
// reference: shapes that fill no register tile and shapes that need several
// k and column blocks, all four transposes, alpha and beta, NaNs in a c that
// must not be read, and the split over a context's threads. Cases of the
// AVX-512 and AVX2 paths skip themselves on CPUs without them.
#include "kernels/gemm.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu_context.h"
#include "tests/kernels/gradient_check.h"

namespace psrt {
namespace kernels {
namespace testing {
namespace {

struct GemmCase {
  GemmPath path;
  bool transpose_a;
  bool transpose_b;
};

std::string CaseName(const GemmCase& c) {
  return std::string(c.path == GemmPath::kAvx512 ? "Avx512"
                     : c.path == GemmPath::kAvx2 ? "Avx2"
                                                 : "Portable") +
         (c.transpose_a ? "At" : "A") + (c.transpose_b ? "Bt" : "B");
}

void PrintTo(const GemmCase& c, std::ostream* os) { *os << CaseName(c); }

// What c must hold after c = alpha op(a) op(b) + beta c, in double, and the
// scale of each element (the sum of the magnitudes of its terms) that sets
// how much float rounding it may carry.
struct Reference {
  std::vector<double> value;
  std::vector<double> scale;
};

Reference NaiveGemm(const MatMulShape& s, float alpha,
                    const std::vector<float>& a, const std::vector<float>& b,
                    float beta, const std::vector<float>& c) {
  Reference ref{std::vector<double>(s.m * s.n), std::vector<double>(s.m * s.n)};
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      double sum = 0, magnitude = 0;
      for (int64_t p = 0; p < s.k; ++p) {
        const double av = s.transpose_a ? a[p * s.m + i] : a[i * s.k + p];
        const double bv = s.transpose_b ? b[j * s.k + p] : b[p * s.n + j];
        sum += av * bv;
        magnitude += std::abs(av * bv);
      }
      const double old = beta == 0.0f ? 0.0 : double(beta) * c[i * s.n + j];
      ref.value[i * s.n + j] = double(alpha) * sum + old;
      ref.scale[i * s.n + j] = std::abs(double(alpha)) * magnitude +
                               std::abs(old) + 1e-30;
    }
  }
  return ref;
}

std::string ShapeName(const MatMulShape& s, float alpha, float beta) {
  return std::to_string(s.m) + "x" + std::to_string(s.n) + "x" +
         std::to_string(s.k) + " alpha=" + std::to_string(alpha) +
         " beta=" + std::to_string(beta);
}

// Every element within 1e-5 of its scale: float rounding stays orders of
// magnitude below that, while a term dropped or counted twice, for k up to
// tens of thousands, lands above it.
void ExpectNear(const Reference& want, const std::vector<float>& got,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.value.size());
  int reported = 0;
  for (size_t i = 0; i < got.size() && reported < 5; ++i) {
    const double err = std::abs(double(got[i]) - want.value[i]);
    if (!(err <= 1e-5 * want.scale[i])) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i]
                    << ", want " << want.value[i] << " (scale "
                    << want.scale[i] << ")";
      ++reported;
    }
  }
}

class GemmPathTest : public ::testing::TestWithParam<GemmCase> {
 protected:
  void SetUp() override {
    if (!GemmPathSupported(GetParam().path)) {
      GTEST_SKIP() << "this CPU or build lacks the path";
    }
  }

  MatMulShape Shape(int64_t m, int64_t n, int64_t k) const {
    return {m, n, k, GetParam().transpose_a, GetParam().transpose_b};
  }

  // Runs c = alpha op(a) op(b) + beta c on the calling thread (ctx null) or
  // split over ctx, and compares with the reference. With beta == 0, c
  // starts as NaNs, which must not reach the result.
  void Check(const MatMulShape& s, float alpha, float beta,
             const CpuContext* ctx = nullptr) {
    const uint64_t seed = s.m * 1000003 + s.n * 1009 + s.k;
    const std::vector<float> a = RandomVector(s.m * s.k, seed);
    const std::vector<float> b = RandomVector(s.k * s.n, seed + 1);
    std::vector<float> c = beta == 0.0f ? Garbage(s.m * s.n)
                                        : RandomVector(s.m * s.n, seed + 2);
    const Reference want = NaiveGemm(s, alpha, a, b, beta, c);
    if (ctx == nullptr) {
      GemmOnCallingThreadOnPath(GetParam().path, s, alpha, a.data(), b.data(),
                                beta, c.data());
    } else {
      GemmOnPath(GetParam().path, *ctx, s, alpha, a.data(), b.data(), beta,
                 c.data());
    }
    ExpectNear(want, c, ShapeName(s, alpha, beta));
  }
};

TEST_P(GemmPathTest, TinyAndRaggedShapes) {
  // Dimensions of 1, and sizes below, at and past the 12x32 register tile
  // and the 16-wide vectors, so that every edge case of the tile and of the
  // packing runs.
  const int64_t sizes[] = {1, 2, 3, 7, 11, 12, 13, 16, 17, 31, 32, 33, 45};
  for (int64_t m : sizes) {
    for (int64_t n : sizes) {
      for (int64_t k : {1, 5, 16, 17, 40}) Check(Shape(m, n, k), 1.0f, 0.0f);
    }
  }
}

TEST_P(GemmPathTest, ShapesThatNeedSeveralBlocks) {
  // k past one 256-deep block (split into equal blocks), n past one
  // 512-wide column block, op(b) read in place (not transposed, whole
  // 32-column strips, and at most 64 Ki floats or at most 4 row tiles) and
  // packed, row counts that split into unequal tiles, and LeNet-like shapes;
  // many row tiles of a transposed op(a), each packed before its strips,
  // the last one from op(a)'s last rows (a filter gradient's shape).
  for (const auto& [m, n, k] :
       {std::tuple{5, 40, 600}, {30, 600, 70}, {13, 1100, 9}, {61, 64, 801},
        {25, 32, 2000}, {40, 64, 700}, {30, 64, 1500}, {60, 1024, 70},
        {100, 96, 300}, {190, 64, 65}, {1030, 48, 600}}) {
    Check(Shape(m, n, k), 1.0f, 0.0f);
  }
}

TEST_P(GemmPathTest, AlphaAndBeta) {
  for (const auto& [alpha, beta] :
       {std::pair{1.0f, 1.0f}, {2.5f, 0.0f}, {-0.5f, 1.0f}, {1.0f, -2.0f},
        {0.25f, 0.75f}}) {
    Check(Shape(29, 70, 300), alpha, beta);  // Two k blocks: beta once.
    Check(Shape(3, 5, 2), alpha, beta);
  }
}

TEST_P(GemmPathTest, BetaZeroIgnoresNaNsInC) {
  const MatMulShape s = Shape(14, 35, 9);
  const std::vector<float> a = RandomVector(s.m * s.k, 1);
  const std::vector<float> b = RandomVector(s.k * s.n, 2);
  std::vector<float> c = Garbage(s.m * s.n);
  GemmOnCallingThreadOnPath(GetParam().path, s, 1.0f, a.data(), b.data(),
                            0.0f, c.data());
  for (float v : c) ASSERT_TRUE(std::isfinite(v));
}

TEST_P(GemmPathTest, ZeroAlphaOrEmptyKOnlyScalesC) {
  // Neither a nor b may be read: they are NaN here.
  const MatMulShape s = Shape(4, 3, 6);
  const std::vector<float> a = Garbage(s.m * s.k), b = Garbage(s.k * s.n);
  std::vector<float> c(s.m * s.n, 2.0f);
  GemmOnCallingThreadOnPath(GetParam().path, s, 0.0f, a.data(), b.data(),
                            0.5f, c.data());
  EXPECT_THAT(c, ::testing::Each(1.0f));
  GemmOnCallingThreadOnPath(GetParam().path, Shape(4, 3, 0), 1.0f, nullptr,
                            nullptr, 3.0f, c.data());
  EXPECT_THAT(c, ::testing::Each(3.0f));
  c = Garbage(c.size());
  GemmOnCallingThreadOnPath(GetParam().path, s, 0.0f, a.data(), b.data(),
                            0.0f, c.data());
  EXPECT_THAT(c, ::testing::Each(0.0f));
}

TEST_P(GemmPathTest, SplitOverThreadsMatches) {
  CpuContext ctx(3);
  // Wide shapes split by columns, tall ones by rows; both are large enough
  // to be split, with sizes that do not divide evenly; one needs beta.
  Check(Shape(37, 301, 41), 1.0f, 0.0f, &ctx);
  Check(Shape(299, 45, 39), 1.0f, 0.0f, &ctx);
  Check(Shape(121, 700, 300), 0.5f, 1.0f, &ctx);
  Check(Shape(1000, 33, 27), 1.0f, 0.0f, &ctx);
}

// A batch-reduce GEMM against the definition. Terms live in two shared
// buffers at staggered offsets, and rows as stored are lda (ldb) floats
// apart, which may be fewer than a row holds: rows overlap, as when a
// convolution reads its input in place.
struct BatchShape {
  int64_t m, n;
  std::vector<int64_t> ks;
  int64_t lda, ldb;
};

TEST_P(GemmPathTest, BatchReduceSumsItsTerms) {
  const bool ta = GetParam().transpose_a, tb = GetParam().transpose_b;
  const BatchShape shapes[] = {
      {14, 64, {160, 160, 160, 160, 160}, 32, 64},  // Conv forward: overlap.
      {70, 64, std::vector<int64_t>(14, 14), 32, 64},  // Many short terms.
      {9, 45, {300, 0, 7}, 301, 45},  // A long term, an empty one, ragged n.
      {25, 32, {1, 2, 3}, 5, 3},      // Tiny, overlapping both ways.
      {40, 70, {90, 200}, 20, 33},
      {4, 40, {250, 150}, 40, 40},  // Fewer rows than a tile, rows far apart.
  };
  for (const BatchShape& shape : shapes) {
    for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, {0.5f, 2.0f}}) {
      const int64_t m = shape.m, n = shape.n;
      // Term i starts 7 * i floats into a's buffer, 5 * i into b's.
      int64_t a_size = 1, b_size = 1;
      for (size_t i = 0; i < shape.ks.size(); ++i) {
        const int64_t k = std::max<int64_t>(shape.ks[i], 1);
        a_size = std::max(a_size, int64_t(7 * i) + 1 +
                                      (ta ? (k - 1) * shape.lda + m - 1
                                          : (m - 1) * shape.lda + k - 1));
        b_size = std::max(b_size, int64_t(5 * i) + 1 +
                                      (tb ? (n - 1) * shape.ldb + k - 1
                                          : (k - 1) * shape.ldb + n - 1));
      }
      const std::vector<float> a = RandomVector(a_size, 11);
      const std::vector<float> b = RandomVector(b_size, 12);
      std::vector<float> c = beta == 0.0f ? Garbage(m * n)
                                          : RandomVector(m * n, 13);
      std::vector<GemmTerm> terms;
      Reference want{std::vector<double>(m * n), std::vector<double>(m * n)};
      for (size_t t = 0; t < shape.ks.size(); ++t) {
        const float* at = a.data() + 7 * t;
        const float* bt = b.data() + 5 * t;
        const int64_t k = shape.ks[t];
        terms.push_back(GemmTerm{at, bt, k});
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            for (int64_t p = 0; p < k; ++p) {
              const double term =
                  double(ta ? at[p * shape.lda + i] : at[i * shape.lda + p]) *
                  (tb ? bt[j * shape.ldb + p] : bt[p * shape.ldb + j]);
              want.value[i * n + j] += alpha * term;
              want.scale[i * n + j] += std::abs(alpha * term);
            }
          }
        }
      }
      for (int64_t i = 0; i < m * n; ++i) {
        const double old = beta == 0.0f ? 0.0 : double(beta) * c[i];
        want.value[i] += old;
        want.scale[i] += std::abs(old) + 1e-30;
      }
      BatchReduceGemmOnPath(
          GetParam().path,
          BatchReduceGemm{m, n, ta, tb, terms.data(),
                          static_cast<int64_t>(terms.size()), shape.lda,
                          shape.ldb, alpha, beta, c.data(), n});
      ExpectNear(want, c,
                 "batch " + std::to_string(m) + "x" + std::to_string(n) +
                     " terms=" + std::to_string(terms.size()) +
                     " beta=" + std::to_string(beta));
    }
  }
}

TEST(GemmPathSelectionTest, BestPathIsSupportedAndPrefersAvx512ThenAvx2) {
  EXPECT_TRUE(GemmPathSupported(GemmPath::kPortable));
  EXPECT_TRUE(GemmPathSupported(BestGemmPath()));
  if (std::getenv("PSRT_GEMM_PATH") != nullptr) return;  // Chosen by hand.
  if (GemmPathSupported(GemmPath::kAvx512)) {
    EXPECT_EQ(BestGemmPath(), GemmPath::kAvx512);
  } else if (GemmPathSupported(GemmPath::kAvx2)) {
    EXPECT_EQ(BestGemmPath(), GemmPath::kAvx2);
  }
}

TEST(GemmPathSelectionTest, GemmRunsTheBestPath) {
  // Gemm and GemmOnCallingThread (ops.h) give exactly what the best path
  // gives: the same code ran.
  const MatMulShape s{50, 70, 90, true, false};
  const std::vector<float> a = RandomVector(s.m * s.k, 5);
  const std::vector<float> b = RandomVector(s.k * s.n, 6);
  std::vector<float> want(s.m * s.n), got(s.m * s.n), got_parallel(s.m * s.n);
  GemmOnCallingThreadOnPath(BestGemmPath(), s, 1.0f, a.data(), b.data(), 0.0f,
                            want.data());
  GemmOnCallingThread(s, 1.0f, a.data(), b.data(), 0.0f, got.data());
  CpuContext ctx(1);
  Gemm(ctx, s, 1.0f, a.data(), b.data(), 0.0f, got_parallel.data());
  EXPECT_EQ(got, want);
  EXPECT_EQ(got_parallel, want);
}

std::vector<GemmCase> AllCases() {
  std::vector<GemmCase> cases;
  for (GemmPath path : {GemmPath::kPortable, GemmPath::kAvx512, GemmPath::kAvx2}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) cases.push_back({path, ta, tb});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(
    PathsAndTransposes, GemmPathTest, ::testing::ValuesIn(AllCases()),
    [](const ::testing::TestParamInfo<GemmCase>& info) {
      return CaseName(info.param);
    });

}  // namespace
}  // namespace testing
}  // namespace kernels
}  // namespace psrt
