// ReplicaPeer: the other copy of a replicated shard (psrt_ps --ps_replicas=1;
// proto/psrt.proto's ReplicateHeader), as one copy calls it: the primary
// sends its updates and its whole state there, a backup asks whether the
// primary still answers, and a copy that restarted empty asks to join.
// ParameterShard (parameter_shard.h) holds one; psrt_ps gives it a
// GrpcReplicaPeer (grpc_replica_peer.h), tests may give it one that calls another shard in the
// same process.
//
// Thread safety: Call may run on several threads at once.
#ifndef PSRT_PS_REPLICA_PEER_H_
#define PSRT_PS_REPLICA_PEER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/psrt.pb.h"

namespace psrt {

class ReplicaPeer {
 public:
  virtual ~ReplicaPeer() = default;
  // Sends one message (`header`, then `data`, which must stay unchanged
  // until Call returns) and waits at most `timeout` for the answer.
  // Unavailable or DeadlineExceeded: the other copy was not reached (or did
  // not answer); FailedPrecondition: it refused the message (an older view
  // than its own); other errors as the other copy returned them.
  virtual absl::StatusOr<proto::ReplicateResponse> Call(
      const proto::ReplicateHeader& header, const std::vector<absl::Span<const char>>& data,
      absl::Duration timeout) = 0;
  // "ps/1 stripe 2", for logs and errors.
  virtual const std::string& name() const = 0;
};

}  // namespace psrt

#endif  // PSRT_PS_REPLICA_PEER_H_
