// Helpers of the worker tests that talk to real parameter servers in their
// own process: a ps task (its stripes, service and gRPC server on
// 127.0.0.1, and its data plane when asked) and clients of it.
#ifndef PSRT_TESTS_WORKER_LOCAL_PS_H_
#define PSRT_TESTS_WORKER_LOCAL_PS_H_

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/metrics.h"
#include "common/placement.h"
#include "common/rpc_util.h"
#include "common/tensor_transport.h"
#include "common/transport_security.h"
#include "dataplane/frame_connection.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "ps/dataplane_server.h"
#include "ps/parameter_shard.h"
#include "ps/ps_service.h"
#include "worker/store/ps_client.h"

namespace psrt {

// One parameter-server task: its shards (stripes) + service + gRPC server
// on a free port. `port` 0 picks a free one; another restarts a task on its
// old port.
struct LocalPs {
  // With `security`, its credentials, and roles when it has a chief token.
  // `shard_options` configures every stripe (its shard index and count are
  // set here).
  explicit LocalPs(int port_to_use = 0, int stripes = 1,
                   std::shared_ptr<const TransportSecurity> security = nullptr,
                   ParameterShard::Options shard_options = {},
                   std::vector<std::string> replica_hosts = {})
      : shards(MakeShards(stripes, std::move(shard_options))),
        service(Pointers(shards), nullptr, nullptr,
                PsService::Roles{security != nullptr && security->has_chief_token(),
                                 std::move(replica_hosts)}) {
    grpc::ServerBuilder builder;
    ConfigurePsServer(&builder, int64_t{1} << 30);
    builder.AddListeningPort(
        absl::StrCat("127.0.0.1:", port_to_use),
        security ? security->ServerCredentials() : grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~LocalPs() { server->Shutdown(); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port); }
  ParameterShard& shard(int stripe = 0) { return *shards[stripe]; }

  // Serves the data plane too (psrt_ps --tensor_transport=data_plane), on a
  // free port of 127.0.0.1 and, with `local_socket`, on a Unix socket of its
  // own (psrt_ps --local_data_plane), without TLS or token, counting what it
  // serves into data_plane_metrics.
  void ServeDataPlane(bool local_socket = true) {
    DataPlaneServer::Options options;
    options.security = std::make_shared<const TransportSecurity>();
    options.metrics = &data_plane_metrics;
    std::vector<std::string> addresses = {"127.0.0.1:0"};
    if (local_socket) addresses.push_back(dataplane::NewLocalDataPlaneAddress(port));
    for (const std::string& address : addresses) {
      options.listen_address = address;
      absl::StatusOr<std::unique_ptr<DataPlaneServer>> started =
          DataPlaneServer::Start(Pointers(shards), options);
      ASSERT_TRUE(started.ok()) << started.status();
      data_planes.push_back(*std::move(started));
    }
    service.set_data_plane(data_planes.front()->port(),
                           local_socket ? data_planes.back()->address() : "");
  }

  static std::vector<std::unique_ptr<ParameterShard>> MakeShards(
      int n, ParameterShard::Options options) {
    std::vector<std::unique_ptr<ParameterShard>> shards;
    for (int i = 0; i < n; ++i) {
      options.shard = i;
      options.num_shards = n;
      shards.push_back(std::make_unique<ParameterShard>(options));
    }
    return shards;
  }
  static std::vector<ParameterShard*> Pointers(
      const std::vector<std::unique_ptr<ParameterShard>>& shards) {
    std::vector<ParameterShard*> pointers;
    for (const auto& shard : shards) pointers.push_back(shard.get());
    return pointers;
  }

  std::vector<std::unique_ptr<ParameterShard>> shards;
  PsService service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
  Metrics metrics{Metrics::Options{"ps"}};
  PsMetrics data_plane_metrics{&metrics};
  // TCP, then the Unix socket; none: gRPC only.
  std::vector<std::unique_ptr<DataPlaneServer>> data_planes;
};

inline std::unique_ptr<PsClient> NewClient(const std::vector<LocalPs*>& tasks, int replica,
                                    const std::vector<VariableDef>& vars,
                                    absl::Duration retry_timeout = absl::Seconds(60),
                                    int stripes = 1,
                                    std::shared_ptr<const TransportSecurity> security = nullptr,
                                    const PlacementOptions& placement_options = {}) {
  PsClient::Options options;
  options.security = std::move(security);
  options.retry_timeout = retry_timeout;
  for (LocalPs* ps : tasks) options.ps_addresses.push_back(ps->address());
  options.ps_stripes = stripes;
  options.replica = replica;
  options.rpc_timeout = absl::Seconds(30);
  options.pull_timeout = absl::Seconds(30);
  auto placement = ComputePlacement(vars, tasks.size() * stripes, placement_options);
  EXPECT_TRUE(placement.ok());
  return std::make_unique<PsClient>(options, *placement, vars);
}

inline std::vector<Tensor> Filled(const std::vector<VariableDef>& vars, float value) {
  std::vector<Tensor> tensors;
  for (const VariableDef& v : vars) {
    tensors.emplace_back(v.shape);
    std::fill_n(tensors.back().data(), tensors.back().num_elements(), value);
  }
  return tensors;
}

inline proto::TrainingConfig SyncConfig(int replicas) {
  proto::TrainingConfig config;
  config.set_mode(proto::SYNC);
  config.set_num_replicas(replicas);
  config.set_replicas_to_aggregate(replicas);
  config.set_optimizer(proto::SGD);
  config.set_learning_rate(0.5f);
  return config;
}

// The tests of pushes and pulls, once per transport of tensors (each test
// file instantiates it over kGrpc and kDataPlane).
class PsClientTransportTest : public ::testing::TestWithParam<TensorTransport> {
 public:
  // A ps task of `stripes` (on `port`; 0: a free one) that serves the
  // transport under test.
  std::unique_ptr<LocalPs> Ps(int port = 0, int stripes = 1) {
    auto ps = std::make_unique<LocalPs>(port, stripes);
    if (GetParam() == TensorTransport::kDataPlane) ps->ServeDataPlane();
    return ps;
  }
  std::unique_ptr<PsClient> Client(const std::vector<LocalPs*>& tasks, int replica,
                                   const std::vector<VariableDef>& vars,
                                   absl::Duration retry_timeout = absl::Seconds(60),
                                   int stripes = 1, proto::DataType wire = proto::DT_FLOAT,
                                   std::vector<proto::TableMeta> tables = {},
                                   Timeline* timeline = nullptr) {
    PsClient::Options options;
    for (LocalPs* ps : tasks) options.ps_addresses.push_back(ps->address());
    options.ps_stripes = stripes;
    options.replica = replica;
    options.retry_timeout = retry_timeout;
    options.rpc_timeout = absl::Seconds(30);
    options.pull_timeout = absl::Seconds(30);
    options.wire_dtype = wire;
    options.tensor_transport = GetParam();
    options.tables = std::move(tables);
    options.timeline = timeline;
    absl::StatusOr<Placement> placement =
        ComputePlacement(vars, tasks.size() * stripes, PlacementOptions());
    EXPECT_TRUE(placement.ok()) << placement.status();
    return std::make_unique<PsClient>(options, *placement, vars);
  }
  // Pushes the tasks' data planes served (0 over gRPC).
  static int64_t DataPlanePushes(const std::vector<LocalPs*>& tasks) {
    int64_t pushes = 0;
    for (LocalPs* ps : tasks) pushes += ps->data_plane_metrics.transfers().traffic().pushes();
    return pushes;
  }
};


}  // namespace psrt

#endif  // PSRT_TESTS_WORKER_LOCAL_PS_H_
