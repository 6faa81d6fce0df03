// CPU/GPU parity: every CUDA op against its CPU version, the oracle (after
// ggml's test-backend-ops). Skips itself where there is no GPU (fails under
// PSRT_REQUIRE_GPU=1).
//
// Built only with PSRT_CUDA, linked with psrt_kernels_cuda.
#include "kernels/ops_cuda.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_context.h"
#include "kernels/elementwise.h"
#include "kernels/ops.h"
#include "tests/gpu_test_util.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace psrt {
namespace kernels {
namespace testing {
namespace {

using ::psrt::testing::NearInNorm;

// Relative error in the 2-norm (gpu_test_util.h) of sums in another order.
constexpr double kSumTolerance = 1e-4;

class OpsCudaTest : public CudaParityTest {};

TEST_F(OpsCudaTest, MatMulForwardAndBackward) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const MatMulShape s{37, 53, 29, ta, tb};
      const std::vector<float> a = RandomVector(s.m * s.k, 1);
      const std::vector<float> b = RandomVector(s.k * s.n, 2);
      const std::vector<float> dc = RandomVector(s.m * s.n, 3);
      std::vector<float> c(s.m * s.n), da(a.size()), db(b.size());
      MatMulForward(cpu_, s, a.data(), b.data(), c.data());
      MatMulBackward(cpu_, s, a.data(), b.data(), dc.data(), da.data(),
                     db.data());

      DeviceArray<float> ga(a), gb(b), gdc(dc), gc(c.size()), gda(a.size()),
          gdb(b.size());
      MatMulForward(*gpu_, s, ga.get(), gb.get(), gc.get());
      MatMulBackward(*gpu_, s, ga.get(), gb.get(), gdc.get(), gda.get(),
                     gdb.get());
      Sync();
      const std::string where =
          std::string(ta ? "At" : "A") + (tb ? "Bt" : "B");
      EXPECT_TRUE(NearInNorm(gc.ToHost(), c, kSumTolerance)) << where;
      EXPECT_TRUE(NearInNorm(gda.ToHost(), da, kSumTolerance)) << where;
      EXPECT_TRUE(NearInNorm(gdb.ToHost(), db, kSumTolerance)) << where;
    }
  }
}

TEST_F(OpsCudaTest, BiasAddAndRelu) {
  const int64_t rows = 33, cols = 70, n = rows * cols;
  const std::vector<float> x = RandomVector(n, 4);
  const std::vector<float> bias = RandomVector(cols, 5);
  const std::vector<float> dy = RandomVector(n, 6);
  std::vector<float> y(n), relu(n), drelu(n), dbias(cols);
  BiasAddForward(cpu_, x.data(), bias.data(), rows, cols, y.data());
  BiasAddBackward(cpu_, dy.data(), rows, cols, dbias.data());
  ReluForward(cpu_, y.data(), n, relu.data());
  ReluBackward(cpu_, relu.data(), dy.data(), n, drelu.data());

  DeviceArray<float> gx(x), gbias(bias), gdy(dy), gy(n), grelu(n), gdrelu(n),
      gdbias(cols);
  BiasAddForward(*gpu_, gx.get(), gbias.get(), rows, cols, gy.get());
  BiasAddBackward(*gpu_, gdy.get(), rows, cols, gdbias.get());
  ReluForward(*gpu_, gy.get(), n, grelu.get());
  ReluBackward(*gpu_, grelu.get(), gdy.get(), n, gdrelu.get());
  Sync();
  EXPECT_EQ(gy.ToHost(), y);
  EXPECT_TRUE(NearInNorm(gdbias.ToHost(), dbias, kSumTolerance));
  EXPECT_EQ(grelu.ToHost(), relu);
  EXPECT_EQ(gdrelu.ToHost(), drelu);
}

TEST_F(OpsCudaTest, SoftmaxCrossEntropy) {
  const int64_t batch = 300, classes = 10;
  const std::vector<float> logits = RandomVector(batch * classes, 7);
  std::vector<int32_t> labels(batch);
  for (int64_t i = 0; i < batch; ++i) labels[i] = (i * 7) % classes;
  const float loss = SoftmaxCrossEntropyForward(cpu_, logits.data(),
                                                labels.data(), batch, classes);
  std::vector<float> d(batch * classes);
  SoftmaxCrossEntropyBackward(cpu_, logits.data(), labels.data(), batch,
                              classes, d.data());

  DeviceArray<float> glogits(logits), gloss(1), gd(d.size());
  DeviceArray<int32_t> glabels(labels);
  SoftmaxCrossEntropyForward(*gpu_, glogits.get(), glabels.get(), batch,
                             classes, gloss.get());
  SoftmaxCrossEntropyBackward(*gpu_, glogits.get(), glabels.get(), batch,
                              classes, gd.get());
  Sync();
  // The loss is 300 positive rows added by float atomics in any order:
  // at most 300 roundings of 6e-8 each.
  EXPECT_TRUE(NearInNorm(gloss.ToHost(), {loss}, kSumTolerance));
  EXPECT_TRUE(NearInNorm(gd.ToHost(), d, kSumTolerance));
}

