// RingPeerRules: the rules both ring transports apply to their neighbours'
// messages, without a transport: the verdicts, the size check, the block
// add, and the pings of a silent neighbour through a fake RingControl.
#include "worker/ring/ring_peer_rules.h"

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace psrt {
namespace {

// Answers pings as told.
class FakeControl : public RingControl {
 public:
  absl::Status PingPrevious(absl::Duration) override { return alive; }
  absl::StatusOr<std::vector<std::string>> NextDataAddresses(absl::Duration) override {
    if (!alive.ok()) return alive;
    return std::vector<std::string>{"127.0.0.1:1"};
  }
  absl::Status alive;
};

RingOptions ThreeWorkers(int rank) {
  RingOptions options;
  options.rank = rank;
  options.addresses = {"h0:1", "h1:1", "h2:1"};
  options.timeout = absl::Seconds(1);
  options.startup_timeout = absl::Seconds(5);
  options.busy_timeout = absl::Seconds(10);
  return options;
}

proto::CollectiveHeader From(int64_t op, int step, int sender, int64_t incarnation) {
  proto::CollectiveHeader header;
  header.set_op(op);
  header.set_step(step);
  header.set_sender(sender);
  header.set_incarnation(incarnation);
  return header;
}

TEST(RingPeerRulesTest, NamesTheNeighboursAndTimesTheFirstOpLonger) {
  FakeControl control;
  RingPeerRules rules(ThreeWorkers(0), &control);
  EXPECT_EQ(rules.previous_rank(), 2);
  EXPECT_EQ(rules.next_rank(), 1);
  EXPECT_EQ(rules.PeerName(2), "worker/2 (h2:1)");
  EXPECT_EQ(rules.Timeout(1), absl::Seconds(5));
  EXPECT_EQ(rules.Timeout(2), absl::Seconds(1));
  const proto::CollectiveHeader header = rules.Header(3, 1);
  EXPECT_EQ(header.op(), 3);
  EXPECT_EQ(header.step(), 1);
  EXPECT_EQ(header.sender(), 0);
  EXPECT_NE(header.incarnation(), 0);
  EXPECT_EQ(header.generation(), 0);
  EXPECT_TRUE(rules.CheckSender(From(1, 0, 2, 7)).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(rules.CheckSender(From(1, 0, 1, 7))));
}

// An elastic job's rings (elastic_ring.h): a message of an earlier
// generation is refused for good, one of a later generation retried, each
// whatever its sender's rank was in that ring.
TEST(RingPeerRulesTest, TakesOnlyItsOwnGenerationsMessages) {
  FakeControl control;
  RingOptions options = ThreeWorkers(0);
  options.generation = 4;
  RingPeerRules rules(options, &control);
  EXPECT_EQ(rules.Header(1, 0).generation(), 4);
  proto::CollectiveHeader message = From(1, 0, 2, 7);
  message.set_generation(4);
  EXPECT_TRUE(rules.CheckSender(message).ok());
  message.set_generation(3);
  message.set_sender(1);  // Its rank in that ring.
  const absl::Status earlier = rules.CheckSender(message);
  EXPECT_TRUE(absl::IsFailedPrecondition(earlier)) << earlier;
  EXPECT_NE(earlier.message().find("list 3's ring"), std::string::npos) << earlier;
  message.set_generation(5);
  const absl::Status later = rules.CheckSender(message);
  EXPECT_TRUE(absl::IsUnavailable(later)) << later;
  EXPECT_NE(later.message().find("not joined the ring of list 5"), std::string::npos)
      << later;
}

TEST(RingPeerRulesTest, TheProcessThatJoinsIsTheOneTakenAndARetryIsDropped) {
  FakeControl control;
  RingPeerRules rules(ThreeWorkers(1), &control);
  // A process of the run before this one (op 5 before any op 1): refused,
  // failing nothing here.
  RingPeerRules::Verdict earlier = rules.Judge(From(5, 0, 0, 7));
  EXPECT_FALSE(earlier.take);
  EXPECT_TRUE(absl::IsFailedPrecondition(earlier.answer)) << earlier.answer;
  EXPECT_TRUE(earlier.failure.ok());
  // Op 1 fixes the process; a retry of what was taken is answered and dropped.
  RingPeerRules::Verdict join = rules.Judge(From(1, 0, 0, 9));
  EXPECT_TRUE(join.take && join.answer.ok() && join.failure.ok());
  rules.Took(1, 0);
  RingPeerRules::Verdict retry = rules.Judge(From(1, 0, 0, 9));
  EXPECT_FALSE(retry.take);
  EXPECT_TRUE(retry.answer.ok() && retry.failure.ok());
  EXPECT_TRUE(rules.Judge(From(1, 1, 0, 9)).take);
  // Another process of worker 0: told to retry, and this worker's op fails.
  RingPeerRules::Verdict restarted = rules.Judge(From(2, 0, 0, 10));
  EXPECT_FALSE(restarted.take);
  EXPECT_TRUE(absl::IsUnavailable(restarted.answer)) << restarted.answer;
  EXPECT_TRUE(absl::IsAborted(restarted.failure)) << restarted.failure;
  EXPECT_NE(restarted.failure.message().find("worker/0 (h0:1) restarted"), std::string::npos);
}

// A new connection's hello answer tells its sender the last segment taken:
// a sender whose answer was lost learns its segment was delivered, but a
// restarted sender (another incarnation, its op 1 again) must still send
// its segments, or both workers would wait for each other.
TEST(RingPeerRulesTest, TheHelloSaysWhatWasTakenOnlyToTheProcessThatSentIt) {
  FakeControl control;
  RingPeerRules receiver(ThreeWorkers(1), &control);
  RingPeerRules sender(ThreeWorkers(0), &control);
  const int64_t incarnation = sender.Header(1, 0).incarnation();
  ASSERT_TRUE(receiver.Judge(From(1, 0, 0, incarnation)).take);
  receiver.Took(1, 0);
  ASSERT_TRUE(receiver.Judge(From(7, 1, 0, incarnation)).take);
  receiver.Took(7, 1);
  const std::string taken = receiver.LastTakenText();
  EXPECT_TRUE(sender.TakenAlready(taken, 7, 1));
  EXPECT_TRUE(sender.TakenAlready(taken, 7, 0));
  EXPECT_TRUE(sender.TakenAlready(taken, 1, 0));
  EXPECT_FALSE(sender.TakenAlready(taken, 7, 2));
  EXPECT_FALSE(sender.TakenAlready(taken, 8, 0));
  RingPeerRules restarted(ThreeWorkers(0), &control);
  EXPECT_FALSE(restarted.TakenAlready(taken, 1, 0));
  EXPECT_FALSE(sender.TakenAlready("7 1", 1, 0));  // Not this version's text.
  EXPECT_FALSE(sender.TakenAlready("", 1, 0));
}

TEST(RingPeerRulesTest, ASegmentOfAnotherSizeIsRefused) {
  FakeControl control;
  RingPeerRules rules(ThreeWorkers(0), &control);
  EXPECT_TRUE(rules.CheckSize(2, 1, 40, 40).ok());
  const absl::Status wrong = rules.CheckSize(2, 1, 44, 40);
  EXPECT_TRUE(absl::IsInvalidArgument(wrong));
  EXPECT_NE(wrong.message().find("do all workers train the same model?"), std::string::npos);
}

// A segment of 3 blocks and a bit, read in order; the read fails in the
// third block once, and the segment sent again adds only what is left.
TEST(RingPeerRulesTest, ASegmentIsAddedInBlocksAndResumedOnceCut) {
  const size_t n = 3 * 16 * 1024 + 5;
  std::vector<float> sent(n), into(n, 1.0f);
  for (size_t i = 0; i < n; ++i) sent[i] = static_cast<float>(i);
  const absl::Span<char> bytes(reinterpret_cast<char*>(into.data()), n * sizeof(float));
  int reads = 0;
  auto read = [&](uint64_t offset, absl::Span<char> block) {
    if (++reads == 3) return absl::UnavailableError("cut");
    std::memcpy(block.data(), reinterpret_cast<const char*>(sent.data()) + offset, block.size());
    return absl::OkStatus();
  };
  uint64_t taken = 0;
  EXPECT_TRUE(absl::IsUnavailable(RingPeerRules::TakeSegment(bytes, /*add=*/true, &taken, read)));
  EXPECT_EQ(taken, 2 * 16 * 1024 * sizeof(float));
  ASSERT_TRUE(RingPeerRules::TakeSegment(bytes, /*add=*/true, &taken, read).ok());
  EXPECT_EQ(taken, bytes.size());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(into[i], 1.0f + static_cast<float>(i)) << i;
  // Copied whole.
  taken = 0;
  ASSERT_TRUE(RingPeerRules::TakeSegment(bytes, /*add=*/false, &taken, read).ok());
  EXPECT_EQ(into, sent);
}

TEST(RingPeerRulesTest, ASilentNeighbourIsWaitedForWhileItAnswers) {
  FakeControl control;
  RingPeerRules rules(ThreeWorkers(0), &control);
  using Neighbour = RingPeerRules::Neighbour;
  EXPECT_TRUE(rules.CheckSilent(Neighbour::kPrevious, 2, 0, absl::Seconds(3)).ok());
  EXPECT_TRUE(rules.CheckSilent(Neighbour::kNext, 2, 0, absl::Seconds(3)).ok());
  // Busy past busy_timeout, or dead: failed, naming it.
  const absl::Status busy = rules.CheckSilent(Neighbour::kPrevious, 2, 0, absl::Seconds(10));
  EXPECT_TRUE(absl::IsDeadlineExceeded(busy));
  EXPECT_NE(busy.message().find("nothing from worker/2 (h2:1)"), std::string::npos) << busy;
  control.alive = absl::UnavailableError("gone");
  const absl::Status dead = rules.CheckSilent(Neighbour::kNext, 2, 1, absl::Seconds(3));
  EXPECT_TRUE(absl::IsDeadlineExceeded(dead));
  EXPECT_NE(dead.message().find("worker/1 (h1:1) has not taken step 1"), std::string::npos)
      << dead;
}

TEST(RingPeerRulesTest, ARefusalFailsOnlyWhenThePreviousWorkerDoesNotAnswer) {
  FakeControl control;
  RingPeerRules rules(ThreeWorkers(0), &control);
  EXPECT_FALSE(rules.TakeRefusal());
  rules.CountRefusal();
  EXPECT_TRUE(rules.refusal_pending());
  EXPECT_TRUE(rules.TakeRefusal());
  EXPECT_FALSE(rules.refusal_pending());
  EXPECT_TRUE(rules.CheckRefusal("message").ok());
  control.alive = absl::UnauthenticatedError("no token");
  const absl::Status refused = rules.CheckRefusal("message");
  EXPECT_TRUE(absl::IsUnauthenticated(refused));
  EXPECT_NE(refused.message().find(RingPeerRules::kTokenHint), std::string::npos) << refused;
}

}  // namespace
}  // namespace psrt
