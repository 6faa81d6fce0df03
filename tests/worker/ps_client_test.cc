// PsClient against real PsService shards in this process, on 127.0.0.1:
// partitioned variables, messages far above gRPC's 4 MB default, sync
// aggregation across two clients, and model mismatch detection. The tests
// of pushes and pulls (PsClientTransportTest) run over both transports of
// tensors: gRPC and the data plane (the embedding rows': ps_client_sparse_test.cc).
#include "worker/store/ps_client.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <iterator>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/rpc_util.h"
#include "common/timeline.h"
#include "common/transport_security.h"
#include "glog/logging.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "ps/parameter_shard.h"
#include "ps/ps_service.h"
#include "tests/free_port.h"
#include "tests/worker/local_ps.h"

namespace psrt {
namespace {

INSTANTIATE_TEST_SUITE_P(Transports, PsClientTransportTest,
                         ::testing::Values(TensorTransport::kGrpc, TensorTransport::kDataPlane),
                         [](const ::testing::TestParamInfo<TensorTransport>& info) {
                           return info.param == TensorTransport::kGrpc ? "Grpc" : "DataPlane";
                         });

// 6000 x 1024 floats: 24 MB, partitioned into two 12 MB slices.
std::vector<VariableDef> Variables(int64_t rows = 6000) {
  return {{"big", {rows, 1024}}, {"small", {10}}};
}

// Two replicas, one sync step, over two ps tasks of `stripes` shards each.
void SyncStepOverTwoPsTasks(PsClientTransportTest* test, int stripes) {
  auto ps0_owner = test->Ps(0, stripes), ps1_owner = test->Ps(0, stripes);
  LocalPs &ps0 = *ps0_owner, &ps1 = *ps1_owner;
  const auto vars = Variables();
  const absl::Duration retry = absl::Seconds(60);
  auto chief = test->Client({&ps0, &ps1}, 0, vars, retry, stripes);
  auto other = test->Client({&ps0, &ps1}, 1, vars, retry, stripes);
  ASSERT_TRUE(chief->WaitForServers(absl::Seconds(10)).ok());
  ASSERT_TRUE(other->WaitForServers(absl::Seconds(10)).ok());
  EXPECT_EQ(chief->uses_data_plane(), test->GetParam() == TensorTransport::kDataPlane);
  std::vector<Tensor> initial = Filled(vars, 2.0f);
  initial[0].data()[123] = 7.0f;  // Lands in the first slice.
  initial[0].data()[6000 * 1024 - 1] = -7.0f;  // In the last.
  ASSERT_TRUE(chief->Init(SyncConfig(2), initial).ok());
  auto config = other->WaitForModelReady(absl::Seconds(10));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->mode(), proto::SYNC);

  // Both replicas pull version 0, push, and pull version 1.
  auto step = [&](PsClient* client, float grad_value, std::vector<Tensor>* out) {
    *out = Filled(vars, 0.0f);
    auto pulled = client->Pull(0, out);
    ASSERT_TRUE(pulled.ok()) << pulled.status();
    EXPECT_EQ(pulled->version, 0);
    EXPECT_EQ((*out)[0].data()[123], 7.0f);
    auto pushed = client->Push(Filled(vars, grad_value));
    ASSERT_TRUE(pushed.ok()) << pushed.status();
    EXPECT_TRUE(pushed->accepted);
    auto next = client->Pull(1, out);
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_EQ(next->version, 1);
  };
  std::vector<Tensor> a, b;
  std::thread t([&] { step(other.get(), 3.0f, &b); });
  step(chief.get(), 1.0f, &a);
  t.join();
  // value = initial - 0.5 * mean(1, 3) = initial - 1.
  EXPECT_EQ(a[0].data()[0], 1.0f);
  EXPECT_EQ(a[0].data()[123], 6.0f);
  EXPECT_EQ(a[0].data()[6000 * 1024 - 1], -8.0f);
  EXPECT_EQ(a[1].data()[9], 1.0f);
  EXPECT_EQ(b[0].data()[6000 * 1024 - 1], -8.0f);
  // Every stripe had a push from each replica, over the transport under test.
  EXPECT_EQ(PsClientTransportTest::DataPlanePushes({&ps0, &ps1}),
            test->GetParam() == TensorTransport::kDataPlane ? 2 * 2 * stripes : 0);
  for (LocalPs* ps : {&ps0, &ps1}) {
    for (int stripe = 0; stripe < stripes; ++stripe) {
      EXPECT_EQ(ps->shard(stripe).GetStatus().version(), 1);
      // The big variable is split over every shard: each holds a part.
      EXPECT_GT(ps->shard(stripe).GetStatus().variables_size(), 0);
    }
  }