TEST_F(OpsCudaTest, CountCorrectAndFill) {
  const int64_t batch = 1000, classes = 10;
  const std::vector<float> logits = RandomVector(batch * classes, 11);
  std::vector<int32_t> labels(batch);
  for (int64_t i = 0; i < batch; ++i) labels[i] = (i * 3) % classes;
  int32_t correct = -1;
  CountCorrect(cpu_, logits.data(), labels.data(), batch, classes, &correct);
  ASSERT_GT(correct, 0);  // About a tenth of random rows are right.

  DeviceArray<float> glogits(logits), gfilled(257);
  DeviceArray<int32_t> glabels(labels), gcorrect(1);
  CountCorrect(*gpu_, glogits.get(), glabels.get(), batch, classes,
               gcorrect.get());
  Fill(*gpu_, 2.5f, gfilled.get(), 257);
  Sync();
  EXPECT_EQ(gcorrect.ToHost()[0], correct);
  EXPECT_THAT(gfilled.ToHost(), ::testing::Each(2.5f));
}

TEST_F(OpsCudaTest, OptimizerUpdates) {
  const int64_t n = 100001;
  const std::vector<float> grad = RandomVector(n, 8);
  std::vector<float> var = RandomVector(n, 9), accum = RandomVector(n, 10);
  DeviceArray<float> ggrad(grad), gvar(var), gaccum(accum);
  ApplySgd(0.1f, grad, absl::MakeSpan(var));
  ApplyMomentum(0.1f, 0.9f, grad, absl::MakeSpan(accum), absl::MakeSpan(var));
  Accumulate(grad, absl::MakeSpan(accum));
  Scale(0.5f, absl::MakeSpan(accum));
  ApplySgd(*gpu_, 0.1f, ggrad.get(), gvar.get(), n);
  ApplyMomentum(*gpu_, 0.1f, 0.9f, ggrad.get(), gaccum.get(), gvar.get(), n);
  Accumulate(*gpu_, ggrad.get(), gaccum.get(), n);
  Scale(*gpu_, 0.5f, gaccum.get(), n);
  Sync();
  // The same functors: the same floats, up to fused multiply-adds.
  EXPECT_THAT(gvar.ToHost(), Pointwise(FloatNear(1e-6f), var));
  EXPECT_THAT(gaccum.ToHost(), Pointwise(FloatNear(1e-6f), accum));
}

// Weight decay, clipping by global norm and tower averaging (Axpy): the
// element-wise parts the same floats as the CPU's, the sums in another order.
TEST_F(OpsCudaTest, GradientMath) {
  const int64_t n = 100001;
  constexpr float kWd = 0.01f;
  const std::vector<float> w = RandomVector(n, 11), x = RandomVector(n, 12);
  std::vector<float> g = RandomVector(n, 13), y = RandomVector(n, 14);
  DeviceArray<float> gw(w), gx(x), gg(g), gy(y);
  DeviceArray<double> gsquares(std::vector<double>{0.0}), gnorm2(std::vector<double>{0.0});

  const double penalty = WeightDecay(kWd, w, absl::MakeSpan(g));
  Axpy(0.25f, x, absl::MakeSpan(y));
  const std::vector<absl::Span<float>> tensors = {absl::MakeSpan(g), absl::MakeSpan(y)};
  const double norm = ClipByGlobalNorm(1.0f, tensors);
  ASSERT_GT(norm, 1.0);  // So that it clips.

  WeightDecay(*gpu_, kWd, gw.get(), gg.get(), n, gsquares.get());
  Axpy(*gpu_, 0.25f, gx.get(), gy.get(), n);
  SumOfSquares(*gpu_, gg.get(), n, gnorm2.get());
  SumOfSquares(*gpu_, gy.get(), n, gnorm2.get());
  ClipByNorm(*gpu_, 1.0f, gnorm2.get(), gg.get(), n);
  ClipByNorm(*gpu_, 1.0f, gnorm2.get(), gy.get(), n);
  Sync();
  EXPECT_NEAR(0.5 * kWd * gsquares.ToHost()[0], penalty, kSumTolerance * penalty);
  EXPECT_NEAR(std::sqrt(gnorm2.ToHost()[0]), norm, kSumTolerance * norm);
  const std::vector<float> gpu_g = gg.ToHost(), gpu_y = gy.ToHost();
  EXPECT_TRUE(NearInNorm(gpu_g.data(), g.data(), n, kSumTolerance));
  EXPECT_TRUE(NearInNorm(gpu_y.data(), y.data(), n, kSumTolerance));
}

}  // namespace
}  // namespace testing
}  // namespace kernels
}  // namespace psrt
