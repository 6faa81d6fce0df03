// Rendezvous: the cluster of a job whose manager gives each task only a rank
// and the world's size (mpirun's OMPI_COMM_WORLD_*, a Kubernetes Indexed
// Job's JOB_COMPLETION_INDEX, torchrun's RANK and WORLD_SIZE), as torchrun's
// rendezvous does. Rank 0 serves proto/rendezvous.proto on the coordinator's
// address; every other rank registers its task's address there and waits;
// once every rank has registered, each gets all the addresses, and its
// cluster is ClusterOfRanks of them (common/rank_cluster.h: ranks
// 0..num_ps-1 are the ps tasks). Registration is authenticated as every
// psrt call is (the auth token, TLS).
//
// Errors fail the whole rendezvous at every rank that registered, naming
// the rank at fault: a rank out of range, a rank registered twice from two
// addresses, a rank that says another world size or number of ps tasks
// than rank 0, or ranks still missing at the timeout (named; a rank that
// cannot reach rank 0 says so). A second rank 0 on the coordinator's port
// fails to start.
//
// Once every rank has registered, rank 0 keeps answering for the rest of its
// process: a rank that restarts at the address it had gets the same cluster
// (and rejoins the job as any restarted task does); another address for a
// known rank is refused to that caller. A restarted rank 0 serves a new
// rendezvous, which the running ranks never join: it fails at its timeout.
//
// Thread safety: Rendezvous is called once per process, by its main thread.
#ifndef PSRT_COMMON_RENDEZVOUS_H_
#define PSRT_COMMON_RENDEZVOUS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/cluster_spec.h"
#include "common/transport_security.h"

namespace psrt {

struct RendezvousOptions {
  std::string coordinator;  // host:port where rank 0 serves the rendezvous.
  int rank = 0;
  int world_size = 1;
  int num_ps = 0;
  std::string address;      // host:port this rank's task will serve on.
  std::string listen_host;  // Rank 0 serves on it; empty: the coordinator's host.
  absl::Duration timeout = absl::Seconds(300);
  std::shared_ptr<const TransportSecurity> security;  // Required.
};

// Blocks until every rank has registered (or the rendezvous fails) and
// returns the cluster and this rank's task.
absl::StatusOr<ClusterConfig> Rendezvous(const RendezvousOptions& options);

}  // namespace psrt

#endif  // PSRT_COMMON_RENDEZVOUS_H_
