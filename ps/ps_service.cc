#include "ps/ps_service.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc_util.h"
#include "common/status_macros.h"
#include "common/tensor_frame.h"
#include "common/transport_security.h"
#include "glog/logging.h"
#include "grpcpp/support/byte_buffer.h"

namespace psrt {
namespace {

// How long an operator's prepared end holds a sync shard for its end_version.
constexpr absl::Duration kOperatorEndHold = absl::Seconds(30);

grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* context,
                                    const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// The stripe a call names ("0" when it names none).
absl::string_view StripeOf(const grpc::CallbackServerContext& context) {
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find(kStripeMetadata);
  if (it == metadata.end()) return "0";
  return absl::string_view(it->second.data(), it->second.size());
}

// A pull's reactor: when the caller goes away (cancelled, or past its
// deadline) while the pull waits, the shard frees the waiting pull at once.
// It lives until gRPC is done with it and Watch has run (the reply may be
// sent, and OnDone run, before the handler's Pull returns).
class PullReactor final : public grpc::ServerUnaryReactor {
 public:
  // The pull, if it waits. Call once.
  void Watch(RequestHandler::WaitingPull pull) {
    bool cancelled, done;
    {
      absl::MutexLock lock(&mu_);
      pull_ = pull;
      watched_ = true;
      cancelled = cancelled_;
      done = done_;
    }
    if (done) {
      delete this;
    } else if (cancelled) {
      pull.Cancel();
    }
  }
  void OnCancel() override {
    RequestHandler::WaitingPull pull;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      pull = pull_;
    }
    pull.Cancel();  // Finishes it, if still waiting.
  }
  void OnDone() override {
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      if (!watched_) return;  // Watch deletes it.
    }
    delete this;
  }

 private:
  absl::Mutex mu_;
  RequestHandler::WaitingPull pull_ ABSL_GUARDED_BY(mu_);
  bool watched_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

grpc::ServerUnaryReactor* PsService::Offload(grpc::CallbackServerContext* context,
                                             std::function<absl::Status()> work) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  runner_.Schedule([reactor, work = std::move(work)] { reactor->Finish(ToGrpcStatus(work())); });
  return reactor;
}

absl::StatusOr<ParameterShard*> PsService::ShardOf(
    const grpc::CallbackServerContext& context) const {
  return handler_.Stripe(StripeOf(context));
}

absl::Status PsService::CheckChief(const grpc::CallbackServerContext& context,
                                   absl::string_view what) const {
  if (!roles_.chief_only_admin ||
      !context.auth_context()->FindPropertyValues(kChiefRoleProperty).empty()) {
    return absl::OkStatus();
  }
  LOG_EVERY_T(WARNING, 10) << "refused " << what << " from " << context.peer()
                           << ": it did not come with the chief's token";
  return absl::PermissionDeniedError(
      absl::StrCat(what,
                   ": only the chief may call it, and this call came with the workers' "
                   "token, not the chief's (--chief_token_file)"));
}

absl::Status PsService::CheckReplica(const grpc::CallbackServerContext& context,
                                     int replica) const {
  const std::vector<std::string>& hosts = roles_.replica_hosts;
  // An unknown replica is the shard's to refuse, with its own message.
  if (hosts.empty() || replica < 0 || replica >= static_cast<int>(hosts.size())) {
    return absl::OkStatus();
  }
  std::vector<std::string> names;
  for (const grpc::string_ref& name : context.auth_context()->GetPeerIdentity()) {
    names.emplace_back(name.data(), name.size());
    if (names.back() == hosts[replica]) return absl::OkStatus();
  }
  LOG_EVERY_T(WARNING, 10) << "refused a push as replica " << replica << " from " << context.peer()
                           << " (" << absl::StrJoin(names, ", ") << ")";
  return absl::PermissionDeniedError(
      absl::StrCat("push as replica ", replica, ": its host in the cluster spec is ",
                   hosts[replica], ", and the caller's certificate names ",
                   names.empty() ? std::string("no host") : absl::StrJoin(names, ", "),
                   " (psrt_ps --check_replica_certificates: a worker pushes only as itself)"));
}

void PsService::ReportReadiness() {
  bool ready = true;
  int64_t version = INT64_MAX;
  for (ParameterShard* shard : handler_.shards()) {
    const proto::StatusResponse status = shard->GetStatus();
    if (status.backup()) continue;  // A backup copy serves nobody.
    ready = ready && status.ready();
    version = std::min(version, status.version());
  }
  if (health_ != nullptr) health_->Set(ready);
  if (metrics_ != nullptr) {
    metrics_->SetReady(ready);
    metrics_->SetVersion(version);
  }
}

