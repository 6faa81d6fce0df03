#include "worker/store/collective.h"

#include "common/transport_security.h"
#include "glog/logging.h"
#include "worker/store/grpc_ring_transport.h"
#include "worker/store/socket_ring_transport.h"

namespace psrt {

Collective::Collective(Options options)
    : options_(std::move(options)),
      grpc_(std::make_unique<GrpcRingTransport>(options_)),
      socket_(options_.data_plane ? std::make_unique<SocketRingTransport>(options_, grpc_.get())
                                  : nullptr),
      schedule_(options_.rank, size(),
                socket_ != nullptr ? static_cast<RingTransport*>(socket_.get()) : grpc_.get(),
                options_.timeline) {
  CHECK(!options_.data_plane || options_.security == nullptr || !options_.security->tls())
      << "the ring's data plane has no TLS";
}

Collective::~Collective() = default;

grpc::Service* Collective::service() { return grpc_->service(); }

absl::Status Collective::Join() { return schedule_.Join(); }

absl::Status Collective::AllreduceSum(absl::Span<float> data) {
  return schedule_.AllreduceSum(data);
}

absl::Status Collective::Broadcast(absl::Span<char> data, int root) {
  return schedule_.Broadcast(data, root);
}

}  // namespace psrt
