#include "worker/ring/collective.h"

#include "common/transport_security.h"
#include "glog/logging.h"
#include "worker/ring/data_plane_ring_transport.h"
#include "worker/ring/grpc_ring_transport.h"

namespace psrt {

Collective::Collective(Options options)
    : options_(std::move(options)),
      grpc_(std::make_unique<GrpcRingTransport>(options_)),
      data_plane_(options_.data_plane
                      ? std::make_unique<DataPlaneRingTransport>(options_, grpc_.get())
                      : nullptr),
      schedule_(
          options_.rank, size(),
          data_plane_ != nullptr ? static_cast<RingTransport*>(data_plane_.get()) : grpc_.get(),
          options_.timeline) {
  CHECK(!options_.data_plane || options_.security == nullptr || !options_.security->tls())
      << "the ring's data plane has no TLS";
  // Whoever pings this worker learns where it takes segments.
  if (data_plane_ != nullptr) {
    grpc_->set_data_addresses(data_plane_->data_address(), data_plane_->data_local_address());
  }
}

Collective::~Collective() = default;

grpc::Service* Collective::service() { return grpc_->service(); }

absl::Status Collective::Join() { return Ended(schedule_.Join()); }

absl::Status Collective::AllreduceSum(absl::Span<float> data) {
  return Ended(schedule_.AllreduceSum(data));
}

absl::Status Collective::Broadcast(absl::Span<char> data, int root) {
  return Ended(schedule_.Broadcast(data, root));
}

absl::Status Collective::Ended(absl::Status op) {
  if (!op.ok()) grpc_->Failed(op);  // Told to the neighbours that ping.
  return op;
}

absl::Status Collective::Deliver(const grpc::ByteBuffer& frame, proto::CollectiveAck* ack) {
  return grpc_->Deliver(frame, ack);
}

void Collective::Abort(const absl::Status& why) {
  CHECK(data_plane_ == nullptr) << "Abort: the ring's segments travel over the data plane";
  grpc_->Abort(why);
}

}  // namespace psrt
