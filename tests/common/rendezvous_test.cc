// The rendezvous between real gRPC endpoints on 127.0.0.1, each rank on its
// own thread as separate processes would be.
#include "common/rendezvous.h"

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/free_port.h"

namespace psrt {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<const TransportSecurity> Token(const std::string& token) {
  TransportSecurityOptions options;
  options.auth_token = token;
  absl::StatusOr<TransportSecurity> security = LoadTransportSecurity(options);
  EXPECT_TRUE(security.ok()) << security.status();
  return security.ok() ? std::make_shared<const TransportSecurity>(*std::move(security))
                       : std::make_shared<const TransportSecurity>();
}

class RendezvousTest : public ::testing::Test {
 protected:
  RendezvousOptions Rank(int rank, int world_size, int num_ps = 0) const {
    RendezvousOptions options;
    options.coordinator = coordinator_;
    options.rank = rank;
    options.world_size = world_size;
    options.num_ps = num_ps;
    options.address = absl::StrCat("127.0.0.1:", 3000 + rank);
    options.timeout = absl::Seconds(20);
    options.security = Token("s3cret");
    return options;
  }
  // Runs every rank's rendezvous on its own thread; their outcomes by rank.
  static std::vector<absl::StatusOr<ClusterConfig>> RunAll(
      const std::vector<RendezvousOptions>& ranks) {
    std::vector<absl::StatusOr<ClusterConfig>> results(ranks.size(),
                                                       absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (size_t i = 0; i < ranks.size(); ++i) {
      threads.emplace_back([&, i] { results[i] = Rendezvous(ranks[i]); });
    }
    for (std::thread& t : threads) t.join();
    return results;
  }

  const std::string coordinator_ = absl::StrCat("127.0.0.1:", FreePort());
};

TEST_F(RendezvousTest, EveryRankGetsTheClusterWhateverTheOrderTheyStartIn) {
  std::vector<RendezvousOptions> ranks;
  for (int r = 3; r >= 0; --r) ranks.push_back(Rank(r, 4, /*num_ps=*/1));  // Rank 0 last.
  std::vector<absl::StatusOr<ClusterConfig>> results = RunAll(ranks);
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    const int rank = ranks[i].rank;
    EXPECT_THAT(results[i]->spec.jobs().at("ps"), ::testing::ElementsAre("127.0.0.1:3000"));
    EXPECT_THAT(results[i]->spec.jobs().at("worker"),
                ::testing::ElementsAre("127.0.0.1:3001", "127.0.0.1:3002", "127.0.0.1:3003"));
    EXPECT_EQ(results[i]->task.ToString(),
              rank == 0 ? "ps/0" : absl::StrCat("worker/", rank - 1));
  }
}

// The coordinator's name need not resolve where rank 0 runs (a Kubernetes
// Service name before its DNS record exists): with a listen host rank 0
// serves on that host at the coordinator's port, and the others reach it.
TEST_F(RendezvousTest, RankZeroServesOnItsListenHostAtTheCoordinatorsPort) {
  const std::string port = coordinator_.substr(coordinator_.find(':') + 1);
  RendezvousOptions zero = Rank(0, 2);
  zero.coordinator = "psrt-coordinator.invalid:" + port;
  zero.timeout = absl::Seconds(2);
  absl::StatusOr<ClusterConfig> unresolvable = Rendezvous(zero);
  EXPECT_THAT(std::string(unresolvable.status().message()),
              HasSubstr("rank 0 cannot serve on psrt-coordinator.invalid:" + port));
  zero.listen_host = "127.0.0.1";
  zero.timeout = absl::Seconds(20);
  std::vector<absl::StatusOr<ClusterConfig>> results = RunAll({zero, Rank(1, 2)});
  for (const auto& result : results) {
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_THAT(result->spec.jobs().at("worker"),
                ::testing::ElementsAre("127.0.0.1:3000", "127.0.0.1:3001"));
  }
}

// After the rendezvous rank 0 keeps answering: a rank that restarts at its
// address gets the cluster it had, a rank at another address is refused
// alone, and a second rank 0 cannot serve on the coordinator's port.
TEST_F(RendezvousTest, ARankThatRestartsRejoinsWithTheClusterItHad) {
  std::vector<absl::StatusOr<ClusterConfig>> first = RunAll({Rank(0, 2), Rank(1, 2)});
  ASSERT_TRUE(first[0].ok() && first[1].ok()) << first[0].status() << first[1].status();
  absl::StatusOr<ClusterConfig> again = Rendezvous(Rank(1, 2));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->task.ToString(), "worker/1");
  EXPECT_THAT(again->spec.jobs().at("worker"),
              ::testing::ElementsAre("127.0.0.1:3000", "127.0.0.1:3001"));
  RendezvousOptions elsewhere = Rank(1, 2);
  elsewhere.address = "127.0.0.1:4001";
  absl::StatusOr<ClusterConfig> refused = Rendezvous(elsewhere);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("rank 1 (127.0.0.1:4001) registered twice, from 127.0.0.1:3001"));
  RendezvousOptions second_zero = Rank(0, 2);
  second_zero.timeout = absl::Seconds(1);
  absl::StatusOr<ClusterConfig> second = Rendezvous(second_zero);
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr("rank 0 cannot serve on " + coordinator_));
}

