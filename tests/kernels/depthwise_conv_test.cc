// The depthwise convolution on the CPU (depthwise_conv.h): the forward
// against a direct sum (strides, dilation, SAME and VALID, a channel
// multiplier, rectangular filters), both gradients against finite
// differences, and the filter's gradient the same bits with any threads.
#include "kernels/depthwise_conv.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_context.h"
#include "kernels/workspace.h"
#include "tests/kernels/gradient_check.h"

namespace psrt {
namespace kernels {
namespace testing {
namespace {

// y by the definition, in double.
std::vector<float> Reference(const DepthwiseConv2DShape& s, const std::vector<float>& x,
                             const std::vector<float>& filter) {
  std::vector<float> y(s.output_size());
  const int64_t m = s.multiplier, oc_count = s.out_channels();
  for (int64_t n = 0; n < s.batch; ++n) {
    for (int64_t oh = 0; oh < s.out_height(); ++oh) {
      for (int64_t ow = 0; ow < s.out_width(); ++ow) {
        for (int64_t oc = 0; oc < oc_count; ++oc) {
          double sum = 0;
          for (int64_t i = 0; i < s.filter_height; ++i) {
            for (int64_t j = 0; j < s.filter_width; ++j) {
              const int64_t ih = oh * s.stride_height - s.pad_top() + i * s.dilation_height;
              const int64_t iw = ow * s.stride_width - s.pad_left() + j * s.dilation_width;
              if (ih < 0 || ih >= s.in_height || iw < 0 || iw >= s.in_width) continue;
              sum += double(x[((n * s.in_height + ih) * s.in_width + iw) * s.channels + oc / m]) *
                     filter[(i * s.filter_width + j) * oc_count + oc];
            }
          }
          y[((n * s.out_height() + oh) * s.out_width() + ow) * oc_count + oc] =
              static_cast<float>(sum);
        }
      }
    }
  }
  return y;
}

DepthwiseConv2DShape Shape(int64_t fh, int64_t fw, int64_t m, int64_t stride, int64_t dilation,
                           Padding padding) {
  DepthwiseConv2DShape s;
  s.batch = 2;
  s.in_height = 7;
  s.in_width = 6;
  s.channels = 3;
  s.filter_height = fh;
  s.filter_width = fw;
  s.multiplier = m;
  s.stride_height = s.stride_width = stride;
  s.dilation_height = s.dilation_width = dilation;
  s.padding = padding;
  return s;
}

const DepthwiseConv2DShape kShapes[] = {
    Shape(3, 3, 1, 1, 1, Padding::kSame),  Shape(3, 3, 1, 2, 1, Padding::kValid),
    Shape(3, 3, 1, 2, 1, Padding::kSame),  Shape(5, 3, 2, 1, 1, Padding::kSame),
    Shape(3, 3, 1, 1, 2, Padding::kSame),  Shape(2, 2, 3, 2, 1, Padding::kValid)};

TEST(DepthwiseConvTest, ForwardIsTheDirectSum) {
  CpuContext ctx(2);
  for (const DepthwiseConv2DShape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << s.filter_height << "x" << s.filter_width << " m="
                                      << s.multiplier << " stride=" << s.stride_height
                                      << " dilation=" << s.dilation_height);
    const std::vector<float> x = RandomVector(s.input_size(), 1);
    const std::vector<float> filter = RandomVector(s.filter_size(), 2);
    std::vector<float> y = Garbage(s.output_size());
    DepthwiseConv2DForward(ctx, s, x.data(), filter.data(), y.data());
    EXPECT_THAT(y, Pointwise(FloatNear(1e-5f), Reference(s, x, filter)));
  }
}

TEST(DepthwiseConvTest, GradientsMatchFiniteDifferences) {
  CpuContext ctx(3);
  Workspace workspace;
  for (const DepthwiseConv2DShape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << s.filter_height << "x" << s.filter_width << " m="
                                      << s.multiplier << " stride=" << s.stride_height
                                      << " dilation=" << s.dilation_height);
    std::vector<float> x = RandomVector(s.input_size(), 3);
    std::vector<float> filter = RandomVector(s.filter_size(), 4);
    const std::vector<float> weights = RandomVector(s.output_size(), 5);
    std::vector<float> y(s.output_size());
    auto loss = [&] {
      DepthwiseConv2DForward(ctx, s, x.data(), filter.data(), y.data());
      return Dot(y, weights);
    };
    std::vector<float> dx = Garbage(x.size()), dfilter = Garbage(filter.size());
    DepthwiseConv2DBackward(ctx, s, x.data(), filter.data(), weights.data(), dx.data(),
                            dfilter.data(), &workspace);
    ExpectGradientsMatch({&x, &filter}, loss, {dx, dfilter});
    // Without dx, the filter's gradient alone.
    std::vector<float> alone = Garbage(filter.size());
    DepthwiseConv2DBackward(ctx, s, x.data(), filter.data(), weights.data(), nullptr,
                            alone.data(), &workspace);
    EXPECT_EQ(alone, dfilter);
  }
}

// MobileNet's size of channels (over one block of 64) and rows: the
// filter's gradient is the same bits with 1 thread or 4.
TEST(DepthwiseConvTest, FilterGradientIsTheSameWithAnyThreads) {
  DepthwiseConv2DShape s = Shape(3, 3, 1, 1, 1, Padding::kSame);
  s.batch = 3;
  s.in_height = s.in_width = 15;
  s.channels = 96;
  const std::vector<float> x = RandomVector(s.input_size(), 6);
  const std::vector<float> filter = RandomVector(s.filter_size(), 7);
  const std::vector<float> dy = RandomVector(s.output_size(), 8);
  std::vector<float> one(filter.size()), four(filter.size());
  Workspace workspace;
  DepthwiseConv2DBackward(CpuContext(1), s, x.data(), filter.data(), dy.data(), nullptr,
                          one.data(), &workspace);
  DepthwiseConv2DBackward(CpuContext(4), s, x.data(), filter.data(), dy.data(), nullptr,
                          four.data(), &workspace);
  EXPECT_EQ(one, four);
}

}  // namespace
}  // namespace testing
}  // namespace kernels
}  // namespace psrt
