// WorkerStatusServer: the small gRPC server of a worker, chief or evaluator
// task, on the task's own address of the cluster spec. It serves
//  - WorkerStatus (proto/psrt.proto): role, state, global step, local steps,
//    examples/sec and the process, read from the task's WorkerMetrics;
//  - gRPC's standard health service for "" and "psrt.proto.WorkerStatus":
//    SERVING while the task trains (or evaluates), NOT_SERVING while it
//    waits for the parameter servers or the chief, and once it is done;
//  - Drain (psrtctl drain): calls Options::drain;
//  - the services the task adds (allreduce mode's Collective, an elastic
//    chief's Membership).
// It is the gRPC adapter of the worker's progress; the trainer only sees
// WorkerMetrics.
//
// Thread safety: gRPC calls the handler concurrently; WorkerMetrics is
// thread-safe. Start and destruction happen on one thread.
#ifndef PSRT_WORKER_WORKER_STATUS_SERVICE_H_
#define PSRT_WORKER_WORKER_STATUS_SERVICE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/health_reporter.h"
#include "common/metrics.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "proto/psrt.grpc.pb.h"

namespace psrt {

class WorkerStatusServer {
 public:
  struct Options {
    std::string listen_address;  // "host:port"; an IPv6 host in brackets.
    std::shared_ptr<grpc::ServerCredentials> credentials;
    std::string job;  // "worker", "chief" or "evaluator".
    int task_index = 0;
    int replica = 0;  // -1: the evaluator.
    // Served on the same port, without a message size cap (allreduce
    // mode's Collective). REQUIRES: they outlive the server.
    std::vector<grpc::Service*> services;
    // Drain's work (an elastic job's worker); null: FailedPrecondition.
    std::function<absl::Status()> drain;
    // Also serve on this address (allreduce mode's Unix socket); "": no.
    std::string local_socket;
  };

  // Starts serving and installs itself as `metrics`' state listener.
  // Unavailable naming the address when it cannot listen there (in use).
  // REQUIRES: `metrics` outlives the server and its state has not changed
  // yet.
  static absl::StatusOr<std::unique_ptr<WorkerStatusServer>> Start(
      const Options& options, WorkerMetrics* metrics);
  // Reports NOT_SERVING and stops the server.
  ~WorkerStatusServer();

 private:
  class Service;
  WorkerStatusServer(std::unique_ptr<Service> service,
                     std::shared_ptr<HealthReporter> health);

  std::unique_ptr<Service> service_;
  // Shared with the state listener, which may outlive the server.
  std::shared_ptr<HealthReporter> health_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace psrt

#endif  // PSRT_WORKER_WORKER_STATUS_SERVICE_H_