// A rank that starts well before rank 0, whose deadline would otherwise
// end first, still hears from rank 0 which rank never came.
TEST_F(RendezvousTest, ARankThatStartsBeforeRankZeroHearsWhoIsMissing) {
  RendezvousOptions early = Rank(2, 3);
  early.timeout = absl::Seconds(1);
  absl::StatusOr<ClusterConfig> early_result = absl::UnknownError("not run");
  std::thread early_rank([&] { early_result = Rendezvous(early); });
  absl::SleepFor(absl::Milliseconds(700));
  RendezvousOptions zero = Rank(0, 3);
  zero.timeout = absl::Seconds(1);
  absl::StatusOr<ClusterConfig> zero_result = Rendezvous(zero);
  early_rank.join();
  for (const auto& result : {early_result, zero_result}) {
    EXPECT_EQ(result.status().code(), absl::StatusCode::kDeadlineExceeded) << result.status();
    EXPECT_THAT(std::string(result.status().message()),
                HasSubstr("rank 1 of 3 did not register within 1s"));
  }
}

// Rank 0 never comes: the rank says it never reached it, and why.
TEST_F(RendezvousTest, ARankThatNeverReachesRankZeroSaysWhy) {
  RendezvousOptions alone = Rank(1, 2);
  alone.timeout = absl::Seconds(1);
  const absl::Time start = absl::Now();
  absl::StatusOr<ClusterConfig> result = Rendezvous(alone);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDeadlineExceeded) << result.status();
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("rank 1: rendezvous with rank 0 at " + coordinator_ +
                        " failed: Deadline Exceeded (rank 0 was never reachable: "));
}

TEST_F(RendezvousTest, AWorldOfOneNeedsNoCoordinator) {
  absl::StatusOr<ClusterConfig> alone = Rendezvous(Rank(0, 1));
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ(alone->task.ToString(), "worker/0");
}

TEST_F(RendezvousTest, MissingRanksAreNamedAtTheTimeout) {
  std::vector<RendezvousOptions> ranks = {Rank(0, 4), Rank(2, 4)};
  for (RendezvousOptions& r : ranks) r.timeout = absl::Seconds(1);
  const absl::Time start = absl::Now();
  std::vector<absl::StatusOr<ClusterConfig>> results = RunAll(ranks);
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  for (const auto& result : results) {
    EXPECT_EQ(result.status().code(), absl::StatusCode::kDeadlineExceeded) << result.status();
    EXPECT_THAT(std::string(result.status().message()),
                HasSubstr("rank 1, rank 3 of 4 did not register"));
  }
}

TEST_F(RendezvousTest, ARankRegisteredTwiceFailsEveryRankNamingIt) {
  RendezvousOptions twin = Rank(1, 3);
  twin.address = "127.0.0.1:4001";
  std::vector<absl::StatusOr<ClusterConfig>> results =
      RunAll({Rank(0, 3), Rank(1, 3), twin});
  int named = 0;
  for (const auto& result : results) {
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
    named += std::string(result.status().message()).find("registered twice, from 127.0.0.1:") !=
             std::string::npos;
  }
  EXPECT_EQ(named, 3);
}

TEST_F(RendezvousTest, AnotherWorldSizeOrPsCountIsNamed) {
  std::vector<absl::StatusOr<ClusterConfig>> results = RunAll({Rank(0, 2), Rank(1, 3)});
  for (const auto& result : results) {
    EXPECT_THAT(std::string(result.status().message()),
                HasSubstr("rank 1 (127.0.0.1:3001) says 3 tasks of which 0 ps, rank 0 says 2 "
                          "of which 0"));
  }
  results = RunAll({Rank(0, 2, 0), Rank(1, 2, 1)});
  EXPECT_THAT(std::string(results[1].status().message()), HasSubstr("says 2 tasks of which 1 ps"));
  EXPECT_FALSE(Rendezvous(Rank(2, 2)).ok());
}

TEST_F(RendezvousTest, ARankWithoutTheTokenIsRefused) {
  RendezvousOptions impostor = Rank(1, 2);
  impostor.security = Token("wrong");
  RendezvousOptions coordinator = Rank(0, 2);
  coordinator.timeout = absl::Seconds(2);
  std::vector<absl::StatusOr<ClusterConfig>> results = RunAll({coordinator, impostor});
  EXPECT_EQ(results[1].status().code(), absl::StatusCode::kUnauthenticated) << results[1].status();
  EXPECT_THAT(std::string(results[1].status().message()), HasSubstr("rank 1: rendezvous with rank 0"));
  EXPECT_THAT(std::string(results[0].status().message()), HasSubstr("rank 1 of 2 did not register"));
}

}  // namespace
}  // namespace psrt
