#include "ps/grpc_replica_peer.h"

#include <utility>

#include "absl/synchronization/notification.h"
#include "common/rpc_util.h"
#include "common/tensor_frame.h"
#include "grpcpp/client_context.h"
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
  // The frame references `data`; Call returns only once gRPC has let go of
  // it (a call may end by its deadline while its write path still holds it).
  absl::Notification released;
  grpc::ByteBuffer response;
  absl::Status status;
  {
    grpc::ByteBuffer request =
        EncodeTensorFrame(header, data, [&released] { released.Notify(); });
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    context.AddMetadata(kStripeMetadata, stripe_);
    absl::Notification done;
    stub_->UnaryCall(&context, "/psrt.proto.ParameterServer/Replicate", grpc::StubOptions(),
                     &request, &response, [&](grpc::Status s) {
                       status = FromGrpcStatus(s);
                       done.Notify();
                     });
    done.WaitForNotification();
  }
  released.WaitForNotification();
  if (!status.ok()) return status;
  proto::ReplicateResponse reply;
  if (absl::Status parsed = ParseFromByteBuffer(response, &reply); !parsed.ok()) return parsed;
  return reply;
}

}  // namespace psrt
