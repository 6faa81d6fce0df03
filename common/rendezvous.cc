#include "common/rendezvous.h"

#include <algorithm>
#include <memory>
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

// How much longer than rank 0 the other ranks wait for its answer (at most
// the timeout itself).
constexpr absl::Duration kAnswerGrace = absl::Seconds(10);

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
    absl::Status fault = Check(*request);
    if (result_.has_value() && result_->ok()) {
      // After the rendezvous: a rank that restarted at its address rejoins;
      // anything else is refused to that caller alone.
      if (!fault.ok()) {
        LOG(WARNING) << fault.message();
        reactor->Finish(ToGrpcStatus(fault));
      } else {
        LOG(INFO) << "rendezvous: rank " << request->rank() << " (" << request->address()
                  << ") registered again (restarted?): it gets the cluster it had";
        Answer(reactor, response);
      }
      return reactor;
    }
    if (!result_.has_value()) {
      if (!fault.ok()) {
        Fail(std::move(fault));
      } else {
        addresses_[request->rank()] = request->address();
        waiting_.emplace_back(reactor, response);
        if (Missing().empty()) Complete();
        return reactor;
      }
    }
    Answer(reactor, response);  // After a failure: the failure, as the others got it.
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
          " (two tasks given one rank, or two jobs given one coordinator?)"));
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

// A rendezvous rank 0 served, kept for the rest of the process.
struct ServedRendezvous {
  explicit ServedRendezvous(const RendezvousOptions& options) : service(options) {}
  RendezvousService service;
  std::unique_ptr<grpc::Server> server;
};

absl::StatusOr<std::vector<std::string>> ServeRendezvous(const RendezvousOptions& options) {
  const absl::Time deadline = absl::Now() + options.timeout;
  auto served = std::make_unique<ServedRendezvous>(options);
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
  // A second rank 0 on this port (another job given the same coordinator)
  // must fail to start, not share the registrations.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(&served->service);
  served->server = builder.BuildAndStart();
  if (served->server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("rendezvous: rank 0 cannot serve on ", listen,
                                               " (--coordinator, --bind_host)"));
  }
  LOG(INFO) << "rendezvous: rank 0 waits for " << options.world_size - 1 << " ranks on "
            << listen;
  absl::StatusOr<std::vector<std::string>> addresses = served->service.Wait(deadline);
  if (!addresses.ok()) {
    // Every answer leaves before the server goes.
    served->server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    return addresses;
  }
  // Kept up for the life of the process, for ranks that restart.
  static absl::Mutex kept_mu(absl::kConstInit);
  static auto* kept = new std::vector<std::unique_ptr<ServedRendezvous>>();
  absl::MutexLock lock(&kept_mu);
  kept->push_back(std::move(served));
  return addresses;
}

absl::StatusOr<std::vector<std::string>> JoinRendezvous(const RendezvousOptions& options) {
  std::shared_ptr<grpc::Channel> channel = NewChannel(options.coordinator, *options.security);
  auto stub = proto::Rendezvous::NewStub(channel);
  proto::RegisterRequest request;
  request.set_rank(options.rank);
  request.set_world_size(options.world_size);
  request.set_num_ps(options.num_ps);
  request.set_address(options.address);
  // Rank 0 answers every rank by its own deadline (the same timeout, from
  // its own start), so this rank waits a little longer to hear which ranks
  // were missing.
  proto::RegisterResponse response;
  grpc::ClientContext context;
  context.set_deadline(
      absl::ToChronoTime(absl::Now() + options.timeout + std::min(kAnswerGrace, options.timeout)));
  context.set_wait_for_ready(true);  // Rank 0 may start after this one.
  grpc::Status status = stub->Register(&context, request, &response);
  std::string unreachable;
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
      channel->GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY) {
    // Never connected: one more try that does not wait for a connection
    // says why (refused, no such host, a TLS handshake that failed).
    grpc::ClientContext last_try;
    last_try.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    const grpc::Status last = stub->Register(&last_try, request, &response);
    if (last.ok()) status = last;
    unreachable = absl::StrCat(" (rank 0 was never reachable: ", last.error_message(), ")");
  }
  if (!status.ok()) {
    return absl::Status(FromGrpcStatus(status).code(),
                        absl::StrCat("rank ", options.rank, ": rendezvous with rank 0 at ",
                                     options.coordinator, " failed: ", status.error_message(),
                                     unreachable));
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
