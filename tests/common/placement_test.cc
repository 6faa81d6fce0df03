#include "common/placement.h"

#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace psrt {
namespace {

std::vector<VariableDef> MlpVariables() {
  return {{"hidden1/weights", {784, 512}},
          {"hidden1/biases", {512}},
          {"softmax_linear/weights", {512, 10}},
          {"softmax_linear/biases", {10}}};
}

TEST(PlacementTest, RoundRobinWithoutPartitioning) {
  PlacementOptions options;
  options.partition_threshold_bytes = 64 << 20;
  auto placement = ComputePlacement(MlpVariables(), 2, options);
  ASSERT_TRUE(placement.ok()) << placement.status();
  ASSERT_EQ(placement->slices.size(), 4u);
  EXPECT_EQ(placement->slices[0].shard, 0);
  EXPECT_EQ(placement->slices[1].shard, 1);
  EXPECT_EQ(placement->slices[2].shard, 0);
  EXPECT_EQ(placement->slices[3].shard, 1);
  EXPECT_EQ(placement->shard_slices[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(placement->shard_slices[1], (std::vector<int>{1, 3}));
  EXPECT_EQ(placement->slices[0].name, "hidden1/weights");
  EXPECT_EQ(placement->slices[0].num_bytes, 784 * 512 * 4);
}

TEST(PlacementTest, GreedyBalancesBytes) {
  PlacementOptions options;
  options.strategy = PlacementStrategy::kGreedyByBytes;
  options.partition_threshold_bytes = 64 << 20;
  // 400, 300, 200, 100 floats: greedy gives {400, 100} and {300, 200}.
  std::vector<VariableDef> vars = {{"a", {400}}, {"b", {300}}, {"c", {200}}, {"d", {100}}};
  auto placement = ComputePlacement(vars, 2, options);
  ASSERT_TRUE(placement.ok());
  EXPECT_EQ(placement->slices[0].shard, 0);
  EXPECT_EQ(placement->slices[1].shard, 1);
  EXPECT_EQ(placement->slices[2].shard, 1);
  EXPECT_EQ(placement->slices[3].shard, 0);
}

TEST(PlacementTest, PartitionsLargeVariablesIntoContiguousRowSlices) {
  PlacementOptions options;
  options.partition_threshold_bytes = 1 << 20;
  // 784x512 floats = 1.53 MiB -> 2 parts on 3 shards.
  auto placement = ComputePlacement(MlpVariables(), 3, options);
  ASSERT_TRUE(placement.ok());
  ASSERT_EQ(placement->slices.size(), 5u);
  const VariableSlice& p0 = placement->slices[0];
  const VariableSlice& p1 = placement->slices[1];
  EXPECT_EQ(p0.name, "hidden1/weights/part_0");
  EXPECT_EQ(p1.name, "hidden1/weights/part_1");
  EXPECT_EQ(p0.shape, (Shape{392, 512}));
  EXPECT_EQ(p1.shape, (Shape{392, 512}));
  EXPECT_EQ(p0.byte_offset, 0);
  EXPECT_EQ(p1.byte_offset, p0.num_bytes);
  EXPECT_EQ(p0.num_bytes + p1.num_bytes, 784 * 512 * 4);
  EXPECT_NE(p0.shard, p1.shard);
}

TEST(PlacementTest, UnevenRowsAndPartsOnDistinctShardsForBothStrategies) {
  for (PlacementStrategy strategy :
       {PlacementStrategy::kRoundRobin, PlacementStrategy::kGreedyByBytes}) {
    PlacementOptions options;
    options.strategy = strategy;
    options.partition_threshold_bytes = 100;
    std::vector<VariableDef> vars = {{"small", {3}}, {"big", {10, 7}}};
    auto placement = ComputePlacement(vars, 4, options);
    ASSERT_TRUE(placement.ok());
    // big: 280 bytes -> ceil(280/100) = 3 parts of 4, 3, 3 rows.
    std::vector<int64_t> rows;
    std::set<int> shards;
    int64_t bytes = 0;
    for (const VariableSlice& s : placement->slices) {
      if (s.variable != 1) continue;
      rows.push_back(s.shape[0]);
      shards.insert(s.shard);
      EXPECT_EQ(s.byte_offset, bytes);
      bytes += s.num_bytes;
    }
    EXPECT_EQ(rows, (std::vector<int64_t>{4, 3, 3}));
    EXPECT_EQ(shards.size(), 3u);
    EXPECT_EQ(bytes, 280);
  }
}

TEST(PlacementTest, ContiguousKeepsNeighbouringLayersTogetherInBalancedRuns) {
  // LeNet's variables: fc1/weights (12.8 MB) dwarfs the rest.
  const std::vector<VariableDef> lenet = {
      {"conv1/weights", {5, 5, 1, 32}},  {"conv1/biases", {32}},
      {"conv2/weights", {5, 5, 32, 64}}, {"conv2/biases", {64}},
      {"fc1/weights", {3136, 1024}},     {"fc1/biases", {1024}},
      {"fc2/weights", {1024, 10}},       {"fc2/biases", {10}}};
  auto strategy = ParsePlacementStrategy("contiguous");
  ASSERT_TRUE(strategy.ok());
  PlacementOptions options;
  options.strategy = *strategy;
  auto placement = ComputePlacement(lenet, 4, options);
  ASSERT_TRUE(placement.ok()) << placement.status();
  // fc1/weights is cut in 4; every slice's shard follows the previous one's.
  ASSERT_EQ(placement->slices.size(), 11u);
  std::vector<int64_t> bytes(4, 0);
  int64_t total = 0;
  for (size_t i = 0; i < placement->slices.size(); ++i) {
    const VariableSlice& slice = placement->slices[i];
    if (i > 0) EXPECT_GE(slice.shard, placement->slices[i - 1].shard) << slice.name;
    bytes[slice.shard] += slice.num_bytes;
    total += slice.num_bytes;
  }
  // The convolutions share the first shard with fc1's first part; the
  // last shard ends with fc2.
  EXPECT_EQ(placement->slices[0].shard, 0);
  EXPECT_EQ(placement->slices[4].name, "fc1/weights/part_0");
  EXPECT_EQ(placement->slices[4].shard, 0);
  EXPECT_EQ(placement->slices[7].shard, 3);
  EXPECT_EQ(placement->slices.back().shard, 3);
  for (int k = 0; k < 4; ++k) {
    EXPECT_GT(bytes[k], 0.9 * total / 4) << "shard " << k;
    EXPECT_LT(bytes[k], 1.1 * total / 4) << "shard " << k;
  }
  // More shards than slices: later shards stay empty, nothing breaks.
  auto sparse = ComputePlacement({{"a", {4}}, {"b", {4}}}, 5, options);
  ASSERT_TRUE(sparse.ok());
  EXPECT_LE(sparse->slices[0].shard, sparse->slices[1].shard);
}

TEST(PlacementTest, PrioritizedRunsGrowFromTheFirstLayers) {
  // 64 layers of 256 KiB each (16 MiB), on 8 shards: runs of 1, 2, 4, then
  // 8 parts in 47 (1/47 of the bytes, about 1.4 layers, on shard 0).
  std::vector<VariableDef> layers;
  for (int i = 0; i < 64; ++i) layers.push_back({absl::StrCat("layer", i), {256, 256}});
  auto strategy = ParsePlacementStrategy("prioritized");
  ASSERT_TRUE(strategy.ok());
  PlacementOptions options;
  options.strategy = *strategy;
  auto placement = ComputePlacement(layers, 8, options);
  ASSERT_TRUE(placement.ok()) << placement.status();
  std::vector<int> count(8, 0);
  for (size_t i = 0; i < placement->slices.size(); ++i) {
    if (i > 0) EXPECT_GE(placement->slices[i].shard, placement->slices[i - 1].shard);
    ++count[placement->slices[i].shard];
  }
  // Layer i's middle, (i + 0.5) / 64, against the run ends 1/47, 3/47,
  // 7/47, 15/47, 23/47, ...
  EXPECT_EQ(count, std::vector<int>({1, 3, 6, 10, 11, 11, 11, 11}));
  // As many slices as shards: each gets one, none stays empty.
  auto few = ComputePlacement({{"a", {4}}, {"b", {4}}, {"c", {4}}}, 3, options);
  ASSERT_TRUE(few.ok());
  for (int k = 0; k < 3; ++k) EXPECT_EQ(few->slices[k].shard, k);
}

TEST(PlacementTest, ContiguousLeavesNoShardEmptyWhileThereAreSlicesEnough) {
  PlacementOptions options;
  options.strategy = PlacementStrategy::kContiguous;
  // One variable outweighs the rest: by bytes alone its middle would fall
  // in shard 1 of 4 and leave shard 0 empty (an empty shard trains along,
  // but a push and a pull a step for nothing).
  const std::vector<VariableDef> vars = {
      {"w", {784, 128}}, {"b", {128}}, {"w2", {128, 10}}, {"b2", {10}}};
  for (int shards = 1; shards <= 4; ++shards) {
    auto placement = ComputePlacement(vars, shards, options);
    ASSERT_TRUE(placement.ok());
    for (int k = 0; k < shards; ++k) {
      EXPECT_FALSE(placement->shard_slices[k].empty()) << k << " of " << shards;
    }
    for (size_t i = 1; i < placement->slices.size(); ++i) {
      EXPECT_GE(placement->slices[i].shard, placement->slices[i - 1].shard);
    }
  }
}

TEST(PlacementTest, IsDeterministic) {
  PlacementOptions options;
  options.strategy = PlacementStrategy::kGreedyByBytes;
  auto a = ComputePlacement(MlpVariables(), 3, options);
  auto b = ComputePlacement(MlpVariables(), 3, options);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->slices.size(), b->slices.size());
  for (size_t i = 0; i < a->slices.size(); ++i) {
    EXPECT_EQ(a->slices[i].name, b->slices[i].name);
    EXPECT_EQ(a->slices[i].shard, b->slices[i].shard);
  }
}

TEST(PlacementTest, RejectsBadInput) {
  PlacementOptions options;
  EXPECT_EQ(ComputePlacement(MlpVariables(), 0, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto dup = ComputePlacement({{"a", {1}}, {"a", {2}}}, 1, options);
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(dup.status().message().find("\"a\""), absl::string_view::npos);
  EXPECT_FALSE(ComputePlacement({{"", {1}}}, 1, options).ok());
  EXPECT_FALSE(ComputePlacement({{"neg", {-1}}}, 1, options).ok());
  auto strategy = ParsePlacementStrategy("random");
  EXPECT_FALSE(strategy.ok());
  EXPECT_NE(strategy.status().message().find("round_robin"), absl::string_view::npos);
}

}  // namespace
}  // namespace psrt
