#include "worker/worker_membership.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/random_id.h"
#include "common/rpc_util.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "grpcpp/client_context.h"
#include "worker/ring/ring_options.h"

namespace psrt {

class MembershipRegistry::Service final : public proto::Membership::CallbackService {
 public:
  explicit Service(MembershipRegistry* registry) : registry_(registry) {}

  grpc::ServerUnaryReactor* Attend(grpc::CallbackServerContext* context,
                                   const proto::AttendRequest* request,
                                   proto::AttendResponse* response) override {
    absl::StatusOr<proto::AttendResponse> answer = registry_->Attend(*request);
    if (answer.ok()) *response = *std::move(answer);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(answer.status()));
    return reactor;
  }

 private:
  MembershipRegistry* const registry_;
};

MembershipRegistry::MembershipRegistry(const Options& options, Announce announce)
    : options_(options),
      announce_(std::move(announce)),
      service_(std::make_unique<Service>(this)),
      generation_(absl::ToUnixMillis(absl::Now()) << kListBits),
      lease_thread_([this] { LeaseLoop(); }) {}

MembershipRegistry::~MembershipRegistry() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    changed_.SignalAll();
  }
  lease_thread_.join();
}

grpc::Service* MembershipRegistry::service() { return service_.get(); }

absl::StatusOr<proto::AttendResponse> MembershipRegistry::Attend(
    const proto::AttendRequest& request) {
  const int r = request.replica();
  if (r < 1 || r >= options_.max_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker replica ", r, " cannot join: this job's --max_workers=", options_.max_workers,
        " admits replicas 1..", options_.max_workers - 1, " besides the chief (replica 0)"));
  }
  proto::AttendResponse response;
  absl::MutexLock lock(&mu_);
  if (request.leaving()) {
    auto it = workers_.find(r);
    if (it != workers_.end()) {
      LOG(INFO) << "worker replica " << r << " leaves (drained)";
      if (it->second.from_version >= 0) departed_.push_back(r);
      workers_.erase(it);
      changed_.SignalAll();  // The lease thread announces it at once.
    }
    return response;
  }
  auto [it, added] = workers_.try_emplace(r);
  Worker& worker = it->second;
  if (added) {
    LOG(INFO) << "worker replica " << r << " asks to join; admitted at the chief's next step";
    worker.last_heard = absl::Now();
    changed_.SignalAll();  // AtStep may be waiting for --min_workers.
  } else if (worker.incarnation != request.worker_incarnation()) {
    LOG(INFO) << "worker replica " << r << " restarted; it stays a member";
  }
  worker.incarnation = request.worker_incarnation();
  worker.ring_address = request.ring_address();
  worker.last_heard = absl::Now();
  response.set_member(worker.from_version >= 0 && worker.announced);
  response.set_from_version(std::max<int64_t>(worker.from_version, 0));
  if (options_.ring) *response.mutable_members() = sent_;
  return response;
}

absl::StatusOr<int64_t> MembershipRegistry::Join() {
  if (!options_.ring) return 0;
  RETURN_IF_ERROR(AnnounceNow("the chief's ring starts", 0));
  return 0;
}

int MembershipRegistry::members() const {
  absl::MutexLock lock(&mu_);
  int count = 1;  // The chief.
  for (const auto& [r, worker] : workers_) count += worker.from_version >= 0;
  return count;
}

