// Deduplicate, and the embedding bag's forward (sums of rows) and backward
// (a scatter-add per distinct id), with the gradient checker.
#include "kernels/embedding_bag.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_context.h"
#include "tests/kernels/gradient_check.h"

namespace psrt {
namespace kernels {
namespace testing {
namespace {

TEST(DeduplicateTest, DistinctIdsInFirstSeenOrderAndTheirPositions) {
  UniqueIds out;
  Deduplicate({5, 9, 5, uint64_t{1} << 40, 9}, &out);
  EXPECT_THAT(out.unique, ElementsAre(5, 9, uint64_t{1} << 40));
  EXPECT_THAT(out.index, ElementsAre(0, 1, 0, 2, 1));
  Deduplicate({}, &out);  // Storage reused, contents replaced.
  EXPECT_TRUE(out.unique.empty());
  EXPECT_TRUE(out.index.empty());
}

// Four distinct rows of dim 3; bags {0}, {1, 0, 2}, {}, {2, 2}; row 3 is in
// no bag.
const std::vector<int32_t> kIndex = {0, 1, 0, 2, 2, 2};
const std::vector<int64_t> kOffsets = {0, 1, 4, 4, 6};

TEST(EmbeddingBagTest, ForwardSumsEachBagsRows) {
  CpuContext ctx(2);
  const std::vector<float> rows = {1, 2, 3, 10, 20, 30, 100, 200, 300, 7, 7, 7};
  std::vector<float> out = Garbage(4 * 3);
  EmbeddingBagForward(ctx, rows.data(), 3, kIndex, kOffsets, out.data());
  EXPECT_THAT(out, ElementsAre(1, 2, 3,           // {0}
                               111, 222, 333,     // {1, 0, 2}
                               0, 0, 0,           // {}
                               200, 400, 600));   // {2, 2}
}

TEST(EmbeddingBagTest, BackwardMatchesFiniteDifferences) {
  CpuContext ctx(2);
  std::vector<float> rows = RandomVector(4 * 3, 1);
  const std::vector<float> weights = RandomVector(4 * 3, 2);
  std::vector<float> out(4 * 3);
  auto loss = [&] {
    EmbeddingBagForward(ctx, rows.data(), 3, kIndex, kOffsets, out.data());
    return Dot(out, weights);
  };
  std::vector<float> drows = Garbage(4 * 3);
  EmbeddingBagBackward(ctx, weights.data(), 3, kIndex, kOffsets, 4, drows.data());
  ExpectGradientsMatch({&rows}, loss, {drows});
  // The row in no bag gets a zero gradient, not what the buffer held.
  EXPECT_THAT(std::vector<float>(drows.begin() + 9, drows.end()), ElementsAre(0, 0, 0));
}

}  // namespace
}  // namespace testing
}  // namespace kernels
}  // namespace psrt
