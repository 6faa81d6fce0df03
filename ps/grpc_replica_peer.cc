#include "ps/grpc_replica_peer.h"

#include <utility>

#include "absl/synchronization/notification.h"
#include "common/rpc_util.h"
#include "common/tensor_frame.h"
#include "grpcpp/client_context.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"

namespace psrt {

GrpcReplicaPeer::GrpcReplicaPeer(std::shared_ptr<grpc::Channel> channel, int stripe,
                                 std::string name)
    : stub_(std::make_unique<grpc::GenericStub>(std::move(channel))),
      stripe_(std::to_string(stripe)),
      name_(std::move(name)) {}

GrpcReplicaPeer::~GrpcReplicaPeer() = default;

absl::StatusOr<proto::ReplicateResponse> GrpcReplicaPeer::Call(
    const proto::ReplicateHeader& header, const std::vector<absl::Span<const char>>& data,
    absl::Duration timeout) {
  // The call completes on a queue of its own, which this thread polls: the
  // caller may hold its shard while gRPC's callback threads wait for that
  // shard (a status request), so the answer must not need one of them.
  // The frame references `data`; Call returns only once gRPC has let go of
  // it (a call may end by its deadline while its write path still holds it).
  absl::Notification released;
  grpc::ByteBuffer response;
  grpc::Status status;
  {
    grpc::CompletionQueue queue;
    {
      const grpc::ByteBuffer request =
          EncodeTensorFrame(header, data, [&released] { released.Notify(); });
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
      context.AddMetadata(kStripeMetadata, stripe_);
      std::unique_ptr<grpc::GenericClientAsyncResponseReader> call = stub_->PrepareUnaryCall(
          &context, "/psrt.proto.ParameterServer/Replicate", request, &queue);
      call->StartCall();
      int tag = 0;
      call->Finish(&response, &status, &tag);
      void* got = nullptr;
      bool ok = false;
      while (queue.Next(&got, &ok) && got != &tag) {
      }
    }
    queue.Shutdown();
    void* got = nullptr;
    bool ok = false;
    while (queue.Next(&got, &ok)) {
    }
  }
  released.WaitForNotification();
  if (!status.ok()) return FromGrpcStatus(status);
  proto::ReplicateResponse reply;
  if (absl::Status parsed = ParseFromByteBuffer(response, &reply); !parsed.ok()) return parsed;
  return reply;
}

}  // namespace psrt
