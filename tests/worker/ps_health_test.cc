// A parameter server answers health checks while slow pushes are applied:
// updates run on the service's own threads, not on gRPC's few callback
// threads, so a busy ps is not killed by its liveness probe.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "common/health_reporter.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "tests/worker/local_ps.h"

namespace psrt {
namespace {

TEST(PsHealthTest, HealthChecksAreAnsweredWhileSlowPushesAreApplied) {
  HealthReporter::EnableHealthService();  // Before the server is built.
  ParameterShard::Options shard_options;
  shard_options.threads = 1;
  LocalPs ps(0, /*stripes=*/1, nullptr, shard_options);
  HealthReporter health({proto::ParameterServer::service_full_name()});
  health.Attach(ps.server.get());
  health.Set(true);

  // 16M floats under Adam, async: every push's update reads and writes
  // values and both slots, 64 MB each, one push at a time on one thread.
  constexpr int kReplicas = 4;
  const std::vector<VariableDef> vars = {{"w", {4096, 4096}}};
  proto::TrainingConfig config;
  config.set_mode(proto::ASYNC);
  config.set_num_replicas(kReplicas);
  config.set_optimizer(proto::ADAM);
  config.set_learning_rate(1e-3f);
  config.set_beta1(0.9f);
  config.set_beta2(0.999f);
  config.set_epsilon(1e-8f);
  std::vector<std::unique_ptr<PsClient>> clients;
  for (int r = 0; r < kReplicas; ++r) clients.push_back(NewClient({&ps}, r, vars));
  ASSERT_TRUE(clients[0]->WaitForServers(absl::Seconds(10)).ok());
  absl::Status init = clients[0]->Init(config, Filled(vars, 0.5f));
  ASSERT_TRUE(init.ok()) << init;

  std::atomic<int> pushing{kReplicas};
  std::vector<std::thread> workers;
  for (int r = 0; r < kReplicas; ++r) {
    workers.emplace_back([&, r] {
      std::vector<Tensor> params = Filled(vars, 0.0f);
      const std::vector<Tensor> grads = Filled(vars, 1e-3f);
      EXPECT_TRUE(clients[r]->Pull(0, &params).ok());
      for (int i = 0; i < 5; ++i) {
        auto pushed = clients[r]->Push(grads);
        EXPECT_TRUE(pushed.ok()) << pushed.status();
      }
      --pushing;
    });
  }
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(ps.address(), grpc::InsecureChannelCredentials()));
  int checks_during_pushes = 0;
  absl::Duration slowest;
  while (pushing > 0) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(kLivenessService);
    grpc::health::v1::HealthCheckResponse response;
    const absl::Time start = absl::Now();
    grpc::Status status = stub->Check(&context, request, &response);
    const absl::Duration took = absl::Now() - start;
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
    if (pushing > 0) {
      ++checks_during_pushes;
      slowest = std::max(slowest, took);
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  for (std::thread& t : workers) t.join();
  std::printf("health: %d checks during pushes, slowest %s\n", checks_during_pushes,
              absl::FormatDuration(slowest).c_str());
  EXPECT_GE(checks_during_pushes, 3);
  // A check waiting behind the 20 updates would take seconds; one that
  // waits only for a core (the machine may be busy) does not.
  EXPECT_LT(slowest, absl::Seconds(2)) << checks_during_pushes << " checks";
  health.Detach();
}

}  // namespace
}  // namespace psrt
