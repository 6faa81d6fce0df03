// GrpcReplicaPeer: the ReplicaPeer (replica_peer.h) over gRPC: the
// Replicate method of stripe `stripe` of the ps task at the other end of a
// channel, as a tensor frame (common/tensor_frame.h) that references the
// caller's memory.
//
// Thread safety: Call may run on several threads at once.
#ifndef PSRT_PS_GRPC_REPLICA_PEER_H_
#define PSRT_PS_GRPC_REPLICA_PEER_H_

#include <memory>
#include <string>
#include <vector>

#include "grpcpp/channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "ps/replica_peer.h"

namespace psrt {

class GrpcReplicaPeer final : public ReplicaPeer {
 public:
  GrpcReplicaPeer(std::shared_ptr<grpc::Channel> channel, int stripe, std::string name);
  ~GrpcReplicaPeer() override;
  absl::StatusOr<proto::ReplicateResponse> Call(const proto::ReplicateHeader& header,
                                                const std::vector<absl::Span<const char>>& data,
                                                absl::Duration timeout) override;
  const std::string& name() const override { return name_; }

 private:
  std::unique_ptr<grpc::GenericStub> stub_;
  const std::string stripe_;
  const std::string name_;
};

}  // namespace psrt

#endif  // PSRT_PS_GRPC_REPLICA_PEER_H_
