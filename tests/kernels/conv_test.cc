// Conv2D on the CPU: TensorFlow's SAME/VALID geometry, the forward (with and
// without a bias) against the definition (direct loops), and the backward
// against central differences, over strides, paddings, non-square filters,
// the pointwise (1x1) path, thread counts and every GEMM path (and so every
// method: the direct one or, for stride-1 3x3 and 5x5 layers with 16 or
// more channels each way, Winograd's on the AVX-512 and AVX2 paths; im2col
// on the portable path).
#include "kernels/conv.h"

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/conv_winograd.h"
#include "kernels/cpu_context.h"
#include "kernels/gemm.h"
#include "kernels/window.h"
#include "kernels/workspace.h"
#include "tests/kernels/gradient_check.h"

namespace psrt {
namespace kernels {
namespace testing {
namespace {

TEST(WindowTest, TensorFlowPaddingRules) {
  // SAME: out = ceil(in / stride); the odd padding cell goes after.
  EXPECT_EQ(WindowOutputSize(7, 3, 2, Padding::kSame), 4);
  EXPECT_EQ(WindowPaddingBefore(7, 3, 2, Padding::kSame), 1);  // total 2
  EXPECT_EQ(WindowOutputSize(6, 3, 2, Padding::kSame), 3);
  EXPECT_EQ(WindowPaddingBefore(6, 3, 2, Padding::kSame), 0);  // total 1
  EXPECT_EQ(WindowOutputSize(28, 5, 1, Padding::kSame), 28);
  EXPECT_EQ(WindowPaddingBefore(28, 5, 1, Padding::kSame), 2);
  EXPECT_EQ(WindowOutputSize(28, 2, 2, Padding::kSame), 14);
  EXPECT_EQ(WindowPaddingBefore(28, 2, 2, Padding::kSame), 0);
  // A window larger than the stride's overhang pads nothing.
  EXPECT_EQ(WindowPaddingBefore(5, 1, 3, Padding::kSame), 0);
  // VALID: out = ceil((in - k + 1) / stride), no padding.
  EXPECT_EQ(WindowOutputSize(299, 3, 2, Padding::kValid), 149);
  EXPECT_EQ(WindowOutputSize(7, 3, 2, Padding::kValid), 3);
  EXPECT_EQ(WindowOutputSize(2, 3, 1, Padding::kValid), 0);
  EXPECT_EQ(WindowPaddingBefore(7, 3, 2, Padding::kValid), 0);
}

// y by the definition, in double.
std::vector<float> NaiveConv(const Conv2DShape& s, const std::vector<float>& x,
                             const std::vector<float>& f) {
  const int64_t oh_size = s.out_height(), ow_size = s.out_width();
  std::vector<float> y(s.output_size());
  for (int64_t n = 0; n < s.batch; ++n)
    for (int64_t oh = 0; oh < oh_size; ++oh)
      for (int64_t ow = 0; ow < ow_size; ++ow)
        for (int64_t co = 0; co < s.out_channels; ++co) {
          double sum = 0;
          for (int64_t kh = 0; kh < s.filter_height; ++kh)
            for (int64_t kw = 0; kw < s.filter_width; ++kw) {
              const int64_t h = oh * s.stride_height - s.pad_top() + kh;
              const int64_t w = ow * s.stride_width - s.pad_left() + kw;
              if (h < 0 || h >= s.in_height || w < 0 || w >= s.in_width) {
                continue;
              }
              for (int64_t ci = 0; ci < s.in_channels; ++ci) {
                sum += double(x[((n * s.in_height + h) * s.in_width + w) *
                                    s.in_channels +
                                ci]) *
                       f[((kh * s.filter_width + kw) * s.in_channels + ci) *
                             s.out_channels +
                         co];
              }
            }
          y[((n * oh_size + oh) * ow_size + ow) * s.out_channels + co] = sum;
        }
  return y;
}

// NaiveConv plus bias[c] on every pixel's channel c.
std::vector<float> NaiveConvWithBias(const Conv2DShape& s,
                                     const std::vector<float>& x,
                                     const std::vector<float>& f,
                                     const std::vector<float>& bias) {
  std::vector<float> y = NaiveConv(s, x, f);
  for (size_t i = 0; i < y.size(); ++i) y[i] += bias[i % s.out_channels];
  return y;
}

// The bias gradient by its definition: dy summed over pixels, in double.
std::vector<float> ColumnSums(const std::vector<float>& dy, int64_t channels) {
  std::vector<double> sums(channels);
  for (size_t i = 0; i < dy.size(); ++i) sums[i % channels] += dy[i];
  return std::vector<float>(sums.begin(), sums.end());
}

struct ConvCase {
  std::string name;
  Conv2DShape shape;
};

Conv2DShape Shape(int64_t batch, int64_t h, int64_t w, int64_t c, int64_t fh,
                  int64_t fw, int64_t out, int64_t stride, Padding padding) {
  return Conv2DShape{batch, h, w, c, fh, fw, out, stride, stride, padding};
}

std::vector<ConvCase> Cases() {
  return {
      {"Same3x3", Shape(2, 5, 6, 3, 3, 3, 4, 1, Padding::kSame)},
      {"Same3x3Stride2Odd", Shape(2, 7, 7, 2, 3, 3, 3, 2, Padding::kSame)},
      {"Same3x3Stride2Even", Shape(2, 6, 8, 2, 3, 3, 3, 2, Padding::kSame)},
      {"Valid5x5", Shape(2, 8, 7, 2, 5, 5, 3, 1, Padding::kValid)},
      {"Valid3x3Stride2", Shape(3, 7, 9, 2, 3, 3, 2, 2, Padding::kValid)},
      {"Same1x7", Shape(2, 4, 9, 2, 1, 7, 3, 1, Padding::kSame)},
      {"Same7x1", Shape(2, 9, 4, 2, 7, 1, 3, 1, Padding::kSame)},
      {"Pointwise", Shape(2, 4, 5, 6, 1, 1, 3, 1, Padding::kSame)},
      {"Pointwise1x1Stride2", Shape(2, 5, 5, 3, 1, 1, 2, 2, Padding::kSame)},
      {"FilterLargerThanInputSame",
       Shape(1, 3, 3, 2, 5, 5, 2, 1, Padding::kSame)},
      // More channels: long window rows (fw * in) and non-square filters,
      // for the direct method (the AVX-512 path's, with no column matrix;
      // its backward, dx as a convolution of dy, needs stride 1).
      {"Same5x5Wide", Shape(2, 7, 6, 16, 5, 5, 5, 1, Padding::kSame)},
      {"Same5x5WideBothWays", Shape(2, 7, 6, 16, 5, 5, 13, 1, Padding::kSame)},
      {"Same4x4WideBothWays", Shape(1, 6, 7, 16, 4, 4, 16, 1, Padding::kSame)},
      {"Same3x5WideBothWays", Shape(1, 5, 7, 16, 3, 5, 16, 1, Padding::kSame)},
      {"Valid3x3WideBothWays",
       Shape(2, 6, 8, 24, 3, 3, 22, 1, Padding::kValid)},
      {"Same3x3Stride2Wide", Shape(2, 9, 8, 24, 3, 3, 4, 2, Padding::kSame)},
      {"Valid3x3Stride2Wide",
       Shape(1, 8, 9, 24, 3, 3, 3, 2, Padding::kValid)},
      {"FilterLargerThanInputSameWide",
       Shape(1, 3, 3, 16, 5, 5, 2, 1, Padding::kSame)},
      // 5x5 and 3x3 with 16 or more channels each way: the Winograd method
      // (the blocked paths'), F(4x4, 5x5) and F(4x4, 3x3), with whole and
      // partial 4x4 output tiles and padding that crops the last tiles'
      // windows.
      {"Same5x5Winograd", Shape(2, 7, 8, 16, 5, 5, 20, 1, Padding::kSame)},
      {"Valid5x5Winograd", Shape(1, 8, 9, 17, 5, 5, 16, 1, Padding::kValid)},
      {"FilterLargerThanInputSameWinograd",
       Shape(1, 3, 2, 16, 5, 5, 16, 1, Padding::kSame)},
      {"Same3x3Winograd", Shape(2, 7, 9, 16, 3, 3, 20, 1, Padding::kSame)},
      {"Valid3x3Winograd", Shape(1, 10, 9, 17, 3, 3, 16, 1, Padding::kValid)},
  };
}

// Every case runs on every GEMM path: the AVX-512 and AVX2 paths convolve by
// the direct method, the portable one by im2col.
struct ConvPathCase {
  ConvCase conv;
  GemmPath path;
};

std::vector<ConvPathCase> PathCases() {
  std::vector<ConvPathCase> cases;
  for (const ConvCase& conv : Cases()) {
    for (GemmPath path : {GemmPath::kPortable, GemmPath::kAvx512, GemmPath::kAvx2}) {
      cases.push_back({conv, path});
    }
  }
  return cases;
}

std::string PathName(GemmPath path) {
  return path == GemmPath::kAvx512 ? "Avx512" : path == GemmPath::kAvx2 ? "Avx2" : "Portable";
}

void PrintTo(const ConvPathCase& c, std::ostream* os) {
  *os << c.conv.name << "/" << PathName(c.path);
}

class ConvTest : public ::testing::TestWithParam<ConvPathCase> {
 protected:
  void SetUp() override {
    if (!GemmPathSupported(GetParam().path)) {
      GTEST_SKIP() << "this CPU or build lacks the path";
    }
  }
  void Forward(const CpuContext& ctx, const Conv2DShape& s, const float* x,
               const float* f, const float* b, float* y, Workspace* ws) const {
    internal::Conv2DForwardOnPath(GetParam().path, ctx, s, x, f, b, y, ws);
  }
  void Backward(const CpuContext& ctx, const Conv2DShape& s, const float* x,
                const float* f, const float* dy, float* dx, float* df,
                float* db, Workspace* ws) const {
    internal::Conv2DBackwardOnPath(GetParam().path, ctx, s, x, f, dy, dx, df,
                                   db, ws);
  }
};

TEST_P(ConvTest, ForwardMatchesDefinition) {
  const Conv2DShape& s = GetParam().conv.shape;
  const std::vector<float> x = RandomVector(s.input_size(), 1);
  const std::vector<float> f = RandomVector(s.filter_size(), 2);
  const std::vector<float> b = RandomVector(s.out_channels, 14);
  const std::vector<float> want = NaiveConv(s, x, f);
  const std::vector<float> want_biased = NaiveConvWithBias(s, x, f, b);
  for (int threads : {1, 2, 3}) {
    CpuContext ctx(threads);
    Workspace ws;
    std::vector<float> y = Garbage(s.output_size());
    Forward(ctx, s, x.data(), f.data(), nullptr, y.data(), &ws);
    // Sums of up to 400 products of magnitude ~1, in float: a few ulps of
    // 10 apart from the double-precision definition.
    EXPECT_THAT(y, Pointwise(FloatNear(1e-4f), want)) << threads << " threads";
    Forward(ctx, s, x.data(), f.data(), b.data(), y.data(), &ws);
    EXPECT_THAT(y, Pointwise(FloatNear(1e-4f), want_biased))
        << threads << " threads, with a bias";
  }
}

TEST_P(ConvTest, GradientMatchesFiniteDifferences) {
  const Conv2DShape& s = GetParam().conv.shape;
  CpuContext ctx(2);
  Workspace ws;
  std::vector<float> x = RandomVector(s.input_size(), 3);
  std::vector<float> f = RandomVector(s.filter_size(), 4);
  std::vector<float> b = RandomVector(s.out_channels, 15);
  const std::vector<float> weights = RandomVector(s.output_size(), 5);
  std::vector<float> y(s.output_size());
  auto loss = [&] {
    Forward(ctx, s, x.data(), f.data(), b.data(), y.data(), &ws);
    return Dot(y, weights);
  };
  std::vector<float> dx = Garbage(x.size()), df = Garbage(f.size()),
                     db = Garbage(b.size());
  Backward(ctx, s, x.data(), f.data(), weights.data(), dx.data(), df.data(),
           db.data(), &ws);
  // The loss is linear in each input, so central differences are exact at
  // any step: a long one keeps the forward's rounding (the Winograd
  // method's is several times the direct method's) from swamping them.
  ExpectGradientsMatch({&x, &f, &b}, loss, {dx, df, db}, /*step=*/0.25f);

  // Each output alone gives the same values.
  std::vector<float> dx_only = Garbage(x.size()), df_only = Garbage(f.size()),
                     db_only = Garbage(b.size());
  Backward(ctx, s, x.data(), f.data(), weights.data(), dx_only.data(), nullptr,
           nullptr, &ws);
  Backward(ctx, s, x.data(), f.data(), weights.data(), nullptr, df_only.data(),
           nullptr, &ws);
  Backward(ctx, s, x.data(), f.data(), weights.data(), nullptr, nullptr,
           db_only.data(), &ws);
  EXPECT_THAT(dx_only, Pointwise(FloatNear(1e-6f), dx));
  EXPECT_THAT(df_only, Pointwise(FloatNear(1e-6f), df));
  EXPECT_THAT(db_only, Pointwise(FloatNear(1e-4f), db));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ConvTest, ::testing::ValuesIn(PathCases()),
    [](const ::testing::TestParamInfo<ConvPathCase>& info) {
      return info.param.conv.name + PathName(info.param.path);
    });

class ConvBatchTest : public ::testing::TestWithParam<GemmPath> {
 protected:
  void SetUp() override {
    if (!GemmPathSupported(GetParam())) {
      GTEST_SKIP() << "this CPU or build lacks the path";
    }
  }
  void Forward(const CpuContext& ctx, const Conv2DShape& s, const float* x,
               const float* f, const float* b, float* y, Workspace* ws) const {
    internal::Conv2DForwardOnPath(GetParam(), ctx, s, x, f, b, y, ws);
  }
  void Backward(const CpuContext& ctx, const Conv2DShape& s, const float* x,
                const float* f, const float* dy, float* dx, float* df,
                float* db, Workspace* ws) const {
    internal::Conv2DBackwardOnPath(GetParam(), ctx, s, x, f, dy, dx, df, db,
                                   ws);
  }
  // One thread's results against three threads' and the definition.
  void ExpectBatchMatches(const Conv2DShape& s);
};

// A batch large enough that every thread takes several chunks: LeNet's
// second layer with a few images, and with channels enough for the Winograd
// method (4 tiles an image); and LeNet's two layers at a batch whose outputs
// take one thread several of the 1 MiB blocks that the bias is added to and
// summed from (10 and 20 images), the second in Winograd rounds of 6 images
// (16 tiles each), a block's last round a short one; and a 3x3 layer in
// Winograd rounds of 24 images (4 tiles each).
TEST_P(ConvBatchTest, ChunkedBatchMatchesDefinitionAndGradients) {
  for (const Conv2DShape& s :
       {Shape(7, 14, 14, 8, 5, 5, 6, 1, Padding::kSame),
        Shape(15, 8, 7, 16, 5, 5, 16, 1, Padding::kSame),
        Shape(23, 28, 28, 1, 5, 5, 32, 1, Padding::kSame),
        Shape(23, 14, 14, 32, 5, 5, 64, 1, Padding::kSame),
        Shape(29, 8, 8, 32, 3, 3, 24, 1, Padding::kSame)}) {
    ExpectBatchMatches(s);
  }
}

void ConvBatchTest::ExpectBatchMatches(const Conv2DShape& s) {
  SCOPED_TRACE(::testing::Message() << "input " << s.in_height << "x" << s.in_width
                                    << "x" << s.in_channels);
  const std::vector<float> x = RandomVector(s.input_size(), 6);
  const std::vector<float> f = RandomVector(s.filter_size(), 7);
  const std::vector<float> b = RandomVector(s.out_channels, 16);
  const std::vector<float> dy = RandomVector(s.output_size(), 8);
  CpuContext one(1), three(3);
  Workspace ws1, ws3;
  std::vector<float> y1(s.output_size()), y3(s.output_size());
  Forward(one, s, x.data(), f.data(), b.data(), y1.data(), &ws1);
  Forward(three, s, x.data(), f.data(), b.data(), y3.data(), &ws3);
  const std::vector<float> want = NaiveConvWithBias(s, x, f, b);
  // As ForwardMatchesDefinition's, but for the Winograd method's sums of
  // 800 products: within 1e-5 of the largest output (kernels/conv_winograd.h).
  float largest = 0;
  for (float v : want) largest = std::max(largest, std::abs(v));
  const float tolerance = std::max(1e-4f, 1e-5f * largest);
  EXPECT_THAT(y1, Pointwise(FloatNear(tolerance), want));
  EXPECT_THAT(y3, Pointwise(FloatNear(tolerance), y1));
  std::vector<float> dx1(x.size()), df1(f.size()), db1(b.size()),
      dx3 = Garbage(x.size()), df3 = Garbage(f.size()), db3 = Garbage(b.size());
  Backward(one, s, x.data(), f.data(), dy.data(), dx1.data(), df1.data(),
           db1.data(), &ws1);
  Backward(three, s, x.data(), f.data(), dy.data(), dx3.data(), df3.data(),
           db3.data(), &ws3);
  // Sums of up to 18,000 values of magnitude ~1.
  EXPECT_THAT(db1, Pointwise(FloatNear(1e-2f), ColumnSums(dy, s.out_channels)));
  EXPECT_THAT(db3, Pointwise(FloatNear(1e-2f), db1));
  EXPECT_THAT(dx3, Pointwise(FloatNear(1e-4f), dx1));
  EXPECT_THAT(df3, Pointwise(FloatNear(1e-3f), df1));
}

INSTANTIATE_TEST_SUITE_P(Paths, ConvBatchTest,
                         ::testing::Values(GemmPath::kPortable, GemmPath::kAvx512,
                                           GemmPath::kAvx2),
                         [](const ::testing::TestParamInfo<GemmPath>& info) {
                           return PathName(info.param);
                         });

// Which convolutions the Winograd method takes (the others keep the direct
// method or im2col, which the cases above check against the definition).
TEST(ConvPathTest, WinogradTakesStride1ThreeAndFiveSquareLayersWithChannelsOnBlockedPaths) {
  using internal::WinogradConvApplies;
  const Conv2DShape lenet = Shape(100, 14, 14, 32, 5, 5, 64, 1, Padding::kSame);
  EXPECT_TRUE(WinogradConvApplies(GemmPath::kAvx512, lenet));
  EXPECT_TRUE(WinogradConvApplies(GemmPath::kAvx2, lenet));
  EXPECT_FALSE(WinogradConvApplies(GemmPath::kPortable, lenet));
  // Inception-v3's 5x5 branch at 35x35, and AlexNet's second layer.
  EXPECT_TRUE(WinogradConvApplies(GemmPath::kAvx512,
                                  Shape(32, 35, 35, 48, 5, 5, 64, 1, Padding::kSame)));
  EXPECT_TRUE(WinogradConvApplies(GemmPath::kAvx512,
                                  Shape(32, 27, 27, 64, 5, 5, 192, 1, Padding::kSame)));
  // ResNet-50's 3x3 layers at 224x224, the smallest (7x7: 4 tiles of 36
  // points for 49 outputs of 9 products) too.
  EXPECT_TRUE(WinogradConvApplies(GemmPath::kAvx2,
                                  Shape(8, 56, 56, 64, 3, 3, 64, 1, Padding::kSame)));
  EXPECT_TRUE(WinogradConvApplies(GemmPath::kAvx512,
                                  Shape(8, 7, 7, 512, 3, 3, 512, 1, Padding::kSame)));
  // LeNet's first layer (one channel), a stride, other filter sizes, and a
  // 3x3 layer on a 2x2 image (ResNet-50's last at 64x64: one tile of 36
  // points for 36 direct products).
  EXPECT_FALSE(WinogradConvApplies(GemmPath::kAvx512,
                                   Shape(100, 28, 28, 1, 5, 5, 32, 1, Padding::kSame)));
  EXPECT_FALSE(WinogradConvApplies(GemmPath::kAvx512,
                                   Shape(8, 14, 14, 32, 5, 5, 64, 2, Padding::kSame)));
  EXPECT_FALSE(WinogradConvApplies(GemmPath::kAvx512,
                                   Shape(8, 14, 14, 32, 7, 7, 64, 1, Padding::kSame)));
  EXPECT_FALSE(WinogradConvApplies(GemmPath::kAvx512,
                                   Shape(8, 14, 14, 32, 3, 5, 64, 1, Padding::kSame)));
  EXPECT_FALSE(WinogradConvApplies(GemmPath::kAvx512,
                                   Shape(8, 2, 2, 512, 3, 3, 512, 1, Padding::kSame)));
  // An image whose transformed tiles would not fit a thread's 16 MiB.
  EXPECT_FALSE(WinogradConvApplies(GemmPath::kAvx512,
                                   Shape(8, 224, 224, 32, 5, 5, 32, 1, Padding::kSame)));
}

TEST(ConvPathTest, PublicOpsRunTheBestPath) {
  const Conv2DShape s = Shape(2, 6, 7, 8, 3, 3, 5, 1, Padding::kSame);
  const std::vector<float> x = RandomVector(s.input_size(), 11);
  const std::vector<float> f = RandomVector(s.filter_size(), 12);
  const std::vector<float> dy = RandomVector(s.output_size(), 13);
  CpuContext ctx(2);
  Workspace ws;
  std::vector<float> y(s.output_size()), want_y(s.output_size());
  Conv2DForward(ctx, s, x.data(), f.data(), nullptr, y.data(), &ws);
  internal::Conv2DForwardOnPath(BestGemmPath(), ctx, s, x.data(), f.data(),
                                nullptr, want_y.data(), &ws);
  EXPECT_EQ(y, want_y);
  std::vector<float> dx(x.size()), df(f.size()), want_dx(x.size()),
      want_df(f.size());
  Conv2DBackward(ctx, s, x.data(), f.data(), dy.data(), dx.data(), df.data(),
                 nullptr, &ws);
  internal::Conv2DBackwardOnPath(BestGemmPath(), ctx, s, x.data(), f.data(),
                                 dy.data(), want_dx.data(), want_df.data(),
                                 nullptr, &ws);
  EXPECT_EQ(dx, want_dx);
  EXPECT_EQ(df, want_df);
}

TEST(ConvWorkspaceTest, ReusedWithoutGrowingAfterTheFirstStep) {
  const Conv2DShape s = Shape(4, 9, 9, 3, 3, 3, 5, 1, Padding::kSame);
  const std::vector<float> x = RandomVector(s.input_size(), 9);
  const std::vector<float> f = RandomVector(s.filter_size(), 10);
  const std::vector<float> b = RandomVector(s.out_channels, 17);
  std::vector<float> y(s.output_size()), dx(x.size()), df(f.size()),
      db(b.size());
  CpuContext ctx(2);
  Workspace ws;
  Conv2DForward(ctx, s, x.data(), f.data(), b.data(), y.data(), &ws);
  Conv2DBackward(ctx, s, x.data(), f.data(), y.data(), dx.data(), df.data(),
                 db.data(), &ws);
  const int64_t capacity = ws.capacity();
  EXPECT_GT(capacity, 0);
  Conv2DForward(ctx, s, x.data(), f.data(), b.data(), y.data(), &ws);
  Conv2DBackward(ctx, s, x.data(), f.data(), y.data(), dx.data(), df.data(),
                 db.data(), &ws);
  EXPECT_EQ(ws.capacity(), capacity);
}

TEST(ConvDeathTest, ValidFilterLargerThanInput) {
  CpuContext ctx(1);
  Workspace ws;
  const Conv2DShape s = Shape(1, 2, 2, 1, 3, 3, 1, 1, Padding::kValid);
  float x[4] = {}, f[9] = {}, y[1];
  EXPECT_DEATH(Conv2DForward(ctx, s, x, f, nullptr, y, &ws),
               "VALID window does not fit");
}

}  // namespace
}  // namespace testing
}  // namespace kernels
}  // namespace psrt
