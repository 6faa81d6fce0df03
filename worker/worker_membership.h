// Elastic workers (sync mode, --max_workers): who trains at each version.
//
// The chief keeps the list (MembershipRegistry). Every other worker calls
// its chief's Membership.Attend about four times per lease
// (MembershipClient); the chief
//  - admits a worker it has not heard from before (or that it dropped) at
//    its next step boundary, from the version after the first one the chief
//    has not pushed yet: no shard can have completed that version, since
//    every version waits for the chief's gradient, and the worker cannot
//    push it before the list has reached the shards (the chief pushes the
//    version before it only after sending the list); it is told it is a
//    member once the shards have the list;
//  - drops a worker it has not heard from for a lease (killed, frozen, or
//    gone with its host), or that said it leaves (drained), at once: the
//    shards stop waiting for it at the version they are at;
//  - trains only while at least --min_workers are members (itself
//    included), waiting at its step boundary for more;
// and sends each new list to every shard (ParameterStore::SetMembers),
// logging each change with the version at which it took effect. The
// chief cannot leave; a chief that restarts starts alone and admits the
// others again as they call.
//
// In allreduce mode (Options::ring) there are no shards: each list is
// numbered (its generation) and names where every member serves the ring,
// and it goes to the chief's ring (the announce callback) and, in the
// answers to their calls, to the other members' rings
// (worker/ring/elastic_ring.h), which regroup on it; the chief's Join makes
// the first list (itself alone).
//
// The trainer sees ElasticMembership (worker/training/elastic_membership.h):
// Join before training, AtStep before each step, Recovered after the
// chief's recovery, Leave once drained.
#ifndef PSRT_WORKER_WORKER_MEMBERSHIP_H_
#define PSRT_WORKER_WORKER_MEMBERSHIP_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "proto/psrt.grpc.pb.h"
#include "worker/training/elastic_membership.h"

namespace psrt {

// The chief's list. Thread safety: thread-safe; the gRPC service calls
// Attend concurrently with the trainer's AtStep and the lease thread.
class MembershipRegistry final : public ElasticMembership {
 public:
  struct Options {
    int min_workers = 1;
    int max_workers = 1;  // Replicas 0..max_workers-1 may join.
    absl::Duration lease = absl::Seconds(5);
    // How long AtStep waits for --min_workers before it fails.
    absl::Duration min_workers_timeout = absl::Seconds(300);
    // Allreduce mode: the lists name where each member serves the ring,
    // the chief at `ring_address`.
    bool ring = false;
    std::string ring_address;
  };
  // Sends a list to every shard; the lowest version they answer with.
  using Announce = std::function<absl::StatusOr<int64_t>(const proto::MembersRequest&)>;

  // Starts the lease thread. REQUIRES: `announce` may be called from any
  // thread until the registry is destroyed.
  MembershipRegistry(const Options& options, Announce announce);
  ~MembershipRegistry() override;

  // The Membership service, for the chief's status server.
  grpc::Service* service();
  // A worker's call: InvalidArgument for a replica that may not join.
  absl::StatusOr<proto::AttendResponse> Attend(const proto::AttendRequest& request);
  // Members now, the chief included.
  int members() const;

  // Allreduce mode: makes the first list (the chief alone). 0.
  absl::StatusOr<int64_t> Join() override;
  // Waits for --min_workers (DeadlineExceeded after min_workers_timeout),
  // admits the workers waiting from `version` + 1, and sends the list when
  // it changed; a list the shards do not all take is sent again next time
  // (the workers it admitted from a later version). After Recovered, every
  // member counts from `version` + 1.
  absl::Status AtStep(int64_t version, const std::function<bool()>& training_over) override;
  void Recovered() override;
  bool draining() const override { return false; }
  void Leave() override {}

 private:
  struct Worker {
    uint64_t incarnation = 0;
    std::string ring_address;  // Allreduce mode.
    absl::Time last_heard;
    int64_t from_version = -1;  // -1: waiting to be admitted.
    // A list naming it went out to the shards: only then is it told it is
    // a member (a push it made sooner could reach a shard before the list).
    bool announced = false;
  };
  class Service;
  // Sends the list as it is now (one announcement at a time); logs `what`
  // at `version`, or (-1) at the version the shards answered.
  absl::Status AnnounceNow(absl::string_view what, int64_t version = -1)
      ABSL_LOCKS_EXCLUDED(mu_);
  void LeaseLoop();

  const Options options_;
  const Announce announce_;
  std::unique_ptr<Service> service_;
  absl::Mutex announce_mu_;  // Taken before mu_.
  mutable absl::Mutex mu_;
  std::map<int, Worker> workers_ ABSL_GUARDED_BY(mu_);  // Replicas 1.., members or waiting.
  // The shards' list is not the current one: at first, a restarted
  // chief's shards may list workers it has not heard from.
  bool dirty_ ABSL_GUARDED_BY(mu_) = true;
  std::vector<int> departed_ ABSL_GUARDED_BY(mu_);  // Members gone: announce at once.
  // The newest list's number (worker/ring/ring_options.h: from a base of
  // this chief's start time), and the newest list sent (allreduce mode:
  // told in every answer).
  int64_t generation_ ABSL_GUARDED_BY(mu_);
  proto::MembersRequest sent_ ABSL_GUARDED_BY(mu_);
  bool recovered_ ABSL_GUARDED_BY(mu_) = false;     // Recovered(): members from the next step.
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar changed_;
  std::thread lease_thread_;
};

// A worker's side: its calls to the chief. Thread safety: thread-safe.
class MembershipClient final : public ElasticMembership {
 public:
  // Allreduce mode: each newer list the chief's answers carry.
  using OnList = std::function<void(const proto::MembersRequest& list)>;
  // `chief`: a channel to the chief's status address. Allreduce mode:
  // `ring_address` is where this worker serves the ring, and `on_list`
  // hears the lists (from the Join's and the heartbeat's thread).
  MembershipClient(std::shared_ptr<grpc::Channel> chief, int replica, absl::Duration lease,
                   absl::Duration join_timeout, std::string ring_address = "",
                   OnList on_list = nullptr);
  ~MembershipClient() override;  // Stops calling (without a Leave).

  // Calls until the chief admits this worker (a chief not up yet is waited
  // for, up to join_timeout), then keeps calling from a thread. The chief's
  // refusal (InvalidArgument: above --max_workers) is returned.
  absl::StatusOr<int64_t> Join() override;
  absl::Status AtStep(int64_t /*version*/,
                      const std::function<bool()>& /*training_over*/) override {
    return absl::OkStatus();
  }
  void Recovered() override {}
  bool draining() const override { return draining_.load(); }
  // Tells the chief this worker leaves, and stops calling.
  void Leave() override;
  // psrtctl drain: leave at the next step boundary.
  void RequestDrain() { draining_.store(true); }

 private:
  // Hands on_list_ the answer's list when it is newer than the last.
  absl::StatusOr<proto::AttendResponse> Call(bool leaving, absl::Duration timeout);
  void HeartbeatLoop();

  const std::unique_ptr<proto::Membership::Stub> stub_;
  const int replica_;
  const std::string ring_address_;
  const OnList on_list_;
  std::atomic<int64_t> heard_generation_{0};
  const absl::Duration lease_;
  const absl::Duration join_timeout_;
  const uint64_t incarnation_;
  std::atomic<bool> draining_{false};
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread heartbeat_thread_;
};

}  // namespace psrt

#endif  // PSRT_WORKER_WORKER_MEMBERSHIP_H_
