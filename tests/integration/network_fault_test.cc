// Training on a bad network: what a synchronous job does when its links to
// the parameter servers are slow, stall, reset or go down.
//
// Two ways to get a bad network without netem (which this kernel lacks):
//  - Relays (tests/fault/fault_relay.h) in front of every PS. The spec names
//    PS k at 127.0.0.2:P, where its relay listens; the PS itself listens on
//    127.0.0.1:P (--bind_host=127.0.0.1) and the relay forwards there. The
//    relays run inside this test, so each fault lands at a known step, on a
//    known kind of message.
//  - Network namespaces (tests/fault/netns_cluster.sh): every task in a
//    namespace of its own, joined by veth pairs to a bridge, and one PS's
//    link is taken down for a few seconds. Needs root; skipped without.
//
// Every test runs MLP training in sync mode and asks that it finishes: all
// steps, the final accuracy line, every PS done at the last version. Each
// prints one "network_fault:" line with what it measured. Each runs twice:
// with tensors over gRPC, and over the data plane (--tensor_transport=data_plane),
// whose connections get relays of their own (at 127.0.0.2 and the port the
// ps reports), where the faults then land.
#include <cstdio>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/fault/fault_relay.h"
#include "tests/integration/cluster_fixture.h"

namespace psrt {
namespace {

using Fault = FaultRelay::Fault;
using Direction = FaultRelay::Direction;

constexpr long kSteps = 200;
// A fault is injected once the chief has logged this step.
constexpr long kFaultStep = 50;
const std::string kTrainFlags = absl::StrCat(
    "--sync_replicas --train_steps=", kSteps,
    " --optimizer=momentum --learning_rate=0.02 --hidden_units=128 --log_every_steps=1");
// Chunks this large are parameter bytes (a push on its way to the PS, a
// pull's reply on its way back), never a small request or an HTTP/2 frame
// of gRPC's own.
constexpr int64_t kBulkChunkBytes = 32 << 10;

std::string LastLines(const std::string& text, int n) {
  size_t at = text.size();
  while (n-- > 0 && at > 0) at = text.rfind('\n', at - 1);
  return at == std::string::npos ? text : text.substr(at);
}

class NetworkFaultTest : public ClusterFixture, public ::testing::WithParamInterface<std::string> {
 protected:
  // "grpc" or "data_plane": --tensor_transport of every task.
  const std::string& Transport() const { return GetParam(); }
  std::string TransportFlag() const { return "--tensor_transport=" + Transport(); }
  // The relay that carries ps/k's tensors: its data plane's, or its gRPC's.
  FaultRelay& TensorRelay(int k) {
    return Transport() == "data_plane" ? *data_relays_[k] : *relays_[k];
  }

  void TearDown() override {
    Finish();
    relays_.clear();
    data_relays_.clear();
    ClusterFixture::TearDown();
  }

