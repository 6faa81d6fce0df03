// Tests of the CPU ops: forward values against hand-computed examples and
// naive loops, and every backward against central differences (the gradient
// checker of gradient_check.h, after Caffe's: one checker for every op).
#include "kernels/ops.h"

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_context.h"
#include "tests/kernels/gradient_check.h"

namespace psrt {
namespace kernels {
namespace testing {
namespace {

// ---- MatMul ----

// c[m, n] = op(a) op(b) by the definition.
std::vector<float> NaiveMatMul(const MatMulShape& s,
                               const std::vector<float>& a,
                               const std::vector<float>& b) {
  std::vector<float> c(s.m * s.n);
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < s.k; ++p) {
        const float av = s.transpose_a ? a[p * s.m + i] : a[i * s.k + p];
        const float bv = s.transpose_b ? b[j * s.k + p] : b[p * s.n + j];
        sum += double(av) * bv;
      }
      c[i * s.n + j] = static_cast<float>(sum);
    }
  }
  return c;
}

struct TransposeCase {
  bool transpose_a;
  bool transpose_b;
};

class MatMulTest : public ::testing::TestWithParam<TransposeCase> {
 protected:
  MatMulShape Shape(int64_t m, int64_t n, int64_t k) const {
    return {m, n, k, GetParam().transpose_a, GetParam().transpose_b};
  }
};

TEST_P(MatMulTest, MatchesNaiveLoopOnOneThread) {
  CpuContext ctx(1);
  const MatMulShape s = Shape(3, 4, 5);
  const std::vector<float> a = RandomVector(s.m * s.k, 1);
  const std::vector<float> b = RandomVector(s.k * s.n, 2);
  std::vector<float> c = Garbage(s.m * s.n);
  MatMulForward(ctx, s, a.data(), b.data(), c.data());
  EXPECT_THAT(c, Pointwise(FloatNear(1e-5f), NaiveMatMul(s, a, b)));
}

TEST_P(MatMulTest, MatchesNaiveLoopSplitOverThreads) {
  CpuContext ctx(3);
  // Wide (split by columns) and tall (split by rows), both large enough to
  // be split, with sizes that do not divide evenly.
  for (const auto& [m, n, k] : {std::tuple{37, 301, 41}, {299, 45, 39}}) {
    const MatMulShape s = Shape(m, n, k);
    const std::vector<float> a = RandomVector(s.m * s.k, 3);
    const std::vector<float> b = RandomVector(s.k * s.n, 4);
    std::vector<float> c = Garbage(s.m * s.n);
    MatMulForward(ctx, s, a.data(), b.data(), c.data());
    EXPECT_THAT(c, Pointwise(FloatNear(1e-4f), NaiveMatMul(s, a, b)))
        << m << "x" << n << "x" << k;
  }
}

TEST_P(MatMulTest, GradientMatchesFiniteDifferences) {
  CpuContext ctx(2);
  const MatMulShape s = Shape(3, 4, 5);
  std::vector<float> a = RandomVector(s.m * s.k, 5);
  std::vector<float> b = RandomVector(s.k * s.n, 6);
  const std::vector<float> weights = RandomVector(s.m * s.n, 7);
  std::vector<float> c(s.m * s.n);
  auto loss = [&] {
    MatMulForward(ctx, s, a.data(), b.data(), c.data());
    return Dot(c, weights);
  };
  std::vector<float> da = Garbage(a.size()), db = Garbage(b.size());
  MatMulBackward(ctx, s, a.data(), b.data(), weights.data(), da.data(),
                 db.data());
  ExpectGradientsMatch({&a, &b}, loss, {da, db});
}

TEST_P(MatMulTest, BackwardOfLargeShapeMatchesNaiveGradients) {
  CpuContext ctx(3);
  const MatMulShape s = Shape(67, 130, 71);
  const std::vector<float> a = RandomVector(s.m * s.k, 8);
  const std::vector<float> b = RandomVector(s.k * s.n, 9);
  const std::vector<float> dc = RandomVector(s.m * s.n, 10);
  std::vector<float> da = Garbage(a.size()), db = Garbage(b.size());
  MatMulBackward(ctx, s, a.data(), b.data(), dc.data(), da.data(), db.data());
  // d op(a) = dc op(b)^T and d op(b) = op(a)^T dc, stored like a and b.
  std::vector<float> want_da(a.size()), want_db(b.size());
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t p = 0; p < s.k; ++p) {
      double sum = 0;
      for (int64_t j = 0; j < s.n; ++j) {
        sum += double(dc[i * s.n + j]) *
               (s.transpose_b ? b[j * s.k + p] : b[p * s.n + j]);
      }
      (s.transpose_a ? want_da[p * s.m + i] : want_da[i * s.k + p]) = sum;
    }
  }
  for (int64_t p = 0; p < s.k; ++p) {
    for (int64_t j = 0; j < s.n; ++j) {
      double sum = 0;
      for (int64_t i = 0; i < s.m; ++i) {
        sum += double(s.transpose_a ? a[p * s.m + i] : a[i * s.k + p]) *
               dc[i * s.n + j];
      }
      (s.transpose_b ? want_db[j * s.k + p] : want_db[p * s.n + j]) = sum;
    }
  }
  EXPECT_THAT(da, Pointwise(FloatNear(1e-4f), want_da));
  EXPECT_THAT(db, Pointwise(FloatNear(1e-4f), want_db));
}