absl::Status MembershipRegistry::AtStep(int64_t version,
                                        const std::function<bool()>& training_over) {
  std::string joined;
  {
    absl::MutexLock lock(&mu_);
    // Every worker that called counts: those waiting are admitted below.
    const absl::Time deadline = absl::Now() + options_.min_workers_timeout;
    bool logged = false;
    while (1 + static_cast<int>(workers_.size()) < options_.min_workers) {
      if (!logged) {
        LOG(INFO) << "waiting at global step " << version << " for --min_workers="
                  << options_.min_workers << " workers (" << 1 + workers_.size()
                  << " so far)";
        logged = true;
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "only ", 1 + workers_.size(), " workers of --min_workers=", options_.min_workers,
            " joined within ", absl::FormatDuration(options_.min_workers_timeout),
            " (--startup_timeout_secs)"));
      }
      // Every second: has an operator ended training meanwhile?
      if (changed_.WaitWithDeadline(&mu_, std::min(deadline, absl::Now() + absl::Seconds(1)))) {
        mu_.Unlock();
        const bool over = training_over();
        mu_.Lock();
        if (over) return absl::OkStatus();
      }
    }
    // From the version after `version`: a worker can only push it once it
    // has pulled it, which takes the chief's push of `version`, which comes
    // after the list reached the shards. (Counted from `version`, a
    // re-admitted worker's push could beat the list to a shard, which
    // would drop it and then wait for it.)
    for (auto& [r, worker] : workers_) {
      if (worker.from_version >= 0) continue;
      worker.from_version = version + 1;
      worker.announced = false;
      absl::StrAppend(&joined, joined.empty() ? "" : ", ", r);
      dirty_ = true;
    }
    // After a recovery the restored shards list the chief alone and have
    // dropped the others' pushes of `version`: every member counts from
    // the next one.
    if (recovered_) {
      for (auto& [r, worker] : workers_) {
        worker.from_version = std::max(worker.from_version, version + 1);
      }
      recovered_ = false;
      dirty_ = true;
    }
    if (!dirty_) return absl::OkStatus();
  }
  // A shard that does not take the list (restarting, unreachable) is the
  // chief's next push's or pull's to find, and to recover from; the list
  // goes out again at the next step.
  const absl::Status announced =
      AnnounceNow(joined.empty() ? std::string("the members sent again")
                                 : absl::StrCat("worker replica(s) ", joined, " join"),
                  version + 1);
  LOG_IF(WARNING, !announced.ok()) << "the shards did not all take the members (again at the "
                                      "next step): "
                                   << announced.message();
  return absl::OkStatus();
}

void MembershipRegistry::Recovered() {
  absl::MutexLock lock(&mu_);
  recovered_ = true;
}

absl::Status MembershipRegistry::AnnounceNow(absl::string_view what, int64_t version) {
  absl::MutexLock announcing(&announce_mu_);
  proto::MembersRequest request;
  request.add_replicas(0);
  request.add_from_versions(0);
  if (options_.ring) request.add_ring_addresses(options_.ring_address);
  int count = 1;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [r, worker] : workers_) {
      if (worker.from_version < 0) continue;
      request.add_replicas(r);
      request.add_from_versions(worker.from_version);
      if (options_.ring) request.add_ring_addresses(worker.ring_address);
      ++count;
    }
    request.set_generation(++generation_);
    dirty_ = false;
  }
  absl::StatusOr<int64_t> shards_version = announce_(request);
  {
    absl::MutexLock lock(&mu_);
    // The workers listed may push now. When some shard did not take the
    // list, those not told yet wait to be admitted again, from a later
    // version (the shards that took it stop waiting for them then).
    for (int i = 1; i < request.replicas_size(); ++i) {
      auto it = workers_.find(request.replicas(i));
      if (it == workers_.end() || it->second.from_version != request.from_versions(i)) continue;
      if (shards_version.ok()) {
        it->second.announced = true;
      } else if (!it->second.announced) {
        it->second.from_version = -1;
      }
    }
    if (!shards_version.ok()) dirty_ = true;
    if (shards_version.ok()) sent_ = request;
  }
  if (!shards_version.ok()) return shards_version.status();
  // In allreduce mode the change takes effect where the ring regroups
  // (its log says at which step).
  LOG(INFO) << "elastic workers: " << what
            << (options_.ring ? ""
                              : absl::StrCat(" at global step ",
                                             version >= 0 ? version : *shards_version))
            << "; members now: " << count
            << (options_.ring ? absl::StrCat(" (list ", ListNumber(request.generation()), ")")
                              : "");
  return absl::OkStatus();
}

