// RingOptions: how a worker joins the allreduce ring (collective.h), and
// what each piece of the ring (the schedule's transports, their peer rules)
// reads of it. Filled by worker_flags.cc (psrt_worker), bench/ and tests;
// a plain value, copied by each piece.
#ifndef PSRT_WORKER_RING_RING_OPTIONS_H_
#define PSRT_WORKER_RING_RING_OPTIONS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace psrt {

class Timeline;           // common/timeline.h
class TransportSecurity;  // common/transport_security.h

// An elastic job's lists of members (elastic_ring.h) are numbered by the
// chief from a base of its start time, in milliseconds since the epoch,
// times 2^kListBits: the lists of a chief that restarted are newer than
// its predecessor's. ListNumber is a list's count within its chief's
// life (1, 2, ...), for logs.
constexpr int kListBits = 20;
inline int64_t ListNumber(int64_t generation) {
  return generation & ((int64_t{1} << kListBits) - 1);
}

struct RingOptions {
  int rank = 0;
  std::vector<std::string> addresses;  // Worker r's "host:port" at [r].
  // TLS and the auth token of the channel to the next worker; null:
  // plaintext, no token. (The server side is the worker's own server.)
  std::shared_ptr<const TransportSecurity> security;
  // How long a peer may stay silent or unreachable within an op.
  absl::Duration timeout = absl::Seconds(60);
  // The same for the first op, while the workers start.
  absl::Duration startup_timeout = absl::Seconds(300);
  // How long a previous worker that still answers (a ping, once it has
  // been silent for `timeout`) may go on sending nothing: the chief
  // evaluating or saving between steps.
  absl::Duration busy_timeout = absl::Minutes(30);
  // Reach the next worker's gRPC over its Unix socket when its address is
  // a loopback one (rpc_util.h's PreferLocalSocket; it must serve there).
  // Not with TLS, whose certificates name the TCP host.
  bool unix_socket = false;
  // Move the segments over the data plane (data_plane_ring_transport.h),
  // gRPC keeping the control (pings); not with TLS, which the data plane
  // does not have. (psrt_worker's --tensor_transport=socket.)
  bool data_plane = false;
  // The host whose interface the data plane listens on; empty: the host
  // of addresses[rank]. Its TCP port; 0: any free one. (Others reach it at
  // addresses[rank]'s host and that port.)
  std::string data_listen_host;
  int data_port = 0;
  // With data_plane, also take segments on an abstract Unix socket of this
  // process's own, which the previous worker takes instead of TCP when it
  // runs on this host (network namespace). (psrt_worker --local_data_plane.)
  bool local_data_plane = true;
  // An elastic job's list of members this ring is (elastic_ring.h): its
  // messages carry it, and a worker takes only its own generation's. 0: a
  // fixed ring.
  int64_t generation = 0;
  // Records each AllreduceSum's reduce_scatter and all_gather phases;
  // null: none. REQUIRES: outlives the Collective.
  Timeline* timeline = nullptr;
};

}  // namespace psrt

#endif  // PSRT_WORKER_RING_RING_OPTIONS_H_