TEST_P(MatMulTest, BackwardSkipsNullOutputs) {
  CpuContext ctx(1);
  const MatMulShape s = Shape(2, 3, 4);
  const std::vector<float> a = RandomVector(s.m * s.k, 11);
  const std::vector<float> b = RandomVector(s.k * s.n, 12);
  const std::vector<float> dc = RandomVector(s.m * s.n, 13);
  std::vector<float> da(a.size()), db(b.size()), db_only = Garbage(b.size());
  MatMulBackward(ctx, s, a.data(), b.data(), dc.data(), da.data(), db.data());
  MatMulBackward(ctx, s, a.data(), b.data(), dc.data(), nullptr,
                 db_only.data());
  EXPECT_EQ(db_only, db);
}

INSTANTIATE_TEST_SUITE_P(
    AllTransposes, MatMulTest,
    ::testing::Values(TransposeCase{false, false}, TransposeCase{true, false},
                      TransposeCase{false, true}, TransposeCase{true, true}),
    [](const auto& info) {
      return std::string(info.param.transpose_a ? "At" : "A") +
             (info.param.transpose_b ? "Bt" : "B");
    });

TEST(GemmTest, AlphaAndBetaScaleAndAccumulate) {
  CpuContext ctx(1);
  // a = [[1, 2]], b = [[3], [4]]: a b = [[11]].
  const float a[] = {1, 2}, b[] = {3, 4};
  float c = 100;
  Gemm(ctx, {1, 1, 2}, 2.0f, a, b, 0.5f, &c);
  EXPECT_FLOAT_EQ(c, 2 * 11 + 0.5f * 100);
  Gemm(ctx, {1, 1, 2}, 1.0f, a, b, 1.0f, &c);
  EXPECT_FLOAT_EQ(c, 72 + 11);
}

TEST(GemmTest, HandComputedExample) {
  CpuContext ctx(1);
  // [[1, 2, 3], [4, 5, 6]] * [[1, 0], [0, 1], [1, 1]] = [[4, 5], [10, 11]].
  const float a[] = {1, 2, 3, 4, 5, 6}, b[] = {1, 0, 0, 1, 1, 1};
  std::vector<float> c = Garbage(4);
  MatMulForward(ctx, {2, 2, 3}, a, b, c.data());
  EXPECT_THAT(c, ElementsAre(4, 5, 10, 11));
  // a^T a with a stored as [2, 3]: [3, 3] = [[17, 22, 27], [22, 29, 36],
  // [27, 36, 45]].
  std::vector<float> ata = Garbage(9);
  MatMulForward(ctx, {3, 3, 2, true, false}, a, a, ata.data());
  EXPECT_THAT(ata, ElementsAre(17, 22, 27, 22, 29, 36, 27, 36, 45));
  // a a^T: [[14, 32], [32, 77]].
  std::vector<float> aat = Garbage(4);
  MatMulForward(ctx, {2, 2, 3, false, true}, a, a, aat.data());
  EXPECT_THAT(aat, ElementsAre(14, 32, 32, 77));
}

TEST(GemmTest, EmptyInnerDimensionGivesZeros) {
  CpuContext ctx(1);
  std::vector<float> c = Garbage(6);
  MatMulForward(ctx, {2, 3, 0}, nullptr, nullptr, c.data());
  EXPECT_THAT(c, ElementsAre(0, 0, 0, 0, 0, 0));
}

// ---- BiasAdd ----

TEST(BiasAddTest, ForwardAddsBiasToEveryRow) {
  CpuContext ctx(1);
  const float x[] = {1, 2, 3, 4, 5, 6};
  const float bias[] = {10, 20, 30};
  std::vector<float> y = Garbage(6);
  BiasAddForward(ctx, x, bias, 2, 3, y.data());
  EXPECT_THAT(y, ElementsAre(11, 22, 33, 14, 25, 36));
}