void MembershipRegistry::LeaseLoop() {
  mu_.Lock();
  bool failed = false;  // The last announcement: tried again a quarter lease later.
  while (!stopping_) {
    // A departure signalled while the last announcement was on its way is
    // in departed_ already: not waited for.
    if (departed_.empty() || failed) changed_.WaitWithTimeout(&mu_, options_.lease / 4);
    if (stopping_) break;
    const absl::Time now = absl::Now();
    for (auto it = workers_.begin(); it != workers_.end();) {
      if (now - it->second.last_heard < options_.lease) {
        ++it;
        continue;
      }
      LOG(WARNING) << "worker replica " << it->first << " not heard from for "
                   << absl::FormatDuration(options_.lease) << ": dropped";
      if (it->second.from_version >= 0) departed_.push_back(it->first);
      it = workers_.erase(it);
    }
    // A member gone (dropped or drained) is announced at once: the shards
    // may be waiting for its gradient. Admissions wait for the chief's step.
    if (!departed_.empty()) {
      std::vector<int> gone;
      gone.swap(departed_);
      mu_.Unlock();
      const absl::Status announced =
          AnnounceNow(absl::StrCat("worker replica(s) ", absl::StrJoin(gone, ", "), " leave"));
      LOG_IF(WARNING, !announced.ok())
          << "the shards did not all take the members (trying again): " << announced.message();
      mu_.Lock();
      failed = !announced.ok();
      if (failed) departed_.insert(departed_.end(), gone.begin(), gone.end());
    }
  }
  mu_.Unlock();
}

MembershipClient::MembershipClient(std::shared_ptr<grpc::Channel> chief, int replica,
                                   absl::Duration lease, absl::Duration join_timeout,
                                   std::string ring_address, OnList on_list)
    : stub_(proto::Membership::NewStub(std::move(chief))),
      replica_(replica),
      ring_address_(std::move(ring_address)),
      on_list_(std::move(on_list)),
      lease_(lease),
      join_timeout_(join_timeout),
      incarnation_(static_cast<uint64_t>(NewIncarnation())) {}

MembershipClient::~MembershipClient() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
}

absl::StatusOr<proto::AttendResponse> MembershipClient::Call(bool leaving,
                                                             absl::Duration timeout) {
  proto::AttendRequest request;
  request.set_replica(replica_);
  request.set_worker_incarnation(incarnation_);
  request.set_leaving(leaving);
  request.set_ring_address(ring_address_);
  proto::AttendResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  const absl::Status status = FromGrpcStatus(stub_->Attend(&context, request, &response));
  if (!status.ok()) return status;
  const int64_t generation = response.members().generation();
  if (on_list_ != nullptr && generation > heard_generation_.load()) {
    heard_generation_.store(generation);
    on_list_(response.members());
  }
  return response;
}

absl::StatusOr<int64_t> MembershipClient::Join() {
  const absl::Time deadline = absl::Now() + join_timeout_;
  absl::Status last;
  bool asked = false;
  while (absl::Now() < deadline) {
    absl::StatusOr<proto::AttendResponse> answer = Call(false, lease_ / 2);
    if (answer.ok() && answer->member()) {
      LOG(INFO) << "worker replica " << replica_ << " joins at global step "
                << answer->from_version();
      heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
      return answer->from_version();
    }
    if (absl::IsInvalidArgument(answer.status())) return answer.status();
    if (answer.ok() && !asked) {
      LOG(INFO) << "worker replica " << replica_ << " waits for the chief to admit it";
      asked = true;
    }
    if (!answer.ok()) last = answer.status();
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "worker replica ", replica_, " was not admitted by the chief within ",
      absl::FormatDuration(join_timeout_), last.ok() ? "" : ": ", last.message()));
}

void MembershipClient::HeartbeatLoop() {
  bool member = true;
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), lease_ / 4);
    if (stopping_) break;
    mu_.Unlock();
    absl::StatusOr<proto::AttendResponse> answer = Call(false, lease_ / 2);
    mu_.Lock();
    if (answer.ok() && answer->member() != member) {
      member = answer->member();
      LOG(WARNING) << "worker replica " << replica_
                   << (member ? " is a member again from global step " +
                                    std::to_string(answer->from_version())
                              : " is not a member now (the chief dropped it or restarted); "
                                "its pushes are dropped until the chief admits it again");
    }
  }
}

void MembershipClient::Leave() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  const absl::Status said = Call(true, lease_).status();
  LOG_IF(WARNING, !said.ok()) << "the chief did not hear this worker leave: " << said.message()
                              << " (it drops it after its lease)";
}

}  // namespace psrt
