// Channel concat, zero padding, affine maps, products, dropout and L2 loss
// on the CPU: values and gradients.
#include "kernels/layer_ops.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_context.h"
#include "kernels/layer_functors.h"
#include "tests/kernels/gradient_check.h"

namespace psrt {
namespace kernels {
namespace testing {
namespace {

TEST(ConcatTest, ForwardInterleavesChannelsPerPixel) {
  CpuContext ctx(1);
  const float a[] = {1, 2, 3, 4};        // [2 pixels, 2]
  const float b[] = {10, 20};            // [2 pixels, 1]
  const float c[] = {5, 6, 7, 8, 9, 0};  // [2 pixels, 3]
  std::vector<float> y = Garbage(12);
  const float* inputs[] = {a, b, c};
  const int64_t channels[] = {2, 1, 3};
  ConcatChannelsForward(ctx, 2, inputs, channels, y.data());
  EXPECT_THAT(y, ElementsAre(1, 2, 10, 5, 6, 7, 3, 4, 20, 8, 9, 0));
}

TEST(ConcatTest, GradientSplitsAndSkipsNull) {
  CpuContext ctx(3);
  const int64_t pixels = 3000;
  const std::vector<int64_t> channels = {3, 1, 4};
  std::vector<std::vector<float>> xs;
  for (int i = 0; i < 3; ++i) {
    xs.push_back(RandomVector(pixels * channels[i], 10 + i));
  }
  const std::vector<float> weights = RandomVector(pixels * 8, 20);
  std::vector<float> y(pixels * 8);
  auto loss = [&] {
    const float* inputs[] = {xs[0].data(), xs[1].data(), xs[2].data()};
    ConcatChannelsForward(ctx, pixels, inputs, channels, y.data());
    return Dot(y, weights);
  };
  std::vector<std::vector<float>> dxs;
  for (int i = 0; i < 3; ++i) dxs.push_back(Garbage(xs[i].size()));
  float* dinputs[] = {dxs[0].data(), dxs[1].data(), dxs[2].data()};
  ConcatChannelsBackward(ctx, pixels, weights.data(), channels, dinputs);
  // Concat is a permutation: its gradient is exact; check a small prefix
  // numerically and the rest by value.
  for (int64_t p = 0; p < pixels; ++p) {
    ASSERT_EQ(dxs[1][p], weights[p * 8 + 3]) << p;
    ASSERT_EQ(dxs[2][p * 4 + 3], weights[p * 8 + 7]) << p;
  }
  std::vector<float> head(xs[0].begin(), xs[0].begin() + 30);
  auto head_loss = [&] {
    std::copy(head.begin(), head.end(), xs[0].begin());
    return loss();
  };
  ExpectGradientsMatch(
      {&head}, head_loss,
      {std::vector<float>(dxs[0].begin(), dxs[0].begin() + 30)});
  float* only_middle[] = {nullptr, dxs[1].data(), nullptr};
  ConcatChannelsBackward(ctx, pixels, weights.data(), channels, only_middle);
}

// Keras's ZeroPadding2D((1, 2), (0, 3)) of a 2x2 image of 2 channels.
TEST(ZeroPad2DTest, ForwardPadsAndBackwardCrops) {
  CpuContext ctx(2);
  const Pad2DShape s{1, 2, 2, 2, /*top=*/1, /*bottom=*/2, /*left=*/0, /*right=*/3};
  ASSERT_EQ(s.out_height(), 5);
  ASSERT_EQ(s.out_width(), 5);
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<float> y = Garbage(s.output_size());
  ZeroPad2DForward(ctx, s, x.data(), y.data());
  std::vector<float> want(50, 0.0f);
  for (int h = 0; h < 2; ++h) {
    for (int w = 0; w < 2; ++w) {
      for (int c = 0; c < 2; ++c) want[((h + 1) * 5 + w) * 2 + c] = x[(h * 2 + w) * 2 + c];
    }
  }
  EXPECT_EQ(y, want);
  std::vector<float> dx = Garbage(x.size());
  ZeroPad2DBackward(ctx, s, y.data(), dx.data());
  EXPECT_EQ(dx, x);
}

TEST(ZeroPad2DTest, GradientMatchesFiniteDifferences) {
  CpuContext ctx(3);
  const Pad2DShape s{3, 5, 4, 3, 2, 0, 1, 1};
  std::vector<float> x = RandomVector(s.input_size(), 61);
  const std::vector<float> weights = RandomVector(s.output_size(), 62);
  std::vector<float> y(s.output_size());
  auto loss = [&] {
    ZeroPad2DForward(ctx, s, x.data(), y.data());
    return Dot(y, weights);
  };
  std::vector<float> dx = Garbage(x.size());
  ZeroPad2DBackward(ctx, s, weights.data(), dx.data());
  ExpectGradientsMatch({&x}, loss, {dx});
}

TEST(ChannelAffineTest, ScalesAndShiftsEachChannel) {
  CpuContext ctx(2);
  const std::vector<float> x = {1, 2, 3, 4, 5, 6};  // [3 pixels, 2]
  const float scale[] = {2, -1}, offset[] = {0.5f, 10};
  std::vector<float> y = Garbage(6);
  ChannelAffineForward(ctx, x.data(), scale, offset, 3, 2, y.data());
  EXPECT_THAT(y, ElementsAre(2.5f, 8, 6.5f, 6, 10.5f, 4));
}

// Squeeze-and-excitation's product, b broadcast over each image's pixels,
// and the plain element-wise one: values and both gradients.
TEST(MultiplyTest, BroadcastAndElementWiseGradients) {
  CpuContext ctx(3);
  for (bool broadcast : {true, false}) {
    SCOPED_TRACE(broadcast);
    const MultiplyShape s{3, 10, 7, broadcast};
    const int64_t n = s.batch * s.pixels * s.channels;
    std::vector<float> a = RandomVector(n, 31);
    std::vector<float> b = RandomVector(broadcast ? s.batch * s.channels : n, 32);
    const std::vector<float> weights = RandomVector(n, 33);
    std::vector<float> y(n);
    auto loss = [&] {
      MultiplyForward(ctx, s, a.data(), b.data(), y.data());
      return Dot(y, weights);
    };
    loss();
    const int64_t i = (2 * s.pixels + 4) * s.channels + 5;  // Image 2, pixel 4, channel 5.
    EXPECT_FLOAT_EQ(y[i], a[i] * b[broadcast ? 2 * s.channels + 5 : i]);
    std::vector<float> da = Garbage(a.size()), db = Garbage(b.size());
    MultiplyBackward(ctx, s, a.data(), b.data(), weights.data(), da.data(), db.data());
    ExpectGradientsMatch({&a, &b}, loss, {da, db});
    std::vector<float> db_alone = Garbage(b.size());
    MultiplyBackward(ctx, s, a.data(), b.data(), weights.data(), nullptr, db_alone.data());
    EXPECT_EQ(db_alone, db);
  }
}

TEST(DropoutTest, KeepsAboutKeepProbAndScales) {
  CpuContext ctx(2);
  const int64_t n = 100000;
  const std::vector<float> x(n, 1.0f);
  std::vector<float> y = Garbage(n);
  DropoutForward(ctx, x.data(), n, 0.8f, 42, y.data());
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(y[i] == 0.0f || y[i] == 1.0f / 0.8f) << y[i];
    kept += y[i] != 0.0f;
    ASSERT_EQ(y[i] != 0.0f, functor::DropoutKeep(42, i, 0.8f));
  }
  EXPECT_NEAR(double(kept) / n, 0.8, 0.01);
  // Another seed, another mask; keep_prob 1 is the identity.
  std::vector<float> z(n);
  DropoutForward(ctx, x.data(), n, 0.8f, 43, z.data());
  EXPECT_NE(y, z);
  DropoutForward(ctx, x.data(), n, 1.0f, 43, z.data());
  EXPECT_EQ(z, x);
}

// A draw per example (stochastic depth: noise_shape (None, 1, 1, 1)) and a
// draw per channel of an example (SpatialDropout2D): each kept or dropped
// whole, and about keep_prob of them kept.
TEST(DropoutTest, ADrawPerExampleOrPerChannelOfAnExample) {
  CpuContext ctx(2);
  const int64_t examples = 400, pixels = 6, channels = 5, size = pixels * channels;
  const std::vector<float> x(examples * size, 1.0f);
  std::vector<float> y(x.size());
  for (bool per_channel : {false, true}) {
    SCOPED_TRACE(per_channel);
    const DropoutNoise noise{size, per_channel ? channels : 0};
    DropoutForward(ctx, x.data(), static_cast<int64_t>(x.size()), 0.8f, 5, y.data(), noise);
    int64_t kept = 0, draws = 0;
    for (int64_t n = 0; n < examples; ++n) {
      for (int64_t c = 0; c < (per_channel ? channels : 1); ++c) {
        const float first = y[n * size + c];
        for (int64_t i = c; i < size; i += per_channel ? channels : 1) {
          ASSERT_EQ(y[n * size + i], first) << n << " " << i;
        }
        EXPECT_TRUE(first == 0.0f || first == 1.0f / 0.8f);
        kept += first != 0.0f;
        ++draws;
      }
    }
    EXPECT_NEAR(static_cast<double>(kept) / draws, 0.8, 0.05);
  }
}

TEST(DropoutTest, GradientMatchesFiniteDifferences) {
  CpuContext ctx(1);
  const int64_t n = 50;
  std::vector<float> x = RandomVector(n, 1);
  const std::vector<float> weights = RandomVector(n, 2);
  std::vector<float> y(n);
  auto loss = [&] {
    DropoutForward(ctx, x.data(), n, 0.6f, 7, y.data());
    return Dot(y, weights);
  };
  std::vector<float> dx = Garbage(n);
  DropoutBackward(ctx, weights.data(), n, 0.6f, 7, dx.data());
  ExpectGradientsMatch({&x}, loss, {dx});
}

TEST(L2LossTest, ValueAndGradient) {
  CpuContext ctx(1);
  const float x3[] = {1, 2, 3};
  EXPECT_FLOAT_EQ(L2LossForward(ctx, x3, 3), 7.0f);
  std::vector<float> x = RandomVector(20, 3);
  auto loss = [&] { return 3.0 * L2LossForward(ctx, x.data(), x.size()); };
  std::vector<float> dx = Garbage(20);
  L2LossBackward(ctx, x.data(), x.size(), 3.0f, dx.data());
  ExpectGradientsMatch({&x}, loss, {dx});
}

}  // namespace
}  // namespace testing
}  // namespace kernels
}  // namespace psrt
