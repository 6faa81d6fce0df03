// GrpcShardTransport: the ShardTransport (shard_transport.h) over gRPC: one
// channel per ps shard (shard k: a channel of its own, and the stripe it
// names in its calls' metadata, kStripeMetadata of common/rpc_util.h), every
// ParameterServer method. Init and Push requests, and Pull replies, are
// tensor frames (common/tensor_frame.h) that reference the caller's memory
// and the received slices: tensor bytes are never copied through protobuf.
// Destroying an attempt waits until gRPC has dropped every reference to the
// request's memory (a call that ended by deadline or cancel may still hold
// it in its write path, until its context is gone). Calls fail fast (no wait for ready): an
// unreachable ps is Unavailable, for ShardCalls to retry.
//
// Thread safety: AddShard before any call; then Start may run on several
// threads at once.
#ifndef PSRT_WORKER_STORE_GRPC_SHARD_TRANSPORT_H_
#define PSRT_WORKER_STORE_GRPC_SHARD_TRANSPORT_H_

#include <memory>
#include <string>
#include <vector>

#include "grpcpp/channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "worker/store/shard_transport.h"

namespace psrt {

class GrpcShardTransport final : public ShardTransport {
 public:
  // Adds the next shard: its channel and the stripe it serves on it.
  void AddShard(std::shared_ptr<grpc::Channel> channel, int stripe);

  std::unique_ptr<ShardAttempt> Start(int shard, PsMethod method, const ShardRequest& request,
                                      absl::Time deadline, const OnReply& on_reply,
                                      Done done) override;
  bool Supports(PsMethod) const override { return true; }
  uint64_t WireBytes(const ShardRequest& request) const override;

 private:
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs_;  // One per shard.
  std::vector<std::string> stripes_;  // Per shard: its stripe, as metadata.
};

}  // namespace psrt

#endif  // PSRT_WORKER_STORE_GRPC_SHARD_TRANSPORT_H_
