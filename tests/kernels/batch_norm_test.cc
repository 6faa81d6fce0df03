// Batch norm on the CPU: training statistics and moving averages against
// the definition, inference with the moving statistics, and the training
// backward against central differences (through the batch statistics).
// Layer norm likewise: each row's statistics, and its backward.
#include "kernels/batch_norm.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_context.h"
#include "tests/kernels/gradient_check.h"

namespace psrt {
namespace kernels {
namespace testing {
namespace {

TEST(BatchNormTest, TrainingForwardNormalizesAndUpdatesMovingStatistics) {
  CpuContext ctx(2);
  const BatchNormShape s{50, 3, 1e-3f, 0.9f};
  std::vector<float> x = RandomVector(s.rows * s.channels, 1, -2, 3);
  const std::vector<float> gamma = {1.5f, -0.5f, 2.0f};
  const std::vector<float> beta = {0.1f, 0.2f, -0.3f};
  std::vector<float> moving_mean = {1, 2, 3}, moving_var = {4, 5, 6};
  std::vector<float> mean = Garbage(3), inv_std = Garbage(3);
  std::vector<float> y = Garbage(x.size());
  BatchNormTrainingForward(ctx, s, x.data(), gamma.data(), beta.data(),
                           moving_mean.data(), moving_var.data(), mean.data(),
                           inv_std.data(), y.data());
  for (int64_t c = 0; c < s.channels; ++c) {
    double m = 0, v = 0;
    for (int64_t r = 0; r < s.rows; ++r) m += x[r * s.channels + c];
    m /= s.rows;
    for (int64_t r = 0; r < s.rows; ++r) {
      v += (x[r * s.channels + c] - m) * (x[r * s.channels + c] - m);
    }
    v /= s.rows;
    EXPECT_NEAR(mean[c], m, 1e-6);
    EXPECT_NEAR(inv_std[c], 1 / std::sqrt(v + 1e-3), 1e-5);
    EXPECT_NEAR(moving_mean[c], 0.9 * (c + 1) + 0.1 * m, 1e-5);
    EXPECT_NEAR(moving_var[c], 0.9 * (c + 4) + 0.1 * v * 50 / 49, 1e-5);
    for (int64_t r = 0; r < s.rows; ++r) {
      const int64_t i = r * s.channels + c;
      EXPECT_NEAR(y[i], gamma[c] * (x[i] - m) / std::sqrt(v + 1e-3) + beta[c],
                  1e-5);
    }
  }
  // In place, without moving statistics: the same output.
  std::vector<float> in_place = x;
  BatchNormTrainingForward(ctx, s, in_place.data(), gamma.data(), beta.data(),
                           nullptr, nullptr, mean.data(), inv_std.data(),
                           in_place.data());
  EXPECT_EQ(in_place, y);
}

// Keras 3's moving variance follows the batch's variance itself, without
// Bessel's correction.
TEST(BatchNormTest, MovingVarianceWithoutBesselsCorrection) {
  CpuContext ctx(1);
  const BatchNormShape s{4, 1, 1e-3f, 0.5f, /*bessel=*/false};
  const std::vector<float> x = {1, 2, 3, 6}, gamma = {1}, beta = {0};
  std::vector<float> moving_mean = {0}, moving_var = {1}, mean(1), inv_std(1), y(4);
  BatchNormTrainingForward(ctx, s, x.data(), gamma.data(), beta.data(), moving_mean.data(),
                           moving_var.data(), mean.data(), inv_std.data(), y.data());
  // Mean 3, variance (4 + 1 + 0 + 9) / 4 = 3.5.
  EXPECT_FLOAT_EQ(moving_mean[0], 0.5f * 3);
  EXPECT_FLOAT_EQ(moving_var[0], 0.5f + 0.5f * 3.5f);
}

TEST(BatchNormTest, InferenceUsesMovingStatistics) {
  CpuContext ctx(1);
  const BatchNormShape s{2, 2, 0.01f, 0.99f};
  const float x[] = {1, 2, 3, 4};
  const float gamma[] = {2, 1}, beta[] = {0, 1};
  const float mean[] = {1, 2}, var[] = {3.99f, 0.24f};
  std::vector<float> y = Garbage(4);
  BatchNormInferenceForward(ctx, s, x, gamma, beta, mean, var, y.data());
  // (x - mean) / sqrt(var + 0.01): channel 0 / 2, channel 1 / 0.5.
  EXPECT_THAT(y, Pointwise(FloatNear(1e-6f), std::vector<float>{0, 1, 2, 5}));
}

TEST(BatchNormTest, TrainingGradientMatchesFiniteDifferences) {
  CpuContext ctx(2);
  for (const BatchNormShape s :
       {BatchNormShape{6, 3, 1e-3f, 0.99f}, BatchNormShape{40, 70, 1e-3f}}) {
    std::vector<float> x = RandomVector(s.rows * s.channels, 2, -2, 2);
    std::vector<float> gamma = RandomVector(s.channels, 3, 0.5f, 1.5f);
    std::vector<float> beta = RandomVector(s.channels, 4);
    const std::vector<float> weights = RandomVector(x.size(), 5);
    std::vector<float> mean(s.channels), inv_std(s.channels), y(x.size());
    auto loss = [&] {
      BatchNormTrainingForward(ctx, s, x.data(), gamma.data(), beta.data(),
                               nullptr, nullptr, mean.data(), inv_std.data(),
                               y.data());
      return Dot(y, weights);
    };
    loss();
    std::vector<float> dx = Garbage(x.size()), dgamma = Garbage(s.channels),
                       dbeta = Garbage(s.channels);
    BatchNormTrainingBackward(ctx, s, x.data(), weights.data(), gamma.data(),
                              mean.data(), inv_std.data(), dx.data(),
                              dgamma.data(), dbeta.data());
    ExpectGradientsMatch({&x, &gamma, &beta}, loss, {dx, dgamma, dbeta},
                         /*step=*/1e-2f, /*tolerance=*/3e-3f);
    // dx in place over dy.
    std::vector<float> in_place = weights;
    BatchNormTrainingBackward(ctx, s, x.data(), in_place.data(), gamma.data(),
                              mean.data(), inv_std.data(), in_place.data(),
                              dgamma.data(), dbeta.data());
    EXPECT_THAT(in_place, Pointwise(FloatNear(1e-6f), dx));
  }
}

TEST(LayerNormTest, EachRowIsNormalizedOverItsChannels) {
  CpuContext ctx(2);
  const LayerNormShape s{3, 4, 1e-3f};
  const std::vector<float> x = {1, 2, 3, 4, -1, -1, -1, -1, 10, 0, -10, 4};
  const std::vector<float> gamma = {1, 2, 0.5f, 1}, beta = {0, 1, 0, -1};
  std::vector<float> mean(3), inv_std(3), y(12);
  LayerNormForward(ctx, s, x.data(), gamma.data(), beta.data(), mean.data(), inv_std.data(),
                   y.data());
  for (int64_t r = 0; r < s.rows; ++r) {
    double m = 0, v = 0;
    for (int64_t c = 0; c < 4; ++c) m += x[r * 4 + c] / 4.0;
    for (int64_t c = 0; c < 4; ++c) v += (x[r * 4 + c] - m) * (x[r * 4 + c] - m) / 4.0;
    EXPECT_NEAR(mean[r], m, 1e-6);
    EXPECT_NEAR(inv_std[r], 1 / std::sqrt(v + 1e-3), 1e-5);
    for (int64_t c = 0; c < 4; ++c) {
      EXPECT_NEAR(y[r * 4 + c], gamma[c] * (x[r * 4 + c] - m) / std::sqrt(v + 1e-3) + beta[c],
                  1e-5);
    }
  }
  EXPECT_THAT(std::vector<float>(y.begin() + 4, y.begin() + 8),  // A constant row: beta.
              Pointwise(FloatNear(1e-6f), beta));
}

TEST(LayerNormTest, GradientMatchesFiniteDifferences) {
  CpuContext ctx(2);
  for (const LayerNormShape s : {LayerNormShape{6, 3, 1e-3f}, LayerNormShape{40, 70, 1e-6f}}) {
    std::vector<float> x = RandomVector(s.rows * s.channels, 2, -2, 2);
    std::vector<float> gamma = RandomVector(s.channels, 3, 0.5f, 1.5f);
    std::vector<float> beta = RandomVector(s.channels, 4);
    const std::vector<float> weights = RandomVector(x.size(), 5);
    std::vector<float> mean(s.rows), inv_std(s.rows), y(x.size()), scratch(2 * s.rows);
    auto loss = [&] {
      LayerNormForward(ctx, s, x.data(), gamma.data(), beta.data(), mean.data(),
                       inv_std.data(), y.data());
      return Dot(y, weights);
    };
    loss();
    std::vector<float> dx = Garbage(x.size()), dgamma = Garbage(s.channels),
                       dbeta = Garbage(s.channels);
    LayerNormBackward(ctx, s, x.data(), weights.data(), gamma.data(), mean.data(),
                      inv_std.data(), scratch.data(), dx.data(), dgamma.data(), dbeta.data());
    ExpectGradientsMatch({&x, &gamma, &beta}, loss, {dx, dgamma, dbeta},
                         /*step=*/1e-2f, /*tolerance=*/3e-3f);
    // dx in place over dy.
    std::vector<float> in_place = weights;
    LayerNormBackward(ctx, s, x.data(), in_place.data(), gamma.data(), mean.data(),
                      inv_std.data(), scratch.data(), in_place.data(), dgamma.data(),
                      dbeta.data());
    EXPECT_THAT(in_place, Pointwise(FloatNear(1e-6f), dx));
  }
}

}  // namespace
}  // namespace testing
}  // namespace kernels
}  // namespace psrt
