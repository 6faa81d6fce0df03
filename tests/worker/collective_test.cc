// Collective: ring allreduce and broadcast between real gRPC servers on
// 127.0.0.1, one per worker, each driven by its own thread as separate
// worker processes would; and the faults that must not hang a job.
#include "worker/ring/collective.h"

#include <atomic>
#include <cmath>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/rpc_util.h"
#include "common/transport_security.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "proto/psrt.grpc.pb.h"
#include "tests/fault/fault_relay.h"
#include "tests/free_port.h"

namespace psrt {
namespace {

// W workers' Collectives, their segments over gRPC or over the data plane;
// worker r serves on addresses[r] unless it is left out of `serving`.
struct Ring {
  explicit Ring(int w, bool data_plane, absl::Duration timeout = absl::Seconds(30),
                std::vector<bool> serving = {},
                std::shared_ptr<const TransportSecurity> security =
                    std::make_shared<const TransportSecurity>(),
                bool local_sockets = false, absl::Duration busy_timeout = absl::Minutes(30)) {
    std::vector<std::string> addresses;
    for (int r = 0; r < w; ++r) addresses.push_back(absl::StrCat("127.0.0.1:", FreePort()));
    for (int r = 0; r < w; ++r) {
      Collective::Options options;
      options.rank = r;
      options.addresses = addresses;
      options.timeout = timeout;
      options.startup_timeout = timeout;
      options.busy_timeout = busy_timeout;
      options.security = security;
      options.data_plane = data_plane;
      // TCP only, or the Unix sockets: gRPC's, and the data plane's own.
      options.unix_socket = local_sockets;
      options.local_data_plane = local_sockets;
      workers.push_back(std::make_unique<Collective>(options));
      if (!serving.empty() && !serving[r]) continue;
      grpc::ServerBuilder builder;
      ConfigurePsServer(&builder, int64_t{1} << 30);
      builder.AddListeningPort(addresses[r], security->ServerCredentials());
      if (local_sockets) {
        builder.AddListeningPort(PreferLocalSocket(addresses[r]), security->ServerCredentials());
      }
      builder.RegisterService(workers[r]->service());
      servers.push_back(builder.BuildAndStart());
      EXPECT_NE(servers.back(), nullptr);
    }
    this->addresses = addresses;
  }
  ~Ring() {
    for (auto& server : servers) server->Shutdown();
  }
  // Runs fn(r) on a thread per worker; returns each one's status.
  std::vector<absl::Status> Run(const std::function<absl::Status(int)>& fn, int w) {
    std::vector<absl::Status> results(w);
    std::vector<std::thread> threads;
    for (int r = 0; r < w; ++r) threads.emplace_back([&, r] { results[r] = fn(r); });
    for (auto& t : threads) t.join();
    return results;
  }
  std::vector<std::string> addresses;
  std::vector<std::unique_ptr<Collective>> workers;
  std::vector<std::unique_ptr<grpc::Server>> servers;
};

std::vector<float> RandomValues(size_t n, int seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// Each test runs with the segments over gRPC and over the data plane.
class CollectiveTest : public ::testing::TestWithParam<bool> {
 protected:
  bool data_plane() const { return GetParam(); }
};

INSTANTIATE_TEST_SUITE_P(Transports, CollectiveTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "DataPlane" : "Grpc";
                         });

TEST_P(CollectiveTest, EveryWorkerGetsTheSameSum) {
  for (int w : {1, 2, 3}) {
    // Three workers over Unix sockets (the ring's and gRPC's), as on one host
    // with --unix_socket; fewer over TCP only.
    Ring ring(w, data_plane(), absl::Seconds(30), {}, std::make_shared<const TransportSecurity>(),
              /*local_sockets=*/w == 3);
    // Not a multiple of W: segments of unequal sizes. Three ops in a row.
    for (size_t n : {size_t{1000003}, size_t{7}, size_t{2}}) {
      std::vector<std::vector<float>> data;
      for (int r = 0; r < w; ++r) data.push_back(RandomValues(n, 10 * r + static_cast<int>(n)));
      std::vector<double> want(n, 0.0);
      for (int r = 0; r < w; ++r) {
        for (size_t i = 0; i < n; ++i) want[i] += data[r][i];
      }
      for (const absl::Status& s : ring.Run(
               [&](int r) { return ring.workers[r]->AllreduceSum(absl::MakeSpan(data[r])); }, w)) {
        ASSERT_TRUE(s.ok()) << s;
      }
      for (int r = 1; r < w; ++r) {
        ASSERT_EQ(data[r], data[0]) << "worker " << r << " differs, w=" << w << " n=" << n;
      }
      for (size_t i = 0; i < n; ++i) {
        ASSERT_NEAR(data[0][i], want[i], 1e-5 * (1 + std::abs(want[i]))) << i;
      }
    }
  }
}

TEST_P(CollectiveTest, BroadcastCopiesTheRootsValues) {
  Ring ring(3, data_plane());
  for (int root : {0, 2}) {
    std::vector<std::vector<float>> data;
    for (int r = 0; r < 3; ++r) data.push_back(RandomValues(1000, r));
    const std::vector<float> want = data[root];
    for (const absl::Status& s : ring.Run(
             [&](int r) {
               return ring.workers[r]->Broadcast(
                   {reinterpret_cast<char*>(data[r].data()), data[r].size() * sizeof(float)}, root);
             },
             3)) {
      ASSERT_TRUE(s.ok()) << s;
    }
    for (int r = 0; r < 3; ++r) EXPECT_EQ(data[r], want) << r;
  }
}

TEST_P(CollectiveTest, ADeadWorkerFailsTheOthersWithinTheTimeoutNamingIt) {
  // Worker 2 never starts: worker 0 hears nothing from it, worker 1 cannot
  // reach it; both fail within the timeout, naming it, and stay failed.
  Ring ring(3, data_plane(), absl::Seconds(2), {true, true, false});
  std::vector<std::vector<float>> data(2, std::vector<float>(100, 1.0f));
  const absl::Time start = absl::Now();
  std::vector<absl::Status> results =
      ring.Run([&](int r) { return ring.workers[r]->AllreduceSum(absl::MakeSpan(data[r])); }, 2);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(results[r].ok()) << r;
    EXPECT_NE(results[r].message().find("worker/2 (127.0.0.1:"), std::string::npos) << results[r];
    EXPECT_EQ(ring.workers[r]->AllreduceSum(absl::MakeSpan(data[r])), results[r]);
  }
}

// Worker 0 starts its op three timeouts late (as a chief evaluating
// between steps would), but its process answers: worker 1 waits for it.
TEST_P(CollectiveTest, ABusyWorkerThatStillAnswersIsWaitedFor) {
  Ring ring(2, data_plane(), absl::Seconds(1));
  std::vector<std::vector<float>> data(2, std::vector<float>(100, 1.0f));
  for (const absl::Status& s : ring.Run([&](int r) { return ring.workers[r]->Join(); }, 2)) {
    ASSERT_TRUE(s.ok()) << s;
  }
  std::vector<absl::Status> results = ring.Run(
      [&](int r) {
        if (r == 0) absl::SleepFor(absl::Seconds(3));
        return ring.workers[r]->AllreduceSum(absl::MakeSpan(data[r]));
      },
      2);
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(data[1], std::vector<float>(100, 2.0f));
}

// Worker 1's op fails on its own (an abort) while worker 0 waits for its
// segment: worker 0's ping learns that worker 1 left the ring and fails
// too, naming the cause, instead of waiting for it as for a busy worker.
TEST(CollectiveGrpcTest, AWorkerWhoseOpFailedFailsTheOneWaitingForIt) {
  // Worker 0 pings after 5 s of silence (the ping may take as long).
  Ring ring(2, /*data_plane=*/false, absl::Seconds(5), {},
            std::make_shared<const TransportSecurity>(), /*local_sockets=*/false,
            /*busy_timeout=*/absl::Seconds(60));
  for (const absl::Status& s : ring.Run([&](int r) { return ring.workers[r]->Join(); }, 2)) {
    ASSERT_TRUE(s.ok()) << s;
  }
  std::vector<std::vector<float>> data(2, std::vector<float>(100, 1.0f));
  ring.workers[1]->Abort(absl::AbortedError("the test stops worker 1"));
  // Worker 1 first, alone: its op fails before it takes anything (it sent
  // its first segment, which worker 0 then finds waiting).
  const absl::Status stopped = ring.workers[1]->AllreduceSum(absl::MakeSpan(data[1]));
  EXPECT_TRUE(absl::IsAborted(stopped)) << stopped;
  const absl::Time start = absl::Now();
  const absl::Status waited = ring.workers[0]->AllreduceSum(absl::MakeSpan(data[0]));
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  EXPECT_FALSE(waited.ok());
  EXPECT_NE(waited.message().find("worker/1 (127.0.0.1:"), std::string::npos) << waited;
  EXPECT_NE(waited.message().find("left the ring"), std::string::npos) << waited;
  EXPECT_NE(waited.message().find("the test stops worker 1"), std::string::npos) << waited;
}

// Worker 1's server is up but refuses the ring's first messages as
// Unavailable (as an elastic worker still in an older list's ring does, at
// once): worker 0 sends each step again, backing off, until worker 1 takes
// it. (A refusal that lands before the sender looks must not be taken for
// giving up.)
TEST(CollectiveGrpcTest, ANextWorkerThatAnswersUnavailableIsSentAgainUntilItTakes) {
  constexpr int kRefusals = 5;  // Retried 50, 100, 200, 400 and 800 ms later.
  class NotReadyYet final
      : public proto::Collective::WithRawCallbackMethod_Deliver<proto::Collective::Service> {
   public:
    explicit NotReadyYet(Collective* ring) : ring_(ring) {}
    grpc::ServerUnaryReactor* Deliver(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override {
      proto::CollectiveAck ack;
      absl::Status status = absl::UnavailableError("worker 1 is not ready yet");
      if (calls_.fetch_add(1) >= kRefusals) status = ring_->Deliver(*request, &ack);
      if (status.ok()) *response = SerializeToByteBuffer(ack);
      grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
      reactor->Finish(ToGrpcStatus(status));
      return reactor;
    }
    int calls() const { return calls_.load(); }

   private:
    Collective* const ring_;
    std::atomic<int> calls_{0};
  };
  // Worker 1's segments reach worker 0 at once (it is served as usual). A
  // worker 0 that gave up would leave worker 1 waiting for it: only until
  // the busy timeout.
  Ring ring(2, /*data_plane=*/false, absl::Seconds(5), {true, false},
            std::make_shared<const TransportSecurity>(), /*local_sockets=*/false,
            /*busy_timeout=*/absl::Seconds(10));
  NotReadyYet not_ready(ring.workers[1].get());
  grpc::ServerBuilder builder;
  ConfigurePsServer(&builder, int64_t{1} << 30);
  builder.AddListeningPort(ring.addresses[1], grpc::InsecureServerCredentials());
  builder.RegisterService(&not_ready);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  std::vector<std::vector<float>> data(2, std::vector<float>(1000, 1.0f));
  for (const absl::Status& s : ring.Run(
           [&](int r) { return ring.workers[r]->AllreduceSum(absl::MakeSpan(data[r])); }, 2)) {
    EXPECT_TRUE(s.ok()) << s;
  }
  EXPECT_GT(not_ready.calls(), kRefusals);
  EXPECT_EQ(data[0], std::vector<float>(1000, 2.0f));
  EXPECT_EQ(data[1], data[0]);
  server->Shutdown();
}

// A client without the ring's token calls a worker's Deliver while the
// worker waits for its predecessor: refused, and the ring goes on (only a
// predecessor that does not take the token fails the op).
TEST_P(CollectiveTest, AStrayCallWithoutTheTokenFailsNothing) {
  TransportSecurityOptions token;
  token.auth_token = "s3cret";
  absl::StatusOr<TransportSecurity> security = LoadTransportSecurity(token);
  ASSERT_TRUE(security.ok()) << security.status();
  Ring ring(2, data_plane(), absl::Seconds(10), {},
            std::make_shared<const TransportSecurity>(*std::move(security)));
  for (const absl::Status& s : ring.Run([&](int r) { return ring.workers[r]->Join(); }, 2)) {
    ASSERT_TRUE(s.ok()) << s;
  }
  std::vector<std::vector<float>> data(2, std::vector<float>(100, 1.0f));
  grpc::Status stray;
  std::vector<absl::Status> results = ring.Run(
      [&](int r) {
        if (r == 0) {  // Worker 1 waits for worker 0 meanwhile.
          absl::SleepFor(absl::Milliseconds(500));
          grpc::GenericStub stub(
              grpc::CreateChannel(ring.addresses[1], grpc::InsecureChannelCredentials()));
          grpc::ClientContext context;
          context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
          grpc::Slice slice(std::string("stray"));
          grpc::ByteBuffer request(&slice, 1), response;
          absl::Notification done;
          stub.UnaryCall(&context, "/psrt.proto.Collective/Deliver", grpc::StubOptions(), &request,
                         &response, [&](grpc::Status s) {
                           stray = std::move(s);
                           done.Notify();
                         });
          done.WaitForNotification();
          absl::SleepFor(absl::Milliseconds(500));
        }
        return ring.workers[r]->AllreduceSum(absl::MakeSpan(data[r]));
      },
      2);
  EXPECT_EQ(stray.error_code(), grpc::StatusCode::UNAUTHENTICATED) << stray.error_message();
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(data[1], std::vector<float>(100, 2.0f));
}

TEST_P(CollectiveTest, BuffersOfDifferentSizesAreRefused) {
  // The first op's timeout (a worker's connect to the next) is ample on a
  // busy machine; the sizes fail the second at once.
  Ring ring(2, data_plane(), absl::Seconds(30));
  std::vector<float> a(10, 1.0f), b(12, 1.0f);
  std::vector<absl::Status> results = ring.Run(
      [&](int r) { return ring.workers[r]->AllreduceSum(absl::MakeSpan(r == 0 ? a : b)); }, 2);
  bool named = false;
  for (const absl::Status& s : results) {
    EXPECT_FALSE(s.ok());
    named |= s.message().find("do all workers train the same model?") != std::string::npos;
  }
  EXPECT_TRUE(named) << results[0] << " / " << results[1];
}

// Over the data plane, worker 0's segments reach worker 1 through a relay
// that resets the connection in the middle of one: worker 0 connects again
// and sends it again, and worker 1 adds (reduce-scatter) or copies
// (all-gather) it once. Then a reset that loses only worker 1's answer to a
// whole segment: sent again, and dropped.
TEST(CollectiveDataPlaneTest, ASegmentCutMidwayIsSentAgainAndTakenOnce) {
  const int data_port = FreePort();
  // Worker 1 is 127.0.0.2 to the others: its gRPC serves there, its data
  // plane listens on 127.0.0.1, and the relay joins the two.
  const std::vector<std::string> addresses = {absl::StrCat("127.0.0.1:", FreePort()),
                                              absl::StrCat("127.0.0.2:", FreePort())};
  FaultRelay::Options relay_options;
  relay_options.listen_host = "127.0.0.2";
  relay_options.listen_port = data_port;
  relay_options.target_port = data_port;
  absl::StatusOr<std::unique_ptr<FaultRelay>> relay = FaultRelay::Start(relay_options);
  ASSERT_TRUE(relay.ok()) << relay.status();
  std::vector<std::unique_ptr<Collective>> workers;
  std::vector<std::unique_ptr<grpc::Server>> servers;
  for (int r = 0; r < 2; ++r) {
    Collective::Options options;
    options.rank = r;
    options.addresses = addresses;
    options.timeout = options.startup_timeout = absl::Seconds(30);
    options.data_plane = true;
    if (r == 1) {
      options.data_listen_host = "127.0.0.1";
      options.data_port = data_port;
      options.local_data_plane = false;  // Worker 0 must pass the relay.
    }
    workers.push_back(std::make_unique<Collective>(options));
    grpc::ServerBuilder builder;
    ConfigurePsServer(&builder, int64_t{1} << 30);
    builder.AddListeningPort(addresses[r], grpc::InsecureServerCredentials());
    builder.RegisterService(workers[r]->service());
    servers.push_back(builder.BuildAndStart());
    ASSERT_NE(servers.back(), nullptr);
  }
  auto run = [&](const std::function<absl::Status(int)>& fn) {
    std::vector<absl::Status> results(2);
    std::thread other([&] { results[1] = fn(1); });
    results[0] = fn(0);
    other.join();
    return results;
  };
  for (const absl::Status& s : run([&](int r) { return workers[r]->Join(); })) {
    ASSERT_TRUE(s.ok()) << s;
  }
  const size_t n = 4 << 20;  // 16 MiB: two segments of 8 MiB.
  struct Fault {
    FaultRelay::Direction direction;
    int64_t min_bytes;
    int skip;
  };
  // The third large chunk of a segment, once two (at least 128 KiB of it)
  // have been added; the answer to step 0 (the hello was answered in
  // Join), which worker 1 has taken when worker 0 sends it again; the answer
  // to step 1, the op's last, which worker 0 learns was taken from the
  // hello of its new connection (nothing would read a segment sent again
  // until the next op).
  for (const Fault& fault : {Fault{FaultRelay::Direction::kClientToTarget, 64 << 10, 2},
                             Fault{FaultRelay::Direction::kTargetToClient, 1, 0},
                             Fault{FaultRelay::Direction::kTargetToClient, 1, 1}}) {
    std::vector<std::vector<float>> data = {RandomValues(n, 1), RandomValues(n, 2)};
    std::vector<float> want(n);
    for (size_t i = 0; i < n; ++i) want[i] = data[0][i] + data[1][i];
    const int64_t resets = (*relay)->stats().resets;
    (*relay)->InjectOnNextChunk(FaultRelay::Fault::kReset, fault.direction, fault.min_bytes,
                                fault.skip);
    const absl::Time start = absl::Now();
    for (const absl::Status& s :
         run([&](int r) { return workers[r]->AllreduceSum(absl::MakeSpan(data[r])); })) {
      ASSERT_TRUE(s.ok()) << s;
    }
    EXPECT_EQ((*relay)->stats().resets, resets + 1);
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
    EXPECT_EQ(data[0], data[1]);
    // Each element is one float addition (of two), in either order.
    EXPECT_EQ(data[0], want);
  }
  for (auto& server : servers) server->Shutdown();
}

}  // namespace
}  // namespace psrt
