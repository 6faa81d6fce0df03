// DLRM's dot interaction: the pairs' order and values by hand, and the
// backward against the gradient checker.
#include "kernels/dot_interaction.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_context.h"
#include "tests/kernels/gradient_check.h"

namespace psrt {
namespace kernels {
namespace testing {
namespace {

TEST(DotInteractionTest, TheLowerTriangleOfEachSamplesGramMatrix) {
  CpuContext ctx(2);
  // Two samples of three 2-d vectors.
  const std::vector<float> features = {1, 0, 0, 2, 3, 4,    // a, b, c
                                       1, 1, -1, 1, 2, 5};  // d, e, f
  std::vector<float> out = Garbage(2 * 3);
  DotInteractionForward(ctx, features.data(), 2, 3, 2, out.data());
  // (b.a, c.a, c.b), then (e.d, f.d, f.e).
  EXPECT_THAT(out, ElementsAre(0, 3, 8, 0, 7, 3));
  EXPECT_EQ(DotInteractionPairs(27), 351);  // DLRM on Criteo: 26 fields + the dense vector.
}

TEST(DotInteractionTest, BackwardMatchesFiniteDifferences) {
  CpuContext ctx(2);
  const int64_t batch = 3, n = 5, dim = 4;
  std::vector<float> features = RandomVector(batch * n * dim, 1);
  const std::vector<float> weights = RandomVector(batch * DotInteractionPairs(n), 2);
  std::vector<float> out(weights.size());
  auto loss = [&] {
    DotInteractionForward(ctx, features.data(), batch, n, dim, out.data());
    return Dot(out, weights);
  };
  std::vector<float> dfeatures = Garbage(features.size());
  DotInteractionBackward(ctx, features.data(), weights.data(), batch, n, dim, dfeatures.data());
  ExpectGradientsMatch({&features}, loss, {dfeatures});
}

}  // namespace
}  // namespace testing
}  // namespace kernels
}  // namespace psrt
