// RocAuc and LogLoss against values worked by hand.
#include "common/binary_classification.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace psrt {
namespace {

TEST(RocAucTest, CountsOrderedPairsAndHalfTies) {
  // Positives 0.9, 0.4; negatives 0.5, 0.1: of 4 pairs, (0.9 > 0.5),
  // (0.9 > 0.1), (0.4 > 0.1) are ordered, (0.4 < 0.5) is not: 3/4.
  EXPECT_DOUBLE_EQ(RocAuc({0.9f, 0.5f, 0.4f, 0.1f}, {1, 0, 1, 0}), 0.75);
  // A tie between a positive and a negative counts half: (1 + 0.5) / 2.
  EXPECT_DOUBLE_EQ(RocAuc({0.7f, 0.3f, 0.3f}, {1, 1, 0}), 0.75);
  EXPECT_DOUBLE_EQ(RocAuc({0.1f, 0.2f, 0.3f}, {0, 1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(RocAuc({0.1f, 0.2f, 0.3f}, {1, 0, 0}), 0.0);
  EXPECT_DOUBLE_EQ(RocAuc({0.1f, 0.2f}, {1, 1}), 0.5);  // One class only.
  // NaNs rank lowest, tied: the positive NaN loses to 0.2, ties the other
  // NaN; the positive 0.3 beats both negatives: (0 + 0.5 + 1 + 1) / 4.
  const float nan = std::nanf("");
  EXPECT_DOUBLE_EQ(RocAuc({nan, 0.2f, nan, 0.3f}, {1, 0, 0, 1}), 0.625);
}

TEST(LogLossTest, MeanOfTheLabelsLogProbabilities) {
  EXPECT_NEAR(LogLoss({0.8f, 0.25f}, {1, 0}), -(std::log(0.8) + std::log(0.75)) / 2, 1e-7);
  // Certain and wrong is clamped, not infinite.
  EXPECT_NEAR(LogLoss({0.0f}, {1}), -std::log(1e-7), 1e-6);
  EXPECT_EQ(LogLoss({}, {}), 0);
}

}  // namespace
}  // namespace psrt
