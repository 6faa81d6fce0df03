#include "common/backoff.h"

#include "gtest/gtest.h"

namespace psrt {
namespace {

TEST(BackoffTest, DoublesUpToMax) {
  Backoff backoff(absl::Milliseconds(100), absl::Seconds(1));
  EXPECT_EQ(backoff.retries(), 0);
  EXPECT_EQ(backoff.Peek(), absl::Milliseconds(100));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(100));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(200));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(400));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(800));
  EXPECT_EQ(backoff.Peek(), absl::Seconds(1));
  EXPECT_EQ(backoff.Next(), absl::Seconds(1));
  EXPECT_EQ(backoff.Next(), absl::Seconds(1));
  EXPECT_EQ(backoff.retries(), 6);
}

TEST(BackoffTest, PeekDoesNotAdvance) {
  Backoff backoff(absl::Milliseconds(50), absl::Seconds(1));
  EXPECT_EQ(backoff.Peek(), absl::Milliseconds(50));
  EXPECT_EQ(backoff.Peek(), absl::Milliseconds(50));
  EXPECT_EQ(backoff.retries(), 0);
}

TEST(BackoffTest, InitialEqualToMaxStays) {
  Backoff backoff(absl::Seconds(2), absl::Seconds(2));
  EXPECT_EQ(backoff.Next(), absl::Seconds(2));
  EXPECT_EQ(backoff.Next(), absl::Seconds(2));
}

TEST(BackoffTest, CopiesAreIndependent) {
  Backoff a(absl::Milliseconds(100), absl::Seconds(2));
  Backoff b = a;
  a.Next();
  EXPECT_EQ(a.Peek(), absl::Milliseconds(200));
  EXPECT_EQ(b.Peek(), absl::Milliseconds(100));
}

TEST(BackoffDeathTest, RefusesZeroOrInverted) {
  EXPECT_DEATH(Backoff(absl::ZeroDuration(), absl::Seconds(1)), "");
  EXPECT_DEATH(Backoff(absl::Seconds(2), absl::Seconds(1)), "");
}

}  // namespace
}  // namespace psrt
