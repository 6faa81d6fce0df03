#include "common/rendezvous.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/rank_cluster.h"
#include "common/rpc_util.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "proto/rendezvous.grpc.pb.h"

namespace psrt {
namespace {

// Rank 0's side: collects the registrations and answers them all at once.
class RendezvousService final : public proto::Rendezvous::CallbackService {
 public:
  explicit RendezvousService(const RendezvousOptions& options)
      : options_(options), addresses_(options.world_size) {
    addresses_[0] = options.address;
  }

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const proto::RegisterRequest* request,
                                     proto::RegisterResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    absl::MutexLock lock(&mu_);
    if (!result_.has_value()) {
      if (absl::Status fault = Check(*request); !fault.ok()) {
        Fail(std::move(fault));
      } else {
        addresses_[request->rank()] = request->address();
        waiting_.emplace_back(reactor, response);
        if (Missing().empty()) Complete();
        return reactor;
      }
    }
    Answer(reactor, response);  // After the end: the outcome, as the others got it.
    return reactor;
  }

  // Rank 0's wait: every rank's address, or the failure.
  absl::StatusOr<std::vector<std::string>> Wait(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithDeadline(absl::Condition(
                              +[](std::optional<absl::StatusOr<std::vector<std::string>>>* r) {
                                return r->has_value();
                              },
                              &result_),
                          deadline);
    if (!result_.has_value()) {
      Fail(absl::DeadlineExceededError(absl::StrCat(
          "rendezvous at ", options_.coordinator, ": rank ", absl::StrJoin(Missing(), ", rank "),
          " of ", options_.world_size, " did not register within ",
          absl::FormatDuration(options_.timeout),
          " (not started, or cannot reach the coordinator?)")));
    }
    return *result_;
  }

 private:
  using Waiter = std::pair<grpc::ServerUnaryReactor*, proto::RegisterResponse*>;

  absl::Status Check(const proto::RegisterRequest& r) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const std::string prefix = absl::StrCat("rendezvous at ", options_.coordinator, ": rank ",
                                            r.rank(), " (", r.address(), ")");
    if (r.world_size() != options_.world_size || r.num_ps() != options_.num_ps) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, " says ", r.world_size(), " tasks of which ", r.num_ps(), " ps, rank 0 says ",
          options_.world_size, " of which ", options_.num_ps,
          " (give every task the same world size and number of ps tasks)"));
    }
    if (r.rank() <= 0 || r.rank() >= options_.world_size) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, ": a rank must be in 1..",
                                                     options_.world_size - 1,
                                                     " (rank 0 is the coordinator)"));
    }
    const std::string& known = addresses_[r.rank()];
    if (!known.empty() && known != r.address()) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, " registered twice, from ", known, " and from ", r.address(),
          " (two tasks given one rank?)"));
    }
    return absl::OkStatus();
  }

  std::vector<int> Missing() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<int> missing;
    for (int r = 0; r < options_.world_size; ++r) {
      if (addresses_[r].empty()) missing.push_back(r);
    }
    return missing;
  }

  void Complete() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    result_ = addresses_;
    for (auto& [reactor, response] : waiting_) Answer(reactor, response);
    waiting_.clear();
  }
  void Fail(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    LOG(ERROR) << status.message();
    result_ = std::move(status);
    for (auto& [reactor, response] : waiting_) Answer(reactor, response);
    waiting_.clear();
  }
  void Answer(grpc::ServerUnaryReactor* reactor, proto::RegisterResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!result_->ok()) {
      reactor->Finish(ToGrpcStatus(result_->status()));
      return;
    }
    for (const std::string& address : **result_) response->add_addresses(address);
    reactor->Finish(grpc::Status::OK);
  }

  const RendezvousOptions options_;
  absl::Mutex mu_;
  std::vector<std::string> addresses_ ABSL_GUARDED_BY(mu_);  // By rank; empty: missing.
  std::vector<Waiter> waiting_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::StatusOr<std::vector<std::string>>> result_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::vector<std::string>> ServeRendezvous(const RendezvousOptions& options) {
  const absl::Time deadline = absl::Now() + options.timeout;
  RendezvousService service(options);
  std::string listen = options.coordinator;
  if (!options.listen_host.empty()) {
    std::string host;
    int coordinator_port = 0;
    RETURN_IF_ERROR(SplitHostPort(options.coordinator, &host, &coordinator_port));
    listen = JoinHostPort(options.listen_host, coordinator_port);
  }
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, options.security->ServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("rendezvous: rank 0 cannot serve on ", listen,
                                               " (--coordinator, --bind_host)"));
  }
  LOG(INFO) << "rendezvous: rank 0 waits for " << options.world_size - 1 << " ranks on "
            << listen;
  absl::StatusOr<std::vector<std::string>> addresses = service.Wait(deadline);
  // Every answer leaves before the server goes.
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  return addresses;
}

absl::StatusOr<std::vector<std::string>> JoinRendezvous(const RendezvousOptions& options) {
  auto stub = proto::Rendezvous::NewStub(NewChannel(options.coordinator, *options.security));
  proto::RegisterRequest request;
  request.set_rank(options.rank);
  request.set_world_size(options.world_size);
  request.set_num_ps(options.num_ps);
  request.set_address(options.address);
  proto::RegisterResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options.timeout));
  context.set_wait_for_ready(true);  // Rank 0 may start after this one.
  const grpc::Status status = stub->Register(&context, request, &response);
  if (!status.ok()) {
    return absl::Status(FromGrpcStatus(status).code(),
                        absl::StrCat("rank ", options.rank, ": rendezvous with rank 0 at ",
                                     options.coordinator, " failed: ", status.error_message()));
  }
  return std::vector<std::string>(response.addresses().begin(), response.addresses().end());
}

}  // namespace

absl::StatusOr<ClusterConfig> Rendezvous(const RendezvousOptions& options) {
  CHECK(options.security != nullptr);
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous: rank ", options.rank, " is not in 0..", options.world_size - 1,
        " (world size ", options.world_size, ")"));
  }
  std::vector<std::string> addresses = {options.address};  // A world of one.
  if (options.world_size > 1) {
    ASSIGN_OR_RETURN(addresses,
                     options.rank == 0 ? ServeRendezvous(options) : JoinRendezvous(options));
  }
  return ClusterOfRanks(addresses, options.num_ps, options.rank,
                        absl::StrCat("the cluster from the rendezvous at ", options.coordinator));
}

}  // namespace psrt
