// RingControl: the ring's control messages to a worker's two neighbours,
// apart from its segments: whether the previous worker's process still
// answers, and where the next worker takes segments over the data plane.
// GrpcRingTransport (grpc_ring_transport.h) implements it over the
// Collective service's pings (a Deliver of op 0); RingPeerRules
// (ring_peer_rules.h) and DataPlaneRingTransport
// (data_plane_ring_transport.h) call it.
//
// Thread safety: an implementation's methods may be called from any thread.
#ifndef PSRT_WORKER_RING_RING_CONTROL_H_
#define PSRT_WORKER_RING_RING_CONTROL_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace psrt {

class RingControl {
 public:
  virtual ~RingControl() = default;

  // OK when the previous worker's process answers within `deadline` (and
  // takes this worker's auth token); else why not.
  virtual absl::Status PingPrevious(absl::Duration deadline) = 0;
  // The next worker's data-plane addresses, from its answer to a ping
  // within `deadline`: its Unix socket when it serves one, then TCP (for
  // dataplane::ConnectWithHello); an error, naming it, when it does not
  // answer or serves the ring over gRPC only.
  virtual absl::StatusOr<std::vector<std::string>> NextDataAddresses(absl::Duration deadline) = 0;
};

}  // namespace psrt

#endif  // PSRT_WORKER_RING_RING_CONTROL_H_