  // Starts `ps` parameter servers and 2 workers with every PS behind a
  // relay started with `options` (see the top), and scripts/launch.sh on a
  // thread of its own, so that the test injects faults meanwhile; Finish()
  // waits for it.
  void StartRelayedTraining(int ps, const FaultRelay::Options& options) {
    std::string spec = ReadFile(MakeSpec(ps, 2));
    std::smatch m;
    static const std::regex kPsList(R"("ps": \[([^\]]*)\])");
    ASSERT_TRUE(std::regex_search(spec, m, kPsList)) << spec;
    const std::string ps_list = m[1];
    std::string relayed_list = ps_list;
    static const std::regex kAddress(R"(127\.0\.0\.1:(\d+))");
    for (auto it = std::sregex_iterator(ps_list.begin(), ps_list.end(), kAddress);
         it != std::sregex_iterator(); ++it) {
      FaultRelay::Options relay = options;
      relay.listen_host = "127.0.0.2";
      relay.listen_port = relay.target_port = std::stoi((*it)[1]);
      relay.seed = options.seed + relays_.size();
      auto started = FaultRelay::Start(relay);
      ASSERT_TRUE(started.ok()) << started.status();
      relays_.push_back(std::move(*started));
      absl::StrReplaceAll({{(*it)[0].str(), absl::StrCat("127.0.0.2:", relay.listen_port)}},
                          &relayed_list);
    }
    ASSERT_EQ(relays_.size(), static_cast<size_t>(ps)) << spec;
    spec.replace(m.position(1), ps_list.size(), relayed_list);
    const std::string path = dir_ + "/relayed.json";
    std::ofstream(path) << spec;

    start_ = absl::Now();
    launch_ = std::thread([this, path] {
      // The relays stand for the network between hosts: no ps serves a Unix
      // socket that would let a worker past them.
      result_ = Launch(path, dir_ + "/logs", absl::StrCat(kTrainFlags, " ", TransportFlag()),
                       absl::StrCat("--all_hosts --ps_flags='--bind_host=127.0.0.1 "
                                    "--local_data_plane=false ",
                                    TransportFlag(), "'"));
      done_.Notify();
    });
    if (Transport() != "data_plane") return;
    // Each ps's data plane behind a relay too: at 127.0.0.2 and the port the
    // ps reports (the workers retry the connection until the relay is up).
    static const std::regex kDataPlane(R"(data plane on 127\.0\.0\.1:(\d+))");
    for (int k = 0; k < ps; ++k) {
      const std::string log = absl::StrCat(dir_, "/logs/ps-", k, ".log");
      std::smatch found;
      std::string text;
      for (int i = 0; i < 600; ++i) {
        text = ReadFile(log);
        if (std::regex_search(text, found, kDataPlane)) break;
        absl::SleepFor(absl::Milliseconds(50));
      }
      ASSERT_FALSE(found.empty()) << "ps/" << k << " reported no data plane:\n" << text;
      FaultRelay::Options relay = options;
      relay.listen_host = "127.0.0.2";
      relay.listen_port = relay.target_port = std::stoi(found[1]);
      relay.seed = options.seed + 100 + k;
      auto started = FaultRelay::Start(relay);
      ASSERT_TRUE(started.ok()) << started.status();
      data_relays_.push_back(std::move(*started));
    }
  }
  const CommandResult& Finish() {
    if (launch_.joinable()) launch_.join();
    return result_;
  }

