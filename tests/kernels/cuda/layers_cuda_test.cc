// CPU/GPU parity of the layer ops (conv, depthwise conv, pools, batch norm,
// activations, zero padding, concat, dropout, L2 loss): every CUDA op
// against its CPU version, the oracle.
// Skips itself where there is no GPU (fails under PSRT_REQUIRE_GPU=1).
// Built only with PSRT_CUDA.
#include "kernels/layers_cuda.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/activation.h"
#include "kernels/batch_norm.h"
#include "kernels/conv.h"
#include "kernels/cpu_context.h"
#include "kernels/depthwise_conv.h"
#include "kernels/layer_ops.h"
#include "kernels/pool.h"
#include "kernels/workspace.h"
#include "tests/gpu_test_util.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace psrt {
namespace kernels {
namespace testing {
namespace {

// Relative errors in the 2-norm (gpu_test_util.h). Sums of up to 30,720
// products in other orders: about 1e-6 seen on such sums, 1e-4 allowed; a
// wrong index or a lost chunk is an error of order 1.
constexpr double kSumTolerance = 1e-4;

using ::psrt::testing::NearInNorm;

class LayersCudaTest : public CudaParityTest {};

TEST_F(LayersCudaTest, Conv2D) {
  const Conv2DShape shapes[] = {
      {3, 9, 8, 5, 3, 3, 7, 1, 1, Padding::kSame},
      {2, 11, 11, 4, 5, 5, 6, 2, 2, Padding::kSame},
      {2, 10, 9, 3, 3, 3, 4, 2, 2, Padding::kValid},
      {2, 6, 9, 4, 1, 7, 5, 1, 1, Padding::kSame},
      {3, 7, 7, 6, 1, 1, 8, 1, 1, Padding::kSame},
      {100, 14, 14, 32, 5, 5, 64, 1, 1, Padding::kSame},  // LeNet's conv2.
      // A column matrix of 61440 x 576 floats, over the 2^25 of one chunk:
      // the forward and backward run in two chunks of the batch.
      {60, 32, 32, 64, 3, 3, 32, 1, 1, Padding::kSame},
  };
  int i = 0;
  for (const Conv2DShape& s : shapes) {
    const std::vector<float> x = RandomVector(s.input_size(), 1 + i);
    const std::vector<float> f = RandomVector(s.filter_size(), 2 + i);
    const std::vector<float> dy = RandomVector(s.output_size(), 3 + i);
    std::vector<float> y(s.output_size()), dx(x.size()), df(f.size());
    Workspace ws;
    Conv2DForward(cpu_, s, x.data(), f.data(), nullptr, y.data(), &ws);
    Conv2DBackward(cpu_, s, x.data(), f.data(), dy.data(), dx.data(), df.data(),
                   nullptr, &ws);

    CudaWorkspace gws;
    DeviceArray<float> gx(x), gf(f), gdy(dy), gy(y.size()), gdx(x.size()),
        gdf(f.size());
    Conv2DForward(*gpu_, s, gx.get(), gf.get(), gy.get(), &gws);
    Conv2DBackward(*gpu_, s, gx.get(), gf.get(), gdy.get(), gdx.get(),
                   gdf.get(), &gws);
    Sync();
    EXPECT_TRUE(NearInNorm(gy.ToHost(), y, kSumTolerance)) << i;
    EXPECT_TRUE(NearInNorm(gdx.ToHost(), dx, kSumTolerance)) << i;
    EXPECT_TRUE(NearInNorm(gdf.ToHost(), df, kSumTolerance)) << i;
    ++i;
  }
}

TEST_F(LayersCudaTest, Pools) {
  const Pool2DShape shapes[] = {
      {2, 8, 8, 5, 2, 2, 2, 2, Padding::kSame},
      {2, 7, 9, 3, 3, 3, 1, 1, Padding::kSame},
      {2, 9, 9, 4, 3, 3, 2, 2, Padding::kValid},
  };
  int i = 0;
  for (const Pool2DShape& s : shapes) {
    // Ties included (a quarter of the inputs are 0, like ReLU outputs).
    std::vector<float> x = RandomVector(s.input_size(), 10 + i);
    for (float& v : x) v = v < -0.5f ? 0.0f : v;
    const std::vector<float> dy = RandomVector(s.output_size(), 11 + i);
    std::vector<float> max_y(s.output_size()), avg_y(s.output_size()),
        max_dx(x.size()), avg_dx(x.size());
    MaxPoolForward(cpu_, s, x.data(), max_y.data());
    MaxPoolBackward(cpu_, s, x.data(), max_y.data(), dy.data(), max_dx.data());
    AvgPoolForward(cpu_, s, x.data(), avg_y.data());
    AvgPoolBackward(cpu_, s, dy.data(), avg_dx.data());

    DeviceArray<float> gx(x), gdy(dy), gmax_y(max_y.size()),
        gavg_y(avg_y.size()), gmax_dx(x.size()), gavg_dx(x.size());
    MaxPoolForward(*gpu_, s, gx.get(), gmax_y.get());
    MaxPoolBackward(*gpu_, s, gx.get(), gmax_y.get(), gdy.get(), gmax_dx.get());
    AvgPoolForward(*gpu_, s, gx.get(), gavg_y.get());
    AvgPoolBackward(*gpu_, s, gdy.get(), gavg_dx.get());
    Sync();
    EXPECT_EQ(gmax_y.ToHost(), max_y) << i;
    EXPECT_TRUE(NearInNorm(gmax_dx.ToHost(), max_dx, kSumTolerance)) << i;
    EXPECT_TRUE(NearInNorm(gavg_y.ToHost(), avg_y, kSumTolerance)) << i;
    EXPECT_TRUE(NearInNorm(gavg_dx.ToHost(), avg_dx, kSumTolerance)) << i;
    ++i;
  }

  const int64_t batch = 3, pixels = 49, channels = 20;
  const std::vector<float> x = RandomVector(batch * pixels * channels, 20);
  const std::vector<float> dy = RandomVector(batch * channels, 21);
  std::vector<float> y(batch * channels), dx(x.size());
  GlobalAvgPoolForward(cpu_, x.data(), batch, pixels, channels, y.data());
  GlobalAvgPoolBackward(cpu_, dy.data(), batch, pixels, channels, dx.data());
  DeviceArray<float> gx(x), gdy(dy), gy(y.size()), gdx(dx.size());
  GlobalAvgPoolForward(*gpu_, gx.get(), batch, pixels, channels, gy.get());
  GlobalAvgPoolBackward(*gpu_, gdy.get(), batch, pixels, channels, gdx.get());
  Sync();
  EXPECT_TRUE(NearInNorm(gy.ToHost(), y, kSumTolerance));
  EXPECT_TRUE(NearInNorm(gdx.ToHost(), dx, kSumTolerance));
}

TEST_F(LayersCudaTest, BatchNorm) {
  const BatchNormShape s{2000, 37, 1e-3f, 0.9f};
  const int64_t n = s.rows * s.channels;
  const std::vector<float> x = RandomVector(n, 30);
  const std::vector<float> dy = RandomVector(n, 31);
  std::vector<float> gamma = RandomVector(s.channels, 32);
  const std::vector<float> beta = RandomVector(s.channels, 33);
  std::vector<float> mm = RandomVector(s.channels, 34), mv(s.channels, 1.0f);
  std::vector<float> mean(s.channels), inv_std(s.channels), y(n), dx(n),
      dgamma(s.channels), dbeta(s.channels), y_inf(n);
  DeviceArray<float> gx(x), gdy(dy), ggamma(gamma), gbeta(beta), gmm(mm),
      gmv(mv), gmean(s.channels), ginv(s.channels), gy(n), gdx(n),
      gdgamma(s.channels), gdbeta(s.channels), gy_inf(n);
  BatchNormTrainingForward(cpu_, s, x.data(), gamma.data(), beta.data(),
                           mm.data(), mv.data(), mean.data(), inv_std.data(),
                           y.data());
  BatchNormTrainingBackward(cpu_, s, x.data(), dy.data(), gamma.data(),
                            mean.data(), inv_std.data(), dx.data(),
                            dgamma.data(), dbeta.data());
  BatchNormInferenceForward(cpu_, s, x.data(), gamma.data(), beta.data(),
                            mm.data(), mv.data(), y_inf.data());
  BatchNormTrainingForward(*gpu_, s, gx.get(), ggamma.get(), gbeta.get(),
                           gmm.get(), gmv.get(), gmean.get(), ginv.get(),
                           gy.get());
  BatchNormTrainingBackward(*gpu_, s, gx.get(), gdy.get(), ggamma.get(),
                            gmean.get(), ginv.get(), gdx.get(), gdgamma.get(),
                            gdbeta.get());
  BatchNormInferenceForward(*gpu_, s, gx.get(), ggamma.get(), gbeta.get(),
                            gmm.get(), gmv.get(), gy_inf.get());
  Sync();
  EXPECT_TRUE(NearInNorm(gmean.ToHost(), mean, kSumTolerance));
  EXPECT_TRUE(NearInNorm(ginv.ToHost(), inv_std, kSumTolerance));
  EXPECT_TRUE(NearInNorm(gmm.ToHost(), mm, kSumTolerance));
  EXPECT_TRUE(NearInNorm(gmv.ToHost(), mv, kSumTolerance));
  EXPECT_TRUE(NearInNorm(gy.ToHost(), y, kSumTolerance));
  EXPECT_TRUE(NearInNorm(gdbeta.ToHost(), dbeta, kSumTolerance));
  EXPECT_TRUE(NearInNorm(gdgamma.ToHost(), dgamma, kSumTolerance));
  EXPECT_TRUE(NearInNorm(gdx.ToHost(), dx, kSumTolerance));
  EXPECT_TRUE(NearInNorm(gy_inf.ToHost(), y_inf, kSumTolerance));
}

// Layer norm (each row over its channels): forward, statistics and the
// three gradients against the CPU's.
TEST_F(LayersCudaTest, LayerNorm) {
  const LayerNormShape s{2000, 37, 1e-6f};
  const int64_t n = s.rows * s.channels;
  const std::vector<float> x = RandomVector(n, 60);
  const std::vector<float> dy = RandomVector(n, 61);
  const std::vector<float> gamma = RandomVector(s.channels, 62);
  const std::vector<float> beta = RandomVector(s.channels, 63);
  std::vector<float> mean(s.rows), inv_std(s.rows), scratch(2 * s.rows), y(n), dx(n),
      dgamma(s.channels), dbeta(s.channels);
  LayerNormForward(cpu_, s, x.data(), gamma.data(), beta.data(), mean.data(), inv_std.data(),
                   y.data());
  LayerNormBackward(cpu_, s, x.data(), dy.data(), gamma.data(), mean.data(), inv_std.data(),
                    scratch.data(), dx.data(), dgamma.data(), dbeta.data());
  DeviceArray<float> gx(x), gdy(dy), ggamma(gamma), gbeta(beta), gmean(s.rows), ginv(s.rows),
      gscratch(2 * s.rows), gy(n), gdx(n), gdgamma(s.channels), gdbeta(s.channels);
  LayerNormForward(*gpu_, s, gx.get(), ggamma.get(), gbeta.get(), gmean.get(), ginv.get(),
                   gy.get());
  LayerNormBackward(*gpu_, s, gx.get(), gdy.get(), ggamma.get(), gmean.get(), ginv.get(),
                    gscratch.get(), gdx.get(), gdgamma.get(), gdbeta.get());
  Sync();
  EXPECT_TRUE(NearInNorm(gmean.ToHost(), mean, kSumTolerance));
  EXPECT_TRUE(NearInNorm(ginv.ToHost(), inv_std, kSumTolerance));
  EXPECT_TRUE(NearInNorm(gy.ToHost(), y, kSumTolerance));
  EXPECT_TRUE(NearInNorm(gdbeta.ToHost(), dbeta, kSumTolerance));
  EXPECT_TRUE(NearInNorm(gdgamma.ToHost(), dgamma, kSumTolerance));
  EXPECT_TRUE(NearInNorm(gdx.ToHost(), dx, kSumTolerance));
}

// The depthwise convolution (strided and dilated, SAME and VALID, with a
// channel multiplier): forward and both gradients against the CPU's.
TEST_F(LayersCudaTest, DepthwiseConv2D) {
  for (const auto& [stride, dilation, m, padding] :
       {std::tuple<int64_t, int64_t, int64_t, Padding>{1, 1, 1, Padding::kSame},
        {2, 1, 1, Padding::kValid}, {2, 1, 2, Padding::kSame}, {1, 2, 1, Padding::kSame}}) {
    SCOPED_TRACE(::testing::Message() << "stride " << stride << " dilation " << dilation
                                      << " multiplier " << m);
    DepthwiseConv2DShape s;
    s.batch = 3;
    s.in_height = 17;
    s.in_width = 13;
    s.channels = 70;
    s.filter_height = s.filter_width = 3;
    s.multiplier = m;
    s.stride_height = s.stride_width = stride;
    s.dilation_height = s.dilation_width = dilation;
    s.padding = padding;
    const std::vector<float> x = RandomVector(s.input_size(), 93);
    const std::vector<float> filter = RandomVector(s.filter_size(), 94);
    const std::vector<float> dy = RandomVector(s.output_size(), 95);
    std::vector<float> y(s.output_size()), dx(s.input_size()), dfilter(s.filter_size());
    Workspace workspace;
    DepthwiseConv2DForward(cpu_, s, x.data(), filter.data(), y.data());
    DepthwiseConv2DBackward(cpu_, s, x.data(), filter.data(), dy.data(), dx.data(),
                            dfilter.data(), &workspace);
    DeviceArray<float> gx(x), gfilter(filter), gdy(dy), gy(y.size()), gdx(dx.size()),
        gdfilter(dfilter.size());
    DepthwiseConv2DForward(*gpu_, s, gx.get(), gfilter.get(), gy.get(), nullptr);
    DepthwiseConv2DBackward(*gpu_, s, gx.get(), gfilter.get(), gdy.get(), gdx.get(),
                            gdfilter.get(), nullptr);
    Sync();
    EXPECT_TRUE(NearInNorm(gy.ToHost(), y, kSumTolerance));
    EXPECT_TRUE(NearInNorm(gdx.ToHost(), dx, kSumTolerance));
    EXPECT_TRUE(NearInNorm(gdfilter.ToHost(), dfilter, kSumTolerance));
  }
}

// Each activation, forward and backward, against the CPU's: the same
// formulas, with the GPU's own exp, tanh and erf (a few ulps apart).
TEST_F(LayersCudaTest, Activations) {
  const int64_t n = 50001;
  const std::vector<float> x = RandomVector(n, 91, -5, 5);
  const std::vector<float> dy = RandomVector(n, 92);
  ActivationSpec capped;
  capped.max_value = 6;
  capped.negative_slope = 0.2f;
  DeviceArray<float> gx(x), gdy(dy), gy(n), gdx(n);
  for (Activation kind :
       {Activation::kRelu, Activation::kSigmoid, Activation::kTanh, Activation::kSwish,
        Activation::kHardSigmoid, Activation::kHardSwish, Activation::kGelu}) {
    SCOPED_TRACE(static_cast<int>(kind));
    ActivationSpec spec = capped;
    spec.kind = kind;
    std::vector<float> y(n), dx(n);
    ActivationForward(cpu_, spec, x.data(), n, y.data());
    ActivationBackward(cpu_, spec, x.data(), dy.data(), n, dx.data());
    ActivationForward(*gpu_, spec, gx.get(), n, gy.get());
    ActivationBackward(*gpu_, spec, gx.get(), gdy.get(), n, gdx.get());
    Sync();
    EXPECT_TRUE(NearInNorm(gy.ToHost(), y, 1e-6));
    EXPECT_TRUE(NearInNorm(gdx.ToHost(), dx, 1e-6));
  }
}

TEST_F(LayersCudaTest, ChannelAffineAndMultiply) {
  const int64_t pixels = 3 * 21 * 13, channels = 40;
  const std::vector<float> x = RandomVector(pixels * channels, 101);
  const std::vector<float> scale = RandomVector(channels, 102), offset = RandomVector(channels, 103);
  std::vector<float> y(x.size());
  ChannelAffineForward(cpu_, x.data(), scale.data(), offset.data(), pixels, channels, y.data());
  DeviceArray<float> gx(x), gscale(scale), goffset(offset), gy(y.size());
  ChannelAffineForward(*gpu_, gx.get(), gscale.get(), goffset.get(), pixels, channels, gy.get());
  Sync();
  EXPECT_TRUE(NearInNorm(gy.ToHost(), y, 1e-6));
  for (bool broadcast : {true, false}) {
    SCOPED_TRACE(broadcast);
    const MultiplyShape s{3, 21 * 13, channels, broadcast};
    const std::vector<float> b = RandomVector(broadcast ? 3 * channels : x.size(), 104);
    const std::vector<float> dy = RandomVector(x.size(), 105);
    std::vector<float> prod(x.size()), da(x.size()), db(b.size());
    MultiplyForward(cpu_, s, x.data(), b.data(), prod.data());
    MultiplyBackward(cpu_, s, x.data(), b.data(), dy.data(), da.data(), db.data());
    DeviceArray<float> gb(b), gdy(dy), gprod(prod.size()), gda(da.size()), gdb(db.size());
    MultiplyForward(*gpu_, s, gx.get(), gb.get(), gprod.get());
    MultiplyBackward(*gpu_, s, gx.get(), gb.get(), gdy.get(), gda.get(), gdb.get());
    Sync();
    EXPECT_EQ(gprod.ToHost(), prod);  // One product each: bit for bit.
    EXPECT_EQ(gda.ToHost(), da);
    EXPECT_TRUE(NearInNorm(gdb.ToHost(), db, kSumTolerance));
  }
}

TEST_F(LayersCudaTest, ZeroPad2D) {
  const Pad2DShape s{3, 7, 5, 6, 3, 1, 0, 2};
  const std::vector<float> x = RandomVector(s.input_size(), 71);
  const std::vector<float> dy = RandomVector(s.output_size(), 72);
  std::vector<float> y(s.output_size()), dx(s.input_size());
  ZeroPad2DForward(cpu_, s, x.data(), y.data());
  ZeroPad2DBackward(cpu_, s, dy.data(), dx.data());
  DeviceArray<float> gx(x), gdy(dy), gy(y.size()), gdx(dx.size());
  ZeroPad2DForward(*gpu_, s, gx.get(), gy.get());
  ZeroPad2DBackward(*gpu_, s, gdy.get(), gdx.get());
  Sync();
  EXPECT_EQ(gy.ToHost(), y);  // Copies: bit for bit.
  EXPECT_EQ(gdx.ToHost(), dx);
}

TEST_F(LayersCudaTest, ConcatDropoutL2Loss) {
  const int64_t pixels = 333;
  const std::vector<int64_t> channels = {3, 1, 5};
  std::vector<std::vector<float>> xs;
  for (int i = 0; i < 3; ++i)
    xs.push_back(RandomVector(pixels * channels[i], 40 + i));
  std::vector<float> y(pixels * 9);
  const float* inputs[] = {xs[0].data(), xs[1].data(), xs[2].data()};
  ConcatChannelsForward(cpu_, pixels, inputs, channels, y.data());
  DeviceArray<float> g0(xs[0]), g1(xs[1]), g2(xs[2]), gy(y.size());
  const float* ginputs[] = {g0.get(), g1.get(), g2.get()};
  ConcatChannelsForward(*gpu_, pixels, ginputs, channels, gy.get());
  DeviceArray<float> gd0(xs[0].size()), gd2(xs[2].size());
  float* gdinputs[] = {gd0.get(), nullptr, gd2.get()};
  ConcatChannelsBackward(*gpu_, pixels, gy.get(), channels, gdinputs);

  const int64_t n = 100003;
  const std::vector<float> x = RandomVector(n, 50);
  std::vector<float> drop(n), ddrop(n);
  DropoutForward(cpu_, x.data(), n, 0.7f, 99, drop.data());
  DropoutBackward(cpu_, x.data(), n, 0.7f, 99, ddrop.data());
  const float l2 = L2LossForward(cpu_, x.data(), n);
  std::vector<float> dl2(n);
  L2LossBackward(cpu_, x.data(), n, 0.5f, dl2.data());
  DeviceArray<float> gx(x), gdrop(n), gddrop(n), gl2(1), gdl2(n);
  DropoutForward(*gpu_, gx.get(), n, 0.7f, 99, gdrop.get());
  DropoutBackward(*gpu_, gx.get(), n, 0.7f, 99, gddrop.get());
  L2LossForward(*gpu_, gx.get(), n, gl2.get());
  L2LossBackward(*gpu_, gx.get(), n, 0.5f, gdl2.get());
  Sync();
  EXPECT_EQ(gy.ToHost(), y);
  EXPECT_EQ(gd0.ToHost(), xs[0]);
  EXPECT_EQ(gd2.ToHost(), xs[2]);
  EXPECT_EQ(gdrop.ToHost(), drop);  // The same mask, bit for bit.
  EXPECT_EQ(gddrop.ToHost(), ddrop);
  // A draw per example (stochastic depth) and per channel of an example
  // (SpatialDropout2D): 7 examples of 1000 pixels x 13 channels (of x's n).
  for (const DropoutNoise noise : {DropoutNoise{13 * 1000, 0}, DropoutNoise{13 * 1000, 13}}) {
    const int64_t m = 7 * noise.example;
    std::vector<float> y(m), dx(m);
    DropoutForward(cpu_, x.data(), m, 0.6f, 5, y.data(), noise);
    DropoutBackward(cpu_, x.data(), m, 0.6f, 5, dx.data(), noise);
    DeviceArray<float> gy_noise(m), gdx_noise(m);
    DropoutForward(*gpu_, gx.get(), m, 0.6f, 5, gy_noise.get(), noise);
    DropoutBackward(*gpu_, gx.get(), m, 0.6f, 5, gdx_noise.get(), noise);
    Sync();
    EXPECT_EQ(gy_noise.ToHost(), y) << noise.channels;
    EXPECT_EQ(gdx_noise.ToHost(), dx) << noise.channels;
  }
  EXPECT_TRUE(NearInNorm(gl2.ToHost(), {l2}, kSumTolerance));
  EXPECT_EQ(gdl2.ToHost(), dl2);
}

}  // namespace
}  // namespace testing
}  // namespace kernels
}  // namespace psrt