grpc::ServerUnaryReactor* PsService::Init(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) {
  return Offload(context, [this, context, request, response]() -> absl::Status {
    ASSIGN_OR_RETURN(ParameterShard * shard, ShardOf(*context));
    RETURN_IF_ERROR(CheckChief(*context, "init"));
    proto::InitHeader header;
    TensorFrameReader reader;
    RETURN_IF_ERROR(reader.Open(*request, &header));
    ASSIGN_OR_RETURN(const bool initialized, shard->Init(header, &reader));
    proto::InitResponse reply;
    reply.set_initialized_now(initialized);
    *response = SerializeToByteBuffer(reply);
    LOG(INFO) << (initialized ? "initialized " : "already held ") << header.variables_size()
              << " variables (" << reader.size() << " bytes)";
    ReportReadiness();
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* PsService::Pull(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) {
  proto::PullRequest pull;
  const absl::Status read = ParseFromByteBuffer(*request, &pull);
  auto* reactor = new PullReactor();
  reactor->Watch(handler_.Pull(
      StripeOf(*context), read, pull, absl::FromChrono(context->deadline()),
      [this, reactor, response](absl::StatusOr<RequestHandler::PullAnswer> answer) {
        if (!answer.ok()) {
          reactor->Finish(ToGrpcStatus(answer.status()));
          return;
        }
        // The frame references the snapshot and rows until gRPC has sent them.
        *response = EncodeTensorFrame(
            answer->header, {answer->values, answer->rows},
            [snapshot = answer->snapshot, rows = answer->row_buffer]() mutable {
              snapshot.reset();
              rows.reset();
            });
        handler_.CountPull(*answer, response->Length());
        reactor->Finish(grpc::Status::OK);
      }));
  return reactor;
}

grpc::ServerUnaryReactor* PsService::Push(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) {
  return Offload(context, [this, context, request, response]() -> absl::Status {
    proto::PushHeader header;
    TensorFrameReader reader;
    absl::Status read = reader.Open(*request, &header);
    if (read.ok()) read = CheckReplica(*context, header.replica());
    ASSIGN_OR_RETURN(
        const proto::PushResponse reply,
        handler_.Push(StripeOf(*context), read, header, &reader, request->Length()));
    *response = SerializeToByteBuffer(reply);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* PsService::GetStatus(grpc::CallbackServerContext* context,
                                               const proto::StatusRequest* /*request*/,
                                               proto::StatusResponse* response) {
  absl::StatusOr<ParameterShard*> shard = ShardOf(*context);
  if (!shard.ok()) return FinishNow(context, shard.status());
  *response = (*shard)->GetStatus();
  response->set_stripes(static_cast<int>(handler_.shards().size()) / (1 + ps_replicas_));
  response->set_ps_replicas(ps_replicas_);
  response->set_data_port(data_port_);
  response->set_data_plane_local_address(data_plane_local_address_);
  if (metrics_ != nullptr) {
    *response->mutable_process() = metrics_->metrics().process_status();
    *response->mutable_traffic() = metrics_->transfers().traffic();
  }
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* PsService::Shutdown(grpc::CallbackServerContext* context,
                                              const proto::ShutdownRequest* request,
                                              proto::ShutdownResponse* response) {
  if (request->replica() < -1) {
    return FinishNow(context, absl::InvalidArgumentError(absl::StrCat(
                                  "shutdown: replica ", request->replica(), " is below -1")));
  }
  if (request->replica() <= 0) {  // Ends training.
    if (absl::Status chief = CheckChief(*context, "shutdown"); !chief.ok()) {
      return FinishNow(context, chief);
    }
  }
  if (request->replica() != -1 && (request->prepare() || request->end_version() != 0)) {
    return FinishNow(context, absl::InvalidArgumentError(
                                  "shutdown: only an operator (replica -1) ends at a version"));
  }
  if (request->end_version() < 0) {
    return FinishNow(context, absl::InvalidArgumentError(absl::StrCat(
                                  "shutdown: end_version ", request->end_version(), " < 0")));
  }
  for (ParameterShard* shard : handler_.shards()) {
    if (request->prepare()) {
      response->set_end_bound(
          std::max(response->end_bound(), shard->PrepareEnd(kOperatorEndHold)));
    } else if (request->end_version() > 0) {
      shard->EndAt(request->end_version());
    } else {
      shard->Shutdown(request->replica());
    }
  }
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* PsService::SetMembers(grpc::CallbackServerContext* context,
                                                const proto::MembersRequest* request,
                                                proto::MembersResponse* response) {
  return Offload(context, [this, context, request, response]() -> absl::Status {
    ASSIGN_OR_RETURN(ParameterShard * shard, ShardOf(*context));
    RETURN_IF_ERROR(CheckChief(*context, "members"));
    ASSIGN_OR_RETURN(*response, shard->SetMembers(*request));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* PsService::Save(grpc::CallbackServerContext* context,
                                          const proto::SaveRequest* request,
                                          proto::SaveResponse* response) {
  return Offload(context, [this, context, request, response]() -> absl::Status {
    ASSIGN_OR_RETURN(ParameterShard * shard, ShardOf(*context));
    RETURN_IF_ERROR(CheckChief(*context, "save"));
    ASSIGN_OR_RETURN(std::string path,
                     shard->Save(request->step(), request->version(), request->keep(),
                                 request->has_keep_step() ? request->keep_step() : -1));
    response->set_path(path);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* PsService::Restore(grpc::CallbackServerContext* context,
                                             const proto::RestoreRequest* request,
                                             proto::RestoreResponse* response) {
  return Offload(context, [this, context, request, response]() -> absl::Status {
    ASSIGN_OR_RETURN(ParameterShard * shard, ShardOf(*context));
    RETURN_IF_ERROR(CheckChief(*context, "restore"));
    RETURN_IF_ERROR(shard->Restore(request->step(), request->recovery_epoch()));
    response->set_version(shard->GetStatus().version());
    ReportReadiness();
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* PsService::Replicate(grpc::CallbackServerContext* context,
                                               const grpc::ByteBuffer* request,
                                               grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  replica_runner_.Schedule([this, context, request, response, reactor] {
    const absl::Status status = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(ParameterShard * shard, ShardOf(*context));
      proto::ReplicateHeader header;
      TensorFrameReader reader;
      RETURN_IF_ERROR(reader.Open(*request, &header));
      ASSIGN_OR_RETURN(const proto::ReplicateResponse reply, shard->Replicate(header, &reader));
      *response = SerializeToByteBuffer(reply);
      return absl::OkStatus();
    }();
    reactor->Finish(ToGrpcStatus(status));
  });
  return reactor;
}

}  // namespace psrt