  // The chief's latest "step N, loss" line, -1 before the first.
  long ChiefStep() const {
    const std::string log = ReadFile(dir_ + "/logs/worker-0.log");
    static const std::regex kStep(R"(\] step (\d+), loss)");
    long step = -1;
    for (auto it = std::sregex_iterator(log.begin(), log.end(), kStep);
         it != std::sregex_iterator(); ++it) {
      step = std::stol((*it)[1]);
    }
    return step;
  }
  // Waits until the chief logs a step above `step`; false when training
  // ended first or after `timeout`.
  bool WaitForStepAbove(long step, absl::Duration timeout = absl::Seconds(120)) const {
    const absl::Time give_up = absl::Now() + timeout;
    while (ChiefStep() <= step) {
      if (done_.HasBeenNotified() || absl::Now() > give_up) return false;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return true;
  }

  // Training finished every step, printed its accuracy, and every PS reached
  // the last version. Prints the "network_fault:" line.
  void ExpectFinished(const std::string& scenario, const std::string& measured = "") {
    const CommandResult& r = Finish();
    long step = -1;
    double accuracy = -1;
    const bool final_line = ParseFinal(ReadFile(dir_ + "/logs/worker-0.log"), &step, &accuracy);
    const std::string outcome =
        final_line ? absl::StrFormat("final step %d, accuracy %.4f", step, accuracy)
                   : std::string("no final line");
    std::printf("network_fault: %s, tensors over %s: launch exit %d, %s, %.1f s%s\n",
                scenario.c_str(), Transport().c_str(), r.exit_code, outcome.c_str(),
                absl::ToDoubleSeconds(absl::Now() - start_), measured.c_str());
    for (size_t k = 0; k < relays_.size() + data_relays_.size(); ++k) {
      const bool data = k >= relays_.size();
      const size_t ps = data ? k - relays_.size() : k;
      const FaultRelay::Stats s = (data ? data_relays_[ps] : relays_[ps])->stats();
      std::printf(
          "network_fault:   relay of ps/%zu%s: %lld connections, %lld KB, %lld resets, "
          "%lld closes, %lld stalls\n",
          ps, data ? "'s data plane" : "", static_cast<long long>(s.connections),
          static_cast<long long>(s.bytes_forwarded >> 10), static_cast<long long>(s.resets),
          static_cast<long long>(s.closes), static_cast<long long>(s.stalls));
    }
    ASSERT_EQ(r.exit_code, 0) << LastLines(r.output, 30);
    ASSERT_TRUE(final_line) << LastLines(r.output, 30);
    EXPECT_EQ(step, kSteps);
    EXPECT_GE(accuracy, 0.7);
    for (size_t k = 0; k < relays_.size(); ++k) {
      const std::string log = ReadFile(absl::StrCat(dir_, "/logs/ps-", k, ".log"));
      EXPECT_NE(log.find(absl::StrCat("done: ", kSteps, " versions")), std::string::npos) << log;
    }
  }

  // Injects `fault` on the next bulk chunk in `direction` through the relay
  // of ps/`shard`, once training has passed kFaultStep.
  void FaultMidTransfer(int ps, int shard, Fault fault, Direction direction) {
    ASSERT_NO_FATAL_FAILURE(StartRelayedTraining(ps, FaultRelay::Options()));
    ASSERT_TRUE(WaitForStepAbove(kFaultStep - 1)) << LastLines(Finish().output, 30);
    TensorRelay(shard).InjectOnNextChunk(fault, direction, kBulkChunkBytes);
  }

  // Trains through relays that delay every chunk (the test's body).
  void TrainThroughDelayingRelays(int ps);

  std::vector<std::unique_ptr<FaultRelay>> relays_;       // Per ps: its gRPC port's.
  std::vector<std::unique_ptr<FaultRelay>> data_relays_;  // Per ps: its data plane's.
  std::thread launch_;
  absl::Notification done_;
  CommandResult result_;
  absl::Time start_;
};

// 5 +- 3 ms per chunk, each way: at least 4 ms more a round trip, 16 at most.
void NetworkFaultTest::TrainThroughDelayingRelays(int ps) {
  FaultRelay::Options options;
  options.delay = absl::Milliseconds(5);
  options.jitter = absl::Milliseconds(3);
  ASSERT_NO_FATAL_FAILURE(StartRelayedTraining(ps, options));
  ExpectFinished(absl::StrCat("delay 5+-3 ms, ", ps, " ps"));
}

TEST_P(NetworkFaultTest, SyncTrainingFinishesThroughADelayingRelayToOnePs) {
  TrainThroughDelayingRelays(1);
}

TEST_P(NetworkFaultTest, SyncTrainingFinishesThroughDelayingRelaysToTwoPs) {
  TrainThroughDelayingRelays(2);
}

// A stalled relay holds every byte without closing anything: like a link
// that is down for 4 s and comes back, except that TCP sees no loss (the
// netns test below has the real thing). Training waits and goes on.
TEST_P(NetworkFaultTest, SyncTrainingSurvivesAFourSecondStallOfOnePs) {
  const absl::Duration kStall = absl::Seconds(4);
  ASSERT_NO_FATAL_FAILURE(StartRelayedTraining(2, FaultRelay::Options()));
  ASSERT_TRUE(WaitForStepAbove(kFaultStep - 1)) << LastLines(Finish().output, 30);
  const absl::Time stalled = absl::Now();
  relays_[1]->StallAll(kStall);
  if (Transport() == "data_plane") data_relays_[1]->StallAll(kStall);
  absl::SleepFor(kStall);
  const long step_at_resume = ChiefStep();
  const absl::Time resumed = absl::Now();
  ASSERT_TRUE(WaitForStepAbove(step_at_resume)) << LastLines(Finish().output, 30);
  const absl::Time next_step = absl::Now();
  ExpectFinished("stall of ps/1 for 4 s, 2 ps",
                 absl::StrFormat("; step %d when the stall ended, next step %.2f s later "
                                 "(training stalled %.2f s)",
                                 step_at_resume, absl::ToDoubleSeconds(next_step - resumed),
                                 absl::ToDoubleSeconds(next_step - stalled)));
  // Training goes on as soon as the bytes flow again (the relay held them;
  // TCP had nothing to retransmit), within a few step times.
  EXPECT_LT(next_step - resumed, absl::Seconds(3));
}

// In the four tests below the Push or Pull in flight fails with UNAVAILABLE
// ("recvmsg:Connection reset by peer"; "Socket closed" after a FIN); the
// worker's client calls that shard again (a push is deduplicated by
// (worker, step)), and training goes on.

// A connection reset while a push is on its way to the PS: the request
// never arrives, so the push may be sent again. (ps/0 holds the weights,
// the large variables; ps/1 only the biases.)
TEST_P(NetworkFaultTest, SyncTrainingSurvivesAResetMidPush) {
  ASSERT_NO_FATAL_FAILURE(FaultMidTransfer(2, 0, Fault::kReset, Direction::kClientToTarget));
  ExpectFinished("reset mid-push to ps/0, 2 ps");
  EXPECT_EQ(TensorRelay(0).stats().resets, 1);
}

// A connection reset while a pull's reply is on its way to the worker.
TEST_P(NetworkFaultTest, SyncTrainingSurvivesAResetMidPull) {
  ASSERT_NO_FATAL_FAILURE(FaultMidTransfer(1, 0, Fault::kReset, Direction::kTargetToClient));
  ExpectFinished("reset mid-pull from ps/0, 1 ps");
  EXPECT_EQ(TensorRelay(0).stats().resets, 1);
}

// A connection closed in order (FIN), as by a proxy or a NAT that drops
// flows, while a pull's reply is on its way.
TEST_P(NetworkFaultTest, SyncTrainingSurvivesAConnectionClosedMidPull) {
  ASSERT_NO_FATAL_FAILURE(FaultMidTransfer(1, 0, Fault::kClose, Direction::kTargetToClient));
  ExpectFinished("close (FIN) mid-pull from ps/0, 1 ps");
  EXPECT_EQ(TensorRelay(0).stats().closes, 1);
}

// Delay with occasional random resets, as psrt_fault_relay's flags give them.
TEST_P(NetworkFaultTest, SyncTrainingSurvivesRandomResetsOnADelayingLink) {
  FaultRelay::Options options;
  options.delay = absl::Milliseconds(2);
  options.jitter = absl::Milliseconds(1);
  options.reset_probability = 0.002;  // Per chunk; a run forwards thousands.
  options.max_faults = 3;
  options.seed = 11;
  ASSERT_NO_FATAL_FAILURE(StartRelayedTraining(1, options));
  ExpectFinished("delay 2+-1 ms and random resets (p=0.002/chunk, at most 3), 1 ps");
  EXPECT_GT(TensorRelay(0).stats().resets, 0) << "no reset was injected: raise reset_probability";
}

// Real links in network namespaces: ps/1's link goes down for 4 s.
TEST_P(NetworkFaultTest, SyncTrainingSurvivesALinkDownForFourSeconds) {
  const CommandResult r = RunCommand(absl::StrCat(
      "timeout 180 bash ", source_, "/tests/fault/netns_cluster.sh --bin ", bin_, " --out ", dir_,
      "/netns --ps 2 --workers 2 --cut_ps 1 --cut_at_step ", kFaultStep,
      " --down_secs 4 --ps_flags ", TransportFlag(), " -- ", kTrainFlags, " ", TransportFlag()));
  if (r.exit_code == 77) GTEST_SKIP() << r.output;
  for (absl::string_view line : absl::StrSplit(r.output, '\n')) {
    if (absl::StartsWith(line, "netns_cluster:")) {
      std::printf("network_fault: %s\n", std::string(line).c_str());
    }
  }
  ASSERT_EQ(r.exit_code, 0) << r.output;
  long step = -1;
  double accuracy = -1;
  ASSERT_TRUE(ParseFinal(ReadFile(dir_ + "/netns/worker-0.log"), &step, &accuracy)) << r.output;
  EXPECT_EQ(step, kSteps);
  EXPECT_GE(accuracy, 0.7);
  std::smatch m;
  static const std::regex kRecovery(R"(next step ([0-9.]+) s after the link came back)");
  ASSERT_TRUE(std::regex_search(r.output, m, kRecovery)) << r.output;
  EXPECT_LT(std::stod(m[1]), 10.0) << r.output;
}

INSTANTIATE_TEST_SUITE_P(GrpcAndDataPlane, NetworkFaultTest, ::testing::Values("grpc", "data_plane"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "grpc" ? "TensorsOverGrpc"
                                                       : "TensorsOverTheDataPlane";
                         });

}  // namespace
}  // namespace psrt