TEST(BiasAddTest, ForwardInPlaceOverManyRowsAndThreads) {
  CpuContext ctx(3);
  const int64_t rows = 1000, cols = 77;
  std::vector<float> x = RandomVector(rows * cols, 20);
  const std::vector<float> bias = RandomVector(cols, 21);
  std::vector<float> y = x;
  BiasAddForward(ctx, y.data(), bias.data(), rows, cols, y.data());
  for (int64_t i = 0; i < rows * cols; ++i) {
    ASSERT_EQ(y[i], x[i] + bias[i % cols]) << i;
  }
}

TEST(BiasAddTest, BackwardSumsColumns) {
  CpuContext ctx(1);
  const float dy[] = {1, 2, 3, 4, 5, 6};
  std::vector<float> dbias = Garbage(3);
  BiasAddBackward(ctx, dy, 2, 3, dbias.data());
  EXPECT_THAT(dbias, ElementsAre(5, 7, 9));
}

TEST(BiasAddTest, BackwardOverManyRowsAndThreads) {
  // Columns split between threads in blocks of 16, with a ragged last one.
  CpuContext ctx(3);
  const int64_t rows = 3000, cols = 70;
  const std::vector<float> dy = RandomVector(rows * cols, 25);
  std::vector<double> want(cols, 0.0);
  for (int64_t i = 0; i < rows * cols; ++i) want[i % cols] += dy[i];
  std::vector<float> dbias = Garbage(cols);
  BiasAddBackward(ctx, dy.data(), rows, cols, dbias.data());
  for (int64_t c = 0; c < cols; ++c) EXPECT_NEAR(dbias[c], want[c], 1e-2) << c;
}

TEST(BiasAddTest, GradientMatchesFiniteDifferences) {
  CpuContext ctx(2);
  const int64_t rows = 4, cols = 3;
  std::vector<float> x = RandomVector(rows * cols, 22);
  std::vector<float> bias = RandomVector(cols, 23);
  const std::vector<float> weights = RandomVector(rows * cols, 24);
  std::vector<float> y(rows * cols);
  auto loss = [&] {
    BiasAddForward(ctx, x.data(), bias.data(), rows, cols, y.data());
    return Dot(y, weights);
  };
  std::vector<float> dbias = Garbage(cols);
  BiasAddBackward(ctx, weights.data(), rows, cols, dbias.data());
  // dL/dx is the upstream gradient itself.
  ExpectGradientsMatch({&x, &bias}, loss, {weights, dbias});
}

// ---- Relu ----

TEST(ReluTest, ForwardAndBackwardValues) {
  CpuContext ctx(1);
  const float x[] = {-2, -0.5f, 0, 0.5f, 3};
  std::vector<float> y = Garbage(5);
  ReluForward(ctx, x, 5, y.data());
  EXPECT_THAT(y, ElementsAre(0, 0, 0, 0.5f, 3));
  const float dy[] = {1, 2, 3, 4, 5};
  std::vector<float> dx = Garbage(5);
  ReluBackward(ctx, y.data(), dy, 5, dx.data());
  EXPECT_THAT(dx, ElementsAre(0, 0, 0, 4, 5));
}

TEST(ReluTest, InPlaceOverManyElementsAndThreads) {
  CpuContext ctx(3);
  const int64_t n = 100003;
  const std::vector<float> x = RandomVector(n, 30);
  std::vector<float> y = x;
  ReluForward(ctx, y.data(), n, y.data());
  std::vector<float> d = RandomVector(n, 31);
  const std::vector<float> dy = d;
  ReluBackward(ctx, y.data(), d.data(), n, d.data());
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(y[i], x[i] > 0 ? x[i] : 0.0f) << i;
    ASSERT_EQ(d[i], x[i] > 0 ? dy[i] : 0.0f) << i;
  }
}

TEST(ReluTest, GradientMatchesFiniteDifferences) {
  CpuContext ctx(1);
  const int64_t n = 20;
  std::vector<float> x = RandomVector(n, 32);
  // Keep inputs away from the kink at 0, where the derivative jumps.
  for (float& v : x) v += v >= 0 ? 0.1f : -0.1f;
  const std::vector<float> weights = RandomVector(n, 33);
  std::vector<float> y(n);
  auto loss = [&] {
    ReluForward(ctx, x.data(), n, y.data());
    return Dot(y, weights);
  };
  loss();
  std::vector<float> dx = Garbage(n);
  ReluBackward(ctx, y.data(), weights.data(), n, dx.data());
  ExpectGradientsMatch({&x}, loss, {dx});
}

// ---- CountCorrect ----

