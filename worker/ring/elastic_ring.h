// ElasticRing: the allreduce ring of an elastic job (--mode=allreduce with
// --max_workers), whose workers change while it runs: they join, die or are
// drained. The chief's lists of members (worker/worker_membership.h) are
// numbered, generations 1, 2, ...; each generation is a ring of its own, a
// Collective (collective.h) over its members in replica order, whose
// messages carry the generation: a worker takes only its own generation's
// (one of an earlier ring is refused, one of a later ring is retried by its
// sender until this worker has joined that ring: ring_peer_rules.h). One
// Collective service, registered once on the worker's server, hands each
// message to the ring of the moment.
//
// MembersChanged tells the ring of a newer list: the op in progress on the
// current ring fails at once (Aborted), as does every later op, until
// Regroup builds the ring of the newest list and joins it (a barrier of its
// members). What state the members then carry on from is the store's
// business (allreduce_store.h). The segments travel over gRPC.
//
// Thread safety: MembersChanged, stale(), newest() and the service from any
// thread; Regroup and ring() from one thread (the store's), which alone
// replaces the ring.
#ifndef PSRT_WORKER_RING_ELASTIC_RING_H_
#define PSRT_WORKER_RING_ELASTIC_RING_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/ring/collective.h"
#include "worker/ring/ring_options.h"

namespace grpc {
class Service;
}  // namespace grpc

namespace psrt {

class ElasticRing {
 public:
  // One of the chief's lists.
  struct Members {
    int64_t generation = 0;              // 0: none yet.
    std::vector<int> replicas;           // Ascending, the chief (0) first.
    std::vector<std::string> addresses;  // Where each serves the ring.
  };

  // A list as the chief sends it (proto MembersRequest): InvalidArgument
  // when it names no generation, or another number of ring addresses than
  // of replicas.
  static absl::StatusOr<Members> FromList(const proto::MembersRequest& list);

  // Worker replica `replica`; `options` gives every generation's ring its
  // timeouts, security, Unix sockets and timeline (rank, addresses and
  // generation are each list's; the data plane is not used).
  ElasticRing(RingOptions options, int replica);
  ~ElasticRing();
  ElasticRing(const ElasticRing&) = delete;
  ElasticRing& operator=(const ElasticRing&) = delete;

  // Receives every generation's messages: register it on the server at
  // this worker's address (with no message size cap) before the first op.
  grpc::Service* service();
  int replica() const { return replica_; }

  // A list from the chief; an older or the same generation is ignored.
  // Fails the current ring's op in progress when the list is newer.
  void MembersChanged(Members members);
  // The newest list told (generation 0: none yet).
  Members newest() const;
  // Whether a newer list than the current ring's was told (or there is no
  // ring yet): every op of the current ring fails.
  bool stale() const;

  // Builds the ring of the newest list and joins it: waits up to `timeout`
  // for a list newer than the current ring's that names this worker
  // (DeadlineExceeded), then for every member of it to join (the ring's
  // startup_timeout). Aborted when a newer list comes meanwhile: call again.
  absl::Status Regroup(absl::Duration timeout);
  // The current generation's ring (null before the first Regroup), and
  // its generation.
  Collective* ring() { return current_; }
  // The list the current ring is (its ranks index replicas and addresses).
  const Members& members() const { return members_; }
  int64_t generation() const;

 private:
  class Service;
  // The Aborted status of ops of generation `generation`.
  absl::Status Superseded(int64_t generation) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RingOptions options_;
  const int replica_;
  std::unique_ptr<Service> service_;

  mutable absl::Mutex mu_;
  Members newest_ ABSL_GUARDED_BY(mu_);
  // The current ring, also held by the service's calls while they run.
  std::shared_ptr<Collective> ring_ ABSL_GUARDED_BY(mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // ring_'s.
  Collective* current_ = nullptr;  // ring_, for the thread that replaces it.
  Members members_;                 // Its list; likewise.

  friend class Service;
};

}  // namespace psrt

#endif  // PSRT_WORKER_RING_ELASTIC_RING_H_
