#include "kernels/elementwise.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/functors.h"
#include "tests/kernels/gradient_check.h"

namespace psrt {
namespace kernels {
namespace {

using ::testing::ElementsAre;
using ::testing::FloatEq;

TEST(ApplySgdTest, SubtractsScaledGradient) {
  std::vector<float> var = {1.0f, 2.0f, -3.0f};
  const std::vector<float> grad = {0.5f, -1.0f, 0.0f};
  ApplySgd(0.1f, grad, absl::MakeSpan(var));
  EXPECT_THAT(var, ElementsAre(FloatEq(0.95f), FloatEq(2.1f), FloatEq(-3.0f)));
}

TEST(ApplyMomentumTest, MatchesTensorFlowMomentumOverTwoSteps) {
  // lr 0.1, momentum 0.9, from accum 0:
  //   step 1, grad 1:   accum = 1,                var = 1 - 0.1 * 1 = 0.9
  //   step 2, grad 0.5: accum = 0.9 * 1 + 0.5 = 1.4, var = 0.9 - 0.14 = 0.76
  // Second element, grad -2 then 0: accum -2 then -1.8;
  //   var 0 + 0.2 = 0.2, then 0.2 + 0.18 = 0.38.
  std::vector<float> var = {1.0f, 0.0f};
  std::vector<float> accum = {0.0f, 0.0f};
  ApplyMomentum(0.1f, 0.9f, std::vector<float>{1.0f, -2.0f},
                absl::MakeSpan(accum), absl::MakeSpan(var));
  EXPECT_THAT(accum, ElementsAre(FloatEq(1.0f), FloatEq(-2.0f)));
  EXPECT_THAT(var, ElementsAre(FloatEq(0.9f), FloatEq(0.2f)));
  ApplyMomentum(0.1f, 0.9f, std::vector<float>{0.5f, 0.0f},
                absl::MakeSpan(accum), absl::MakeSpan(var));
  EXPECT_THAT(accum, ElementsAre(FloatEq(1.4f), FloatEq(-1.8f)));
  EXPECT_THAT(var, ElementsAre(FloatEq(0.76f), FloatEq(0.38f)));
}

TEST(AccumulateTest, AddsIntoAccumulator) {
  std::vector<float> acc = {1.0f, 2.0f};
  Accumulate(std::vector<float>{0.5f, -4.0f}, absl::MakeSpan(acc));
  Accumulate(std::vector<float>{0.25f, 1.0f}, absl::MakeSpan(acc));
  EXPECT_THAT(acc, ElementsAre(1.75f, -1.0f));
}

TEST(ScaleTest, MultipliesInPlace) {
  std::vector<float> x = {1.0f, -2.0f, 3.0f};
  Scale(0.5f, absl::MakeSpan(x));
  EXPECT_THAT(x, ElementsAre(0.5f, -1.0f, 1.5f));
}

TEST(ElementwiseDeathTest, SizeMismatch) {
  std::vector<float> var(3);
  EXPECT_DEATH(ApplySgd(0.1f, std::vector<float>(2), absl::MakeSpan(var)), "");
}

TEST(ForEachTest, VisitsEveryIndexInOrder) {
  std::vector<int64_t> seen;
  ForEachIndex(2, 5, [&](int64_t i) { seen.push_back(i); });
  EXPECT_THAT(seen, ElementsAre(2, 3, 4));
  std::vector<std::pair<int64_t, int64_t>> cells;
  ForEachRowCol(1, 3, 2,
                [&](int64_t r, int64_t c) { cells.emplace_back(r, c); });
  EXPECT_THAT(cells, ElementsAre(std::pair<int64_t, int64_t>{1, 0},
                                 std::pair<int64_t, int64_t>{1, 1},
                                 std::pair<int64_t, int64_t>{2, 0},
                                 std::pair<int64_t, int64_t>{2, 1}));
}

TEST(AxpyTest, AddsScaledInput) {
  std::vector<float> y = {1.0f, 2.0f};
  Axpy(0.5f, std::vector<float>{2.0f, -4.0f}, absl::MakeSpan(y));
  EXPECT_THAT(y, ElementsAre(2.0f, 0.0f));
}

TEST(SumOfSquaresTest, AddsToTheSumGiven) {
  const std::vector<float> x = {1.0f, -2.0f, 3.0f};
  EXPECT_EQ(SumOfSquares(x), 14.0);
  EXPECT_EQ(SumOfSquares(x, 0.5), 14.5);
  EXPECT_EQ(SumOfSquares({}), 0.0);
}

TEST(WeightDecayTest, ReturnsThePenaltyAndAddsItsGradient) {
  const std::vector<float> w = {1.0f, -2.0f};
  std::vector<float> g = {0.5f, 0.5f};
  EXPECT_DOUBLE_EQ(WeightDecay(0.1f, w, absl::MakeSpan(g)), 0.5 * 0.1f * 5.0);
  EXPECT_THAT(g, ElementsAre(FloatEq(0.6f), FloatEq(0.3f)));
}

// The penalty's gradient is wd * w: checked against central differences.
TEST(WeightDecayTest, GradientCheck) {
  constexpr float kWd = 0.3f;
  std::vector<float> w = testing::RandomVector(37, 1);
  std::vector<float> analytic(w.size(), 0.0f);
  WeightDecay(kWd, w, absl::MakeSpan(analytic));
  testing::ExpectGradientsMatch({&w}, [&] {
    std::vector<float> scratch(w.size(), 0.0f);
    return WeightDecay(kWd, w, absl::MakeSpan(scratch));
  }, {analytic});
}

TEST(ClipByGlobalNormTest, ScalesAllTensorsDownToTheNormTogether) {
  std::vector<float> a = {3.0f, 0.0f};
  std::vector<float> b = {4.0f};  // Global norm 5.
  const std::vector<absl::Span<float>> tensors = {absl::MakeSpan(a), absl::MakeSpan(b)};
  EXPECT_DOUBLE_EQ(ClipByGlobalNorm(2.5f, tensors), 5.0);
  EXPECT_THAT(a, ElementsAre(FloatEq(1.5f), 0.0f));
  EXPECT_THAT(b, ElementsAre(FloatEq(2.0f)));
  EXPECT_NEAR(ClipByGlobalNorm(2.5f, tensors), 2.5, 1e-6);  // At the norm: kept.
  EXPECT_THAT(a, ElementsAre(FloatEq(1.5f), 0.0f));
}

TEST(ClipByGlobalNormTest, KeepsTensorsWithinTheNorm) {
  std::vector<float> a = {0.3f, -0.4f};
  const std::vector<absl::Span<float>> tensors = {absl::MakeSpan(a)};
  EXPECT_NEAR(ClipByGlobalNorm(1.0f, tensors), 0.5, 1e-7);
  EXPECT_THAT(a, ElementsAre(0.3f, -0.4f));
}

}  // namespace
}  // namespace kernels
}  // namespace psrt