TEST(CountCorrectTest, CountsRowsWhoseFirstMaximumIsTheLabel) {
  CpuContext ctx(1);
  const float logits[] = {
      0, 5, 1,  // arg-max 1
      2, 2, 1,  // a tie: the first maximum, 0
      -1, -3, -2,  // arg-max 0
      1, 1, 4,  // arg-max 2
  };
  const int32_t labels[] = {1, 1, 0, 0};
  int32_t correct = -1;
  CountCorrect(ctx, logits, labels, 4, 3, &correct);
  EXPECT_EQ(correct, 2);  // Rows 0 and 2; row 1's tie goes to class 0.
  CountCorrect(ctx, logits, labels, 0, 3, &correct);
  EXPECT_EQ(correct, 0);
}

// ---- SoftmaxCrossEntropy ----

TEST(SoftmaxCrossEntropyTest, KnownValues) {
  CpuContext ctx(1);
  // Uniform logits: -log(1/3). logits [1, 2, 3], label 2:
  // log(e + e^2 + e^3) - 3 = 0.4076059644.
  const float logits[] = {0, 0, 0, 1, 2, 3};
  const int32_t labels[] = {0, 2};
  EXPECT_NEAR(SoftmaxCrossEntropyForward(ctx, logits, labels, 1, 3),
              std::log(3.0), 1e-6);
  EXPECT_NEAR(SoftmaxCrossEntropyForward(ctx, logits + 3, labels + 1, 1, 3),
              0.4076059644, 1e-6);
  // The batch mean of both.
  EXPECT_NEAR(SoftmaxCrossEntropyForward(ctx, logits, labels, 2, 3),
              (std::log(3.0) + 0.4076059644) / 2, 1e-6);

  // d/dlogits = (softmax - onehot) / batch.
  std::vector<float> d = Garbage(6);
  SoftmaxCrossEntropyBackward(ctx, logits, labels, 2, 3, d.data());
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  EXPECT_THAT(d, Pointwise(FloatNear(1e-6f),
                           std::vector<float>{
                               float((1.0 / 3 - 1) / 2), float(1.0 / 6),
                               float(1.0 / 6), float(std::exp(1.0) / z / 2),
                               float(std::exp(2.0) / z / 2),
                               float((std::exp(3.0) / z - 1) / 2)}));
}

TEST(SoftmaxCrossEntropyTest, StableForLargeLogits) {
  CpuContext ctx(1);
  const float logits[] = {1000, 0, -1000};
  const int32_t label = 1;
  EXPECT_NEAR(SoftmaxCrossEntropyForward(ctx, logits, &label, 1, 3), 1000.0,
              1e-3);
  std::vector<float> d = Garbage(3);
  SoftmaxCrossEntropyBackward(ctx, logits, &label, 1, 3, d.data());
  EXPECT_THAT(d, ElementsAre(1, -1, 0));
}

TEST(SoftmaxCrossEntropyTest, BackwardInPlace) {
  CpuContext ctx(1);
  const std::vector<float> logits = RandomVector(12, 40, -3, 3);
  const int32_t labels[] = {0, 3, 1};
  std::vector<float> d(12);
  SoftmaxCrossEntropyBackward(ctx, logits.data(), labels, 3, 4, d.data());
  std::vector<float> in_place = logits;
  SoftmaxCrossEntropyBackward(ctx, in_place.data(), labels, 3, 4,
                              in_place.data());
  EXPECT_EQ(in_place, d);
}

TEST(SoftmaxCrossEntropyTest, GradientMatchesFiniteDifferences) {
  CpuContext ctx(2);
  const int64_t batch = 5, classes = 4;
  std::vector<float> logits = RandomVector(batch * classes, 41, -2, 2);
  const int32_t labels[] = {0, 3, 1, 1, 2};
  auto loss = [&] {
    return double(
        SoftmaxCrossEntropyForward(ctx, logits.data(), labels, batch, classes));
  };
  std::vector<float> d = Garbage(batch * classes);
  SoftmaxCrossEntropyBackward(ctx, logits.data(), labels, batch, classes,
                              d.data());
  // A float loss: a larger step keeps rounding below the tolerance.
  ExpectGradientsMatch({&logits}, loss, {d}, /*step=*/2e-2f,
                       /*tolerance=*/2e-3f);
}

TEST(SoftmaxCrossEntropyDeathTest, LabelOutOfRange) {
  CpuContext ctx(1);
  const float logits[] = {0, 0};
  const int32_t label = 2;
  EXPECT_DEATH(SoftmaxCrossEntropyForward(ctx, logits, &label, 1, 2),
               "label 2 of example 0 is outside \\[0, 2\\)");
}

}  // namespace
}  // namespace testing
}  // namespace kernels
}  // namespace psrt