  EXPECT_TRUE(chief->Shutdown().ok());
  EXPECT_TRUE(other->Shutdown().ok());
  for (int stripe = 0; stripe < stripes; ++stripe) {
    EXPECT_TRUE(ps0.shard(stripe).WaitUntilFinished(absl::Seconds(5)).ok());
    EXPECT_TRUE(ps0.shard(stripe).GetStatus().training_done());
  }
}

TEST_P(PsClientTransportTest, SyncStepOverTwoShardsWithLargeMessages) {
  SyncStepOverTwoPsTasks(this, 1);
}

TEST_P(PsClientTransportTest, SyncStepOverStripedPsTasks) { SyncStepOverTwoPsTasks(this, 3); }

// --wire_dtype=bf16 end to end: pushes and training pulls carry bfloat16,
// a full-precision pull gets the float32 the stripes hold.
TEST_P(PsClientTransportTest, Bf16WireRoundsOnlyWhatTravels) {
  auto ps = Ps(0, /*stripes=*/2);
  const auto vars = Variables(/*rows=*/100);
  auto owner = Client({ps.get()}, 0, vars, absl::Seconds(60), 2, proto::DT_BFLOAT16);
  PsClient& client = *owner;
  ASSERT_TRUE(client.WaitForServers(absl::Seconds(10)).ok());
  const float fine = 1.0f + 1.0f / 1024;  // Rounds to 1 in bfloat16.
  ASSERT_TRUE(client.Init(SyncConfig(1), Filled(vars, fine)).ok());  // Init: float32.

  std::vector<Tensor> params = Filled(vars, 0.0f);
  ASSERT_TRUE(client.Pull(0, &params).ok());
  EXPECT_EQ(params[0].data()[0], 1.0f);
  EXPECT_EQ(params[1].data()[9], 1.0f);
  ASSERT_TRUE(client.Push(Filled(vars, 2.0f)).ok());
  auto full = client.Pull(1, &params, false, 0, PsClient::Precision::kFull);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(full->version, 1);
  // fine - 0.5 * 2, in float32 on the shards.
  EXPECT_EQ(params[0].data()[100 * 1024 - 1], fine - 1.0f);
  EXPECT_EQ(params[1].data()[0], fine - 1.0f);
  // fine - 1 = 2^-10 is a bfloat16 itself: the wire pull is exact now.
  ASSERT_TRUE(client.Pull(1, &params).ok());
  EXPECT_EQ(params[0].data()[0], 1.0f / 1024);
  EXPECT_TRUE(client.Shutdown().ok());
}

// With a timeline, each shard's encoding, push and pull show on a lane of
// that shard's, at the step pushed and the version pulled.
TEST_P(PsClientTransportTest, TimelineShowsEachShardsPushAndPull) {
  auto ps = Ps(0, /*stripes=*/2);
  const auto vars = Variables(/*rows=*/100);
  // One file per process: ctest runs this test's two transports at once.
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/ps_client_timeline_", getpid(), ".json");
  auto timeline = Timeline::Open(path, 0);
  ASSERT_TRUE(timeline.ok()) << timeline.status();
  auto owner = Client({ps.get()}, 0, vars, absl::Seconds(60), 2, proto::DT_FLOAT, {},
                      timeline->get());
  PsClient& client = *owner;
  ASSERT_TRUE(client.WaitForServers(absl::Seconds(10)).ok());
  ASSERT_TRUE(client.Init(SyncConfig(1), Filled(vars, 1.0f)).ok());
  std::vector<Tensor> params = Filled(vars, 0.0f);
  ASSERT_TRUE(client.Pull(0, &params).ok());
  ASSERT_TRUE(client.Push(Filled(vars, 2.0f)).ok());
  ASSERT_TRUE(client.Pull(1, &params).ok());
  ASSERT_TRUE((*timeline)->Close().ok());
  EXPECT_TRUE(client.Shutdown().ok());

  std::ifstream in(path);
  const std::string events((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (int k = 0; k < 2; ++k) {
    // Lanes are threads, named in metadata events.
    for (const std::string lane : {"push shard ", "pull shard "}) {
      EXPECT_NE(events.find("\"" + lane + std::to_string(k) + "\""), std::string::npos)
          << "no lane " << lane << k << " in " << events;
    }
  }
  for (const char* event : {"{\"name\": \"encode\"", "{\"name\": \"push\"",
                            "{\"name\": \"pull\""}) {
    EXPECT_NE(events.find(event), std::string::npos) << event << " missing in " << events;
  }
  // Two pulls of two shards, at versions 0 and 1.
  EXPECT_NE(events.find("\"args\": {\"step\": 1}"), std::string::npos) << events;
}

// A pull whose caller gives up (its deadline passes) while it waits is freed
// on the shard at once, not when its own, much later, timeout comes.
TEST(PsClientTest, APullWhoseCallerIsGoneIsFreedAtOnce) {
  LocalPs ps;
  const auto vars = Variables(10);
  auto chief = NewClient({&ps}, 0, vars);
  ASSERT_TRUE(chief->Init(SyncConfig(1), Filled(vars, 1.0f)).ok());
  auto stub = proto::ParameterServer::NewStub(
      grpc::CreateChannel(ps.address(), grpc::InsecureChannelCredentials()));
  proto::PullRequest request;
  request.set_min_version(1000);
  request.set_timeout_ms(600000);
  proto::PullResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
  const grpc::Status status = stub->Pull(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (ps.shard().GetStatus().waiting_pulls() > 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(ps.shard().GetStatus().waiting_pulls(), 0);
  EXPECT_TRUE(chief->Shutdown().ok());
}

// Roles: with a chief token, a worker's credentials cannot Init, Save,
// Restore or end training; the chief's can, and a worker may still say
// goodbye for itself.
TEST(PsClientTest, AdminCallsNeedTheChiefsToken) {
  TransportSecurityOptions options;
  options.auth_token = "worker-secret";
  options.chief_token = "chief-secret";
  absl::StatusOr<TransportSecurity> loaded = LoadTransportSecurity(options);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  auto workers = std::make_shared<const TransportSecurity>(*loaded);
  auto chief = std::make_shared<const TransportSecurity>(loaded->ForChief());
  LocalPs ps(0, 1, workers);
  const auto vars = Variables(10);
  auto as_worker = NewClient({&ps}, 1, vars, absl::Seconds(1), 1, workers);
  auto as_chief = NewClient({&ps}, 0, vars, absl::Seconds(1), 1, chief);
  ASSERT_TRUE(as_worker->WaitForServers(absl::Seconds(10)).ok());

  const absl::Status init = as_worker->Init(SyncConfig(2), Filled(vars, 1.0f));
  EXPECT_EQ(init.code(), absl::StatusCode::kPermissionDenied) << init;
  EXPECT_NE(init.message().find("only the chief"), std::string::npos) << init;
  ASSERT_TRUE(as_chief->Init(SyncConfig(2), Filled(vars, 1.0f)).ok());
  EXPECT_EQ(as_worker->Save(0, -1, 1).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(as_worker->Restore(0, 1).code(), absl::StatusCode::kPermissionDenied);
  // Saving and restoring need a checkpoint directory, which this ps lacks:
  // the chief gets past the role check to that error.
  EXPECT_EQ(as_chief->Save(0, -1, 1).code(), absl::StatusCode::kFailedPrecondition);

  // A worker's goodbye is its own business; ending training is not.
  PsClient::Options operator_options;
  operator_options.ps_addresses = {ps.address()};
  operator_options.replica = -1;
  operator_options.retry_timeout = absl::Seconds(1);
  operator_options.security = workers;
  auto placement = ComputePlacement({}, 1, PlacementOptions());
  PsClient impostor(operator_options, *placement, {});
  const absl::Status refused = impostor.Shutdown();
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied) << refused;
  EXPECT_NE(refused.message().find("only the chief may call it"), absl::string_view::npos)
      << refused;
  EXPECT_FALSE(ps.shard().GetStatus().training_done());
  EXPECT_TRUE(as_worker->Shutdown().ok());
  EXPECT_FALSE(ps.shard().GetStatus().training_done());
  EXPECT_TRUE(as_chief->Shutdown().ok());
  EXPECT_TRUE(ps.shard().GetStatus().training_done());
}

TEST(PsClientTest, AStripeCountMismatchIsNamed) {
  LocalPs ps(0, /*stripes=*/2);
  const auto vars = Variables(10);
  auto client = NewClient({&ps}, 0, vars, absl::Seconds(60), /*stripes=*/1);
  absl::Status status = client->WaitForServers(absl::Seconds(10));
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(status.message().find("serves 2 stripes"), absl::string_view::npos) << status;
  EXPECT_NE(status.message().find("--ps_stripes=1"), absl::string_view::npos) << status;
  // A client that skips the check and names a stripe the task lacks is
  // refused by the task, with the stripe named.
  auto over = NewClient({&ps}, 0, vars, absl::Seconds(60), /*stripes=*/3);
  absl::Status init = over->Init(SyncConfig(1), Filled(vars, 1.0f));
  EXPECT_EQ(init.code(), absl::StatusCode::kInvalidArgument) << init;
  EXPECT_NE(init.message().find("stripe \"2\""), absl::string_view::npos) << init;
}

// A pull that waits for the other replica's push says how long it waited
// (PullHeader.waited_us), so the trainer can tell waiting from the wire.
TEST_P(PsClientTransportTest, PullReportsHowLongItWaitedForTheVersion) {
  auto ps = Ps();
  const auto vars = Variables(10);
  auto chief = Client({ps.get()}, 0, vars);
  auto other = Client({ps.get()}, 1, vars);
  ASSERT_TRUE(chief->WaitForServers(absl::Seconds(10)).ok());
  ASSERT_TRUE(chief->Init(SyncConfig(2), Filled(vars, 1.0f)).ok());
  ASSERT_TRUE(other->WaitForModelReady(absl::Seconds(10)).ok());
  std::vector<Tensor> params = Filled(vars, 0.0f);
  for (PsClient* client : {chief.get(), other.get()}) {
    auto pulled = client->Pull(0, &params);
    ASSERT_TRUE(pulled.ok()) << pulled.status();
    EXPECT_LT(pulled->waited, absl::Milliseconds(500));  // Answered at once.
  }
  ASSERT_TRUE(chief->Push(Filled(vars, 1.0f)).ok());
  std::thread late([&] {
    absl::SleepFor(absl::Seconds(1));
    ASSERT_TRUE(other->Push(Filled(vars, 1.0f)).ok());
  });
  auto next = chief->Pull(1, &params);  // Waits for the other's push.
  late.join();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->version, 1);
  EXPECT_GE(next->waited, absl::Milliseconds(900));
  EXPECT_TRUE(chief->Shutdown().ok());
  EXPECT_TRUE(other->Shutdown().ok());
}

// The one replica's sync step (learning rate 0.5): parameters 1, gradient 2.
void StepFromOnesToZeros(PsClient& client, const std::vector<VariableDef>& vars) {
  ASSERT_TRUE(client.WaitForServers(absl::Seconds(10)).ok());
  ASSERT_TRUE(client.Init(SyncConfig(1), Filled(vars, 1.0f)).ok());
  std::vector<Tensor> params = Filled(vars, 0.0f);
  ASSERT_TRUE(client.Pull(0, &params).ok());
  auto pushed = client.Push(Filled(vars, 2.0f));
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  auto next = client.Pull(1, &params);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(params[1].data()[0], 0.0f);  // 1 - 0.5 * 2.
  EXPECT_TRUE(client.Shutdown().ok());
}

// A shard that serves only its Unix socket (psrt_ps --unix_socket) is
// reached by a client with unix_socket, and only by it: the step goes over
// the socket, not TCP.
TEST(PsClientTest, UnixSocketReachesAShardOnThisHost) {
  SilentListener silent;  // The shard's TCP address: only its Unix socket answers.
  ParameterShard shard{ParameterShard::Options()};
  PsService service({&shard});
  grpc::ServerBuilder builder;
  ConfigurePsServer(&builder, int64_t{1} << 30);
  builder.AddListeningPort(LocalSocketAddress(silent.port()), grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);

  const auto vars = Variables(10);
  auto placement = ComputePlacement(vars, 1, PlacementOptions());
  ASSERT_TRUE(placement.ok());
  PsClient::Options options;
  options.ps_addresses = {absl::StrCat("127.0.0.1:", silent.port())};
  options.retry_timeout = absl::Seconds(1);
  PsClient tcp(options, *placement, vars);
  EXPECT_FALSE(tcp.WaitForServers(absl::Seconds(1)).ok());
  options.unix_socket = true;
  PsClient local(options, *placement, vars);
  StepFromOnesToZeros(local, vars);
  server->Shutdown();
}

// A client of `ps` whose pushes and pulls take its data plane.
std::unique_ptr<PsClient> DataPlaneClient(LocalPs& ps, const std::vector<VariableDef>& vars) {
  PsClient::Options options;
  options.ps_addresses = {ps.address()};
  options.tensor_transport = TensorTransport::kDataPlane;
  options.retry_timeout = absl::Seconds(20);
  absl::StatusOr<Placement> placement = ComputePlacement(vars, 1, PlacementOptions());
  CHECK(placement.ok()) << placement.status();
  return std::make_unique<PsClient>(options, *placement, vars);
}

// The data plane of a ps on the worker's host goes over the ps's Unix
// socket (psrt_ps --local_data_plane), not TCP: with the TCP port it names
// held by a socket that never answers, the step still goes.
TEST(PsClientTest, TheDataPlaneTakesTheUnixSocketOfAPsOnThisHost) {
  SilentListener silent;
  LocalPs ps;
  ps.ServeDataPlane();
  ASSERT_EQ(ps.data_planes.size(), 2u);
  ps.service.set_data_plane(silent.port(), ps.data_planes.back()->address());
  const auto vars = Variables(10);
  std::unique_ptr<PsClient> client = DataPlaneClient(ps, vars);
  StepFromOnesToZeros(*client, vars);
  EXPECT_EQ(PsClientTransportTest::DataPlanePushes({&ps}), 1);
}

// A Unix socket that is not there (the ps runs on another host, or in
// another network namespace) is passed over for TCP.
TEST(PsClientTest, TheDataPlaneTakesTcpWhereTheUnixSocketIsNotThere) {
  LocalPs ps;
  ps.ServeDataPlane(/*local_socket=*/false);
  ps.service.set_data_plane(ps.data_planes.front()->port(),
                            "unix-abstract:psrt-data-of-a-ps-on-another-host");
  const auto vars = Variables(10);
  std::unique_ptr<PsClient> client = DataPlaneClient(ps, vars);
  StepFromOnesToZeros(*client, vars);
  EXPECT_EQ(PsClientTransportTest::DataPlanePushes({&ps}), 1);
}

// psrt_ps --max_grpc_memory_mb: a request that does not fit in the bound on
// gRPC's buffers is refused, with an error that names the flags; requests
// that fit go through.
TEST(PsClientTest, ARequestBeyondTheMemoryBoundIsRefused) {
  ParameterShard shard{ParameterShard::Options()};
  PsService service({&shard});
  grpc::ServerBuilder builder;
  ConfigurePsServer(&builder, int64_t{1} << 30, /*max_memory_bytes=*/int64_t{8} << 20);
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  PsClient::Options options;
  options.ps_addresses = {absl::StrCat("127.0.0.1:", port)};
  options.retry_timeout = absl::Seconds(1);
  // 1 MB fits; 24 MB does not.
  for (const int64_t rows : {int64_t{256}, int64_t{6000}}) {
    const auto vars = Variables(rows);
    auto placement = ComputePlacement(vars, 1, PlacementOptions());
    ASSERT_TRUE(placement.ok());
    PsClient client(options, *placement, vars);
    ASSERT_TRUE(client.WaitForServers(absl::Seconds(10)).ok());
    absl::Status init = client.Init(SyncConfig(1), Filled(vars, 1.0f));
    if (rows == 256) {
      EXPECT_TRUE(init.ok()) << init;
      continue;
    }
    EXPECT_EQ(init.code(), absl::StatusCode::kResourceExhausted) << init;
    EXPECT_NE(init.message().find("--max_grpc_memory_mb"), absl::string_view::npos) << init;
  }
  server->Shutdown();
}

TEST(PsClientTest, WorkerWithAnotherModelIsRefused) {
  LocalPs ps0;
  auto chief = NewClient({&ps0}, 0, Variables());
  ASSERT_TRUE(chief->Init(SyncConfig(2), Filled(Variables(), 0.0f)).ok());
  auto other = NewClient({&ps0}, 1, Variables(/*rows=*/100));
  auto config = other->WaitForModelReady(absl::Seconds(5));
  EXPECT_EQ(config.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(config.status().message().find("ps/0"), absl::string_view::npos);
}

TEST(PsClientTest, WaitForServersNamesTheMissingShard) {
  LocalPs ps0;
  PsClient::Options options;
  // Port 1 on loopback: nothing listens there.
  options.ps_addresses = {ps0.address(), "127.0.0.1:1"};
  auto placement = ComputePlacement(Variables(), 2, PlacementOptions());
  PsClient client(options, *placement, Variables());
  absl::Status status = client.WaitForServers(absl::Seconds(1));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(status.message().find("ps/1 (127.0.0.1:1)"), absl::string_view::npos) << status;
  EXPECT_EQ(status.message().find("ps/0"), absl::string_view::npos) << status;
}

TEST_P(PsClientTransportTest, RejectedPushKeepsItsErrorAndTheShardsIncarnation) {
  auto ps0 = Ps(), ps1 = Ps();
  const auto vars = Variables(/*rows=*/100);
  auto chief = Client({ps0.get(), ps1.get()}, 0, vars);
  ASSERT_TRUE(chief->WaitForServers(absl::Seconds(10)).ok());
  proto::TrainingConfig config = SyncConfig(1);
  config.set_mode(proto::ASYNC);
  ASSERT_TRUE(chief->Init(config, Filled(vars, 1.0f)).ok());
  std::vector<Tensor> params = Filled(vars, 0.0f);
  ASSERT_TRUE(chief->Pull(0, &params).ok());
  std::vector<Tensor> grads = Filled(vars, 0.0f);
  grads[1].data()[3] = std::nanf("");
  auto pushed = chief->Push(grads);
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kInvalidArgument) << pushed.status();
  EXPECT_NE(pushed.status().message().find("\"small\""), absl::string_view::npos)
      << pushed.status();
  // Nothing restarted: the next step goes through.
  grads[1].data()[3] = 0;
  EXPECT_TRUE(chief->Push(grads).ok());
  EXPECT_TRUE(chief->Pull(0, &params).ok());
}

TEST_P(PsClientTransportTest, RetriesARestartingShardAndReportsItsNewIncarnation) {
  const auto vars = Variables(/*rows=*/100);
  auto ps = Ps();
  const int port = ps->port;
  auto client = Client({ps.get()}, 0, vars);
  proto::TrainingConfig config = SyncConfig(1);
  config.set_mode(proto::ASYNC);
  ASSERT_TRUE(client->Init(config, Filled(vars, 1.0f)).ok());
  std::vector<Tensor> params = Filled(vars, 0.0f);
  ASSERT_TRUE(client->Pull(0, &params).ok());

  ps.reset();  // The task dies; it comes back on its port 500 ms later.
  std::thread restart([&] {
    absl::SleepFor(absl::Milliseconds(500));
    auto back = Ps(port);  // Its data plane, if any, on another port.
    proto::InitHeader header;  // As the chief would confirm it.
    *header.mutable_config() = config;
    std::vector<Tensor> values = Filled(vars, 2.0f);
    proto::VariableMeta* big = header.add_variables();
    big->set_name("big");
    big->set_dtype(proto::DT_FLOAT);
    big->add_shape(100);
    big->add_shape(1024);
    proto::VariableMeta* small = header.add_variables();
    small->set_name("small");
    small->set_dtype(proto::DT_FLOAT);
    small->add_shape(10);
    std::string bytes(reinterpret_cast<const char*>(values[0].data()), values[0].num_bytes());
    bytes.append(reinterpret_cast<const char*>(values[1].data()), values[1].num_bytes());
    SpanByteSource source(bytes);
    ASSERT_TRUE(back->shard().Init(header, &source).ok());
    ps = std::move(back);
  });
  absl::StatusOr<PsClient::PullResult> pulled = client->Pull(0, &params);
  restart.join();
  EXPECT_EQ(pulled.status().code(), absl::StatusCode::kAborted) << pulled.status();
  EXPECT_NE(pulled.status().message().find("restarted or was rolled back"),
            absl::string_view::npos)
      << pulled.status();
  client->ForgetIncarnations();
  ASSERT_TRUE(client->Pull(0, &params).ok());
  EXPECT_EQ(params[1].data()[0], 2.0f);
}

TEST_P(PsClientTransportTest, GivesUpOnAShardThatStaysDown) {
  const auto vars = Variables(/*rows=*/100);
  auto ps = Ps();
  auto client = Client({ps.get()}, 0, vars, /*retry_timeout=*/absl::Seconds(1));
  proto::TrainingConfig config = SyncConfig(1);
  ASSERT_TRUE(client->Init(config, Filled(vars, 1.0f)).ok());
  ps.reset();
  std::vector<Tensor> params = Filled(vars, 0.0f);
  const absl::Time start = absl::Now();
  absl::StatusOr<PsClient::PullResult> pulled = client->Pull(0, &params);
  EXPECT_EQ(pulled.status().code(), absl::StatusCode::kUnavailable) << pulled.status();
  EXPECT_NE(pulled.status().message().find("of retries"), absl::string_view::npos)
      << pulled.status();
  EXPECT_GE(absl::Now() - start, absl::Seconds(1));
}

}  // namespace
}  // namespace psrt
