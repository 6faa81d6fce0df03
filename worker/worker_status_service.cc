#include "worker/worker_status_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rpc_util.h"
#include "glog/logging.h"
#include "grpcpp/server_builder.h"

namespace psrt {

class WorkerStatusServer::Service final : public proto::WorkerStatus::CallbackService {
 public:
  Service(const Options& options, const WorkerMetrics* metrics)
      : options_(options), metrics_(metrics) {}

  grpc::ServerUnaryReactor* GetWorkerStatus(grpc::CallbackServerContext* context,
                                            const proto::WorkerStatusRequest* /*request*/,
                                            proto::WorkerStatusResponse* response) override {
    response->set_job(options_.job);
    response->set_task_index(options_.task_index);
    response->set_replica(options_.replica);
    response->set_state(metrics_->state());
    response->set_global_step(metrics_->global_step());
    response->set_local_steps(metrics_->local_steps());
    response->set_examples_per_sec(metrics_->examples_per_sec());
    *response->mutable_process() = metrics_->metrics().process_status();
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* context,
                                  const proto::DrainRequest* /*request*/,
                                  proto::DrainResponse* /*response*/) override {
    const absl::Status status =
        options_.drain ? options_.drain()
                       : absl::FailedPreconditionError(absl::StrCat(
                             options_.job, " ", options_.task_index,
                             " cannot be drained: only a worker other than the chief of an "
                             "elastic job (--max_workers) can leave it"));
    LOG_IF(INFO, status.ok()) << "drain asked: leaving after the current step";
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }

 private:
  const Options options_;
  const WorkerMetrics* const metrics_;
};

WorkerStatusServer::WorkerStatusServer(std::unique_ptr<Service> service,
                                       std::shared_ptr<HealthReporter> health)
    : service_(std::move(service)), health_(std::move(health)) {}

absl::StatusOr<std::unique_ptr<WorkerStatusServer>> WorkerStatusServer::Start(
    const Options& options, WorkerMetrics* metrics) {
  auto health = std::make_shared<HealthReporter>(
      std::vector<std::string>{proto::WorkerStatus::service_full_name()});
  HealthReporter::EnableHealthService();
  std::unique_ptr<WorkerStatusServer> server(new WorkerStatusServer(
      std::make_unique<Service>(options, metrics), health));

  grpc::ServerBuilder builder;
  ConfigurePsServer(&builder, options.services.empty() ? 1 << 20 : int64_t{1} << 31);
  int bound_port = 0;
  builder.AddListeningPort(options.listen_address, options.credentials, &bound_port);
  if (!options.local_socket.empty()) {
    builder.AddListeningPort(options.local_socket, options.credentials);
  }
  builder.RegisterService(server->service_.get());
  for (grpc::Service* service : options.services) builder.RegisterService(service);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || bound_port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen_address, " (",
                                               WhyCannotListen(options.listen_address), ")"));
  }
  health->Attach(server->server_.get());
  metrics->SetStateListener([health](proto::WorkerState state) {
    health->Set(state == proto::WORKER_TRAINING || state == proto::WORKER_EVALUATING);
  });
  return server;
}

WorkerStatusServer::~WorkerStatusServer() {
  if (server_ == nullptr) return;
  health_->Set(false);
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server_->Wait();
  health_->Detach();
}

}  // namespace psrt
