// PsService: the gRPC face of a ps process's ParameterShards, its stripes
// (proto/psrt.proto's ParameterServer service and "Stripes"), on gRPC's
// callback API.
//
// Pushes and pulls go to the ps's RequestHandler (request_handler.h), as the
// data plane's do (dataplane_server.h): this adapter reads the frame, checks
// the caller's roles and sends the answer. The control calls find the stripe
// the call names, validate, call that shard and finish with the converted
// status; Shutdown goes to every stripe. Init, Pull and Push are "raw"
// methods: the shard reads tensor bytes straight from the received slices
// and pulls send the shard's values buffer itself, without a protobuf copy
// (common/tensor_frame.h). A pull that must wait for a version holds no
// thread while it waits (its reactor cancels it when the caller goes away).
// The slow handlers (Init, Push, Save, Restore) run on the service's own
// threads, so that gRPC's callback threads stay free for health checks,
// status and pulls.
//
// It also adds the process and traffic to GetStatus's reply, and reports
// the shard's readiness to the standard health service (NOT_SERVING until
// the chief has made every stripe ready) and PsMetrics (common/metrics.h).
//
// Thread safety: gRPC calls the handlers concurrently; the shards, the
// metrics and the health reporter are thread-safe.
#ifndef PSRT_PS_PS_SERVICE_H_
#define PSRT_PS_PS_SERVICE_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/health_reporter.h"
#include "common/task_runner.h"
#include "common/metrics.h"
#include "proto/psrt.grpc.pb.h"
#include "ps/parameter_shard.h"
#include "ps/request_handler.h"

namespace psrt {

using PsServiceBase = proto::ParameterServer::WithRawCallbackMethod_Init<
    proto::ParameterServer::WithRawCallbackMethod_Pull<
        proto::ParameterServer::WithRawCallbackMethod_Push<
            proto::ParameterServer::WithCallbackMethod_GetStatus<
                proto::ParameterServer::WithCallbackMethod_Shutdown<
                    proto::ParameterServer::WithCallbackMethod_Save<
                        proto::ParameterServer::WithCallbackMethod_Restore<
                            proto::ParameterServer::WithRawCallbackMethod_Replicate<
                                proto::ParameterServer::WithCallbackMethod_SetMembers<
                                    proto::ParameterServer::Service>>>>>>>>>;

// Who may do what at a PsService; refusals are PermissionDenied.
struct PsServiceRoles {
  // Init, Save, Restore, SetMembers and a Shutdown that ends training only from calls
  // with the chief's token (TransportSecurity's roles).
  bool chief_only_admin = false;
  // Replica r's host as the cluster spec names it; non-empty: a push as
  // replica r only from a caller whose TLS certificate names that host
  // (psrt_ps --check_replica_certificates).
  std::vector<std::string> replica_hosts;
};

class PsService final : public PsServiceBase {
 public:
  using Roles = PsServiceRoles;

  // Stripe s is shards[s]. REQUIRES: shards is not empty; the shards
  // outlive the service; `metrics` and `health` (either may be null: not
  // reported) outlive the shards.
  explicit PsService(std::vector<ParameterShard*> shards,
                     PsMetrics* metrics = nullptr, HealthReporter* health = nullptr,
                     Roles roles = {})
      : handler_(std::move(shards), metrics),
        metrics_(metrics),
        health_(health),
        roles_(std::move(roles)),
        runner_(static_cast<int>(2 * handler_.shards().size())),
        replica_runner_(static_cast<int>(handler_.shards().size())) {}

  // Publishes the readiness (every stripe ready) and version (the lowest) to
  // the health service and the metrics. The handlers call it after Init and
  // Restore; call it once when the server has started (a shard may have
  // restored a checkpoint).
  void ReportReadiness();

  // The data plane's TCP port (0: none) and Unix socket address ("": none),
  // for GetStatus's replies. REQUIRES: no GetStatus runs meanwhile (psrt_ps
  // sets them before its server starts).
  void set_data_plane(int port, std::string local_address) {
    data_port_ = port;
    data_plane_local_address_ = std::move(local_address);
  }
  // psrt_ps --ps_replicas, for GetStatus's replies: the process's stripes
  // are then its own shards' and, after them, as many backup copies.
  void set_ps_replicas(int replicas) { ps_replicas_ = replicas; }

  grpc::ServerUnaryReactor* Init(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const proto::StatusRequest* request,
                                      proto::StatusResponse* response) override;
  grpc::ServerUnaryReactor* SetMembers(grpc::CallbackServerContext* context,
                                       const proto::MembersRequest* request,
                                       proto::MembersResponse* response) override;
  grpc::ServerUnaryReactor* Shutdown(grpc::CallbackServerContext* context,
                                     const proto::ShutdownRequest* request,
                                     proto::ShutdownResponse* response) override;
  grpc::ServerUnaryReactor* Save(grpc::CallbackServerContext* context,
                                 const proto::SaveRequest* request,
                                 proto::SaveResponse* response) override;
  grpc::ServerUnaryReactor* Restore(grpc::CallbackServerContext* context,
                                    const proto::RestoreRequest* request,
                                    proto::RestoreResponse* response) override;
  grpc::ServerUnaryReactor* Replicate(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;

 private:
  // The stripe the call names; InvalidArgument for one this process lacks.
  absl::StatusOr<ParameterShard*> ShardOf(const grpc::CallbackServerContext& context) const;

  // Runs `work` on runner_ and finishes the call with its status: the slow
  // handlers (Init, Push, Save, Restore) keep gRPC's callback threads free
  // for health checks, status and pulls.
  grpc::ServerUnaryReactor* Offload(grpc::CallbackServerContext* context,
                                    std::function<absl::Status()> work);
  // PermissionDenied for an admin call (`what`) without the chief's role.
  absl::Status CheckChief(const grpc::CallbackServerContext& context,
                          absl::string_view what) const;
  // PermissionDenied for a push as `replica` from a caller whose
  // certificate does not name the replica's host (Roles::replica_hosts).
  absl::Status CheckReplica(const grpc::CallbackServerContext& context, int replica) const;

  const RequestHandler handler_;
  PsMetrics* const metrics_;
  HealthReporter* const health_;
  const Roles roles_;
  int data_port_ = 0;
  std::string data_plane_local_address_;
  int ps_replicas_ = 0;
  TaskRunner runner_;  // Last: its threads stop before the rest goes.
  // Replicate's own threads: a primary holds its shard while it waits for
  // the backup, so the backup's work must not queue behind pushes.
  TaskRunner replica_runner_;
};

}  // namespace psrt

#endif  // PSRT_PS_PS_SERVICE_H_
