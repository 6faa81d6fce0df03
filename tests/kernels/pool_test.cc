// Max, average and global average pooling on the CPU: forward values
// against the definition and hand-computed examples (TensorFlow's SAME
// padding skips padded cells), backward against central differences.
#include "kernels/pool.h"

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_context.h"
#include "kernels/window.h"
#include "tests/kernels/gradient_check.h"

namespace psrt {
namespace kernels {
namespace testing {
namespace {

Pool2DShape Shape(int64_t batch, int64_t h, int64_t w, int64_t c, int64_t k,
                  int64_t stride, Padding padding) {
  return Pool2DShape{batch, h, w, c, k, k, stride, stride, padding};
}

// The definition: max or mean over the window's valid cells.
std::vector<float> NaivePool(const Pool2DShape& s, const std::vector<float>& x,
                             bool max) {
  std::vector<float> y(s.output_size());
  const int64_t oh_size = s.out_height(), ow_size = s.out_width();
  for (int64_t n = 0; n < s.batch; ++n)
    for (int64_t oh = 0; oh < oh_size; ++oh)
      for (int64_t ow = 0; ow < ow_size; ++ow)
        for (int64_t c = 0; c < s.channels; ++c) {
          double acc = max ? -std::numeric_limits<double>::infinity() : 0;
          int count = 0;
          for (int64_t kh = 0; kh < s.window_height; ++kh)
            for (int64_t kw = 0; kw < s.window_width; ++kw) {
              const int64_t h = oh * s.stride_height - s.pad_top() + kh;
              const int64_t w = ow * s.stride_width - s.pad_left() + kw;
              if (h < 0 || h >= s.in_height || w < 0 || w >= s.in_width) {
                continue;
              }
              const float v =
                  x[((n * s.in_height + h) * s.in_width + w) * s.channels + c];
              acc = max ? std::max<double>(acc, v) : acc + v;
              ++count;
            }
          y[((n * oh_size + oh) * ow_size + ow) * s.channels + c] =
              max ? acc : acc / count;
        }
  return y;
}

struct PoolCase {
  std::string name;
  Pool2DShape shape;
};

std::vector<PoolCase> Cases() {
  return {
      {"Valid2x2Stride2", Shape(2, 4, 6, 3, 2, 2, Padding::kValid)},
      {"Same2x2Stride2Odd", Shape(2, 5, 5, 2, 2, 2, Padding::kSame)},
      {"Same3x3Stride1", Shape(2, 5, 4, 3, 3, 1, Padding::kSame)},
      {"Same3x3Stride2", Shape(1, 7, 6, 2, 3, 2, Padding::kSame)},
      {"Valid3x3Stride2", Shape(2, 7, 9, 2, 3, 2, Padding::kValid)},
      // Channels past a vector of 8 (with AVX; 4 without), routed
      // together, plus a remainder:
      // windows that tile the image, that leave cells uncovered, and that
      // overlap.
      {"Same2x2Stride2Channels11", Shape(2, 5, 6, 11, 2, 2, Padding::kSame)},
      {"Valid2x2Stride2Leftover", Shape(1, 5, 5, 9, 2, 2, Padding::kValid)},
      {"Same3x3Stride2Channels10", Shape(1, 7, 6, 10, 3, 2, Padding::kSame)},
  };
}

class PoolTest : public ::testing::TestWithParam<PoolCase> {};

TEST_P(PoolTest, ForwardMatchesDefinition) {
  const Pool2DShape& s = GetParam().shape;
  const std::vector<float> x = RandomVector(s.input_size(), 1);
  for (int threads : {1, 3}) {
    CpuContext ctx(threads);
    std::vector<float> y = Garbage(s.output_size());
    MaxPoolForward(ctx, s, x.data(), y.data());
    EXPECT_THAT(y, Pointwise(FloatNear(0), NaivePool(s, x, true)));
    AvgPoolForward(ctx, s, x.data(), y.data());
    EXPECT_THAT(y, Pointwise(FloatNear(1e-6f), NaivePool(s, x, false)));
  }
}

TEST_P(PoolTest, MaxPoolGradientMatchesFiniteDifferences) {
  const Pool2DShape& s = GetParam().shape;
  CpuContext ctx(2);
  // Distinct values at least 0.02 apart, so that a step of 1e-3 never
  // changes which cell is a window's max.
  std::vector<float> x(s.input_size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.02f * ((i * 37) % x.size());
  std::vector<float> weights = RandomVector(s.output_size(), 2);
  std::vector<float> y(s.output_size());
  auto loss = [&] {
    MaxPoolForward(ctx, s, x.data(), y.data());
    return Dot(y, weights);
  };
  loss();
  std::vector<float> dx = Garbage(x.size());
  MaxPoolBackward(ctx, s, x.data(), y.data(), weights.data(), dx.data());
  ExpectGradientsMatch({&x}, loss, {dx}, /*step=*/1e-3f);
}

TEST_P(PoolTest, AvgPoolGradientMatchesFiniteDifferences) {
  const Pool2DShape& s = GetParam().shape;
  CpuContext ctx(2);
  std::vector<float> x = RandomVector(s.input_size(), 3);
  std::vector<float> weights = RandomVector(s.output_size(), 4);
  std::vector<float> y(s.output_size());
  auto loss = [&] {
    AvgPoolForward(ctx, s, x.data(), y.data());
    return Dot(y, weights);
  };
  std::vector<float> dx = Garbage(x.size());
  AvgPoolBackward(ctx, s, weights.data(), dx.data());
  ExpectGradientsMatch({&x}, loss, {dx});
}

INSTANTIATE_TEST_SUITE_P(Shapes, PoolTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

TEST(PoolValuesTest, SamePaddingSkipsPaddedCells) {
  CpuContext ctx(1);
  // One 3x3 channel, 2x2 window, stride 2, SAME: out 2x2, padding 1 after.
  const Pool2DShape s = Shape(1, 3, 3, 1, 2, 2, Padding::kSame);
  const float x[] = {-1, -2, -3,  //
                     -4, -5, -6,  //
                     -7, -8, -9};
  std::vector<float> y = Garbage(4);
  MaxPoolForward(ctx, s, x, y.data());
  EXPECT_THAT(y, ElementsAre(-1, -3, -7, -9));  // Never the padding's 0.
  AvgPoolForward(ctx, s, x, y.data());
  EXPECT_THAT(y, ElementsAre(-3, -4.5f, -7.5f, -9));  // Valid cells only.
}

TEST(PoolValuesTest, MaxPoolTiesGoToTheFirstCell) {
  CpuContext ctx(1);
  // 9 channels (a vector of 8 and one more), all cells 0: every channel's
  // gradient goes to the window's first cell. Once with a window that tiles
  // the image, once with overlapping (stride 1) windows.
  for (const Pool2DShape& s : {Shape(1, 2, 2, 9, 2, 2, Padding::kValid),
                               Shape(1, 2, 3, 9, 2, 1, Padding::kValid)}) {
    const std::vector<float> x(s.input_size(), 0.0f);
    std::vector<float> y = Garbage(s.output_size());
    MaxPoolForward(ctx, s, x.data(), y.data());
    const std::vector<float> dy = RandomVector(s.output_size(), 1);
    std::vector<float> dx = Garbage(x.size());
    MaxPoolBackward(ctx, s, x.data(), y.data(), dy.data(), dx.data());
    // Window ow starts at column ow: its first cell is (0, ow).
    std::vector<float> want(x.size(), 0.0f);
    for (int64_t ow = 0; ow < s.out_width(); ++ow) {
      for (int64_t c = 0; c < s.channels; ++c) {
        want[ow * s.channels + c] += dy[ow * s.channels + c];
      }
    }
    EXPECT_THAT(dx, Pointwise(FloatNear(1e-6f), want)) << s.in_width;
  }
}

TEST(PoolValuesTest, OverlappingWindowsSumIntoTheSharedMax) {
  CpuContext ctx(1);
  // 1x3 input, 1x2 windows with stride 1: the middle cell is both maxes.
  const Pool2DShape s{1, 1, 3, 1, 1, 2, 1, 1, Padding::kValid};
  const float x[] = {1, 9, 2};
  std::vector<float> y(2);
  MaxPoolForward(ctx, s, x, y.data());
  EXPECT_THAT(y, ElementsAre(9, 9));
  const float dy[] = {2, 3};
  std::vector<float> dx = Garbage(3);
  MaxPoolBackward(ctx, s, x, y.data(), dy, dx.data());
  EXPECT_THAT(dx, ElementsAre(0, 5, 0));
}

TEST(GlobalAvgPoolTest, ForwardAndGradient) {
  CpuContext ctx(2);
  const int64_t batch = 3, pixels = 5, channels = 4;
  std::vector<float> x = RandomVector(batch * pixels * channels, 5);
  std::vector<float> y = Garbage(batch * channels);
  GlobalAvgPoolForward(ctx, x.data(), batch, pixels, channels, y.data());
  for (int64_t n = 0; n < batch; ++n) {
    for (int64_t c = 0; c < channels; ++c) {
      double sum = 0;
      for (int64_t p = 0; p < pixels; ++p) {
        sum += x[(n * pixels + p) * channels + c];
      }
      EXPECT_NEAR(y[n * channels + c], sum / pixels, 1e-6);
    }
  }
  const std::vector<float> weights = RandomVector(batch * channels, 6);
  auto loss = [&] {
    GlobalAvgPoolForward(ctx, x.data(), batch, pixels, channels, y.data());
    return Dot(y, weights);
  };
  std::vector<float> dx = Garbage(x.size());
  GlobalAvgPoolBackward(ctx, weights.data(), batch, pixels, channels,
                        dx.data());
  ExpectGradientsMatch({&x}, loss, {dx});
}

}  // namespace
}  // namespace testing
}  // namespace kernels
}  // namespace psrt
