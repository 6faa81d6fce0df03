#include "worker/store/collective.h"

#include "worker/store/grpc_ring_transport.h"

namespace psrt {

Collective::Collective(Options options)
    : options_(std::move(options)),
      transport_(std::make_unique<GrpcRingTransport>(options_)),
      schedule_(options_.rank, size(), transport_.get(), options_.timeline) {}

Collective::~Collective() = default;

grpc::Service* Collective::service() { return transport_->service(); }

absl::Status Collective::Join() { return schedule_.Join(); }

absl::Status Collective::AllreduceSum(absl::Span<float> data) {
  return schedule_.AllreduceSum(data);
}

absl::Status Collective::Broadcast(absl::Span<char> data, int root) {
  return schedule_.Broadcast(data, root);
}

}  // namespace psrt
