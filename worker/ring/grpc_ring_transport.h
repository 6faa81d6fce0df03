// GrpcRingTransport: the ring collectives' messages over gRPC (proto/
// psrt.proto's Collective service): a RingTransport (ring_schedule.h) that
// sends to the next worker's Deliver and serves its own Deliver to the
// previous worker; and the ring's RingControl (ring_control.h): a Deliver
// of op 0 is a ping, whose answer names where the pinged worker takes
// segments over the data plane. Collective (collective.h) is its one user.
//
// Messages are tensor frames: a segment travels from the caller's buffer
// without a copy, and is read from gRPC's buffers straight into the
// destination. Each names its op, step, sender and the sender's
// incarnation, and is taken or refused by RingPeerRules
// (ring_peer_rules.h), which also states the faults: a silent previous
// worker is pinged and waited for while it answers; sends are retried with
// backoff while the next worker is Unavailable, until the op's timeout.
//
// Thread safety: StartSend, FinishSend and Receive from one thread at a
// time; the service is called by gRPC concurrently, and RingControl's
// methods from any thread.
#ifndef PSRT_WORKER_RING_GRPC_RING_TRANSPORT_H_
#define PSRT_WORKER_RING_GRPC_RING_TRANSPORT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "grpcpp/generic/generic_stub.h"
#include "proto/psrt.pb.h"
#include "worker/ring/ring_control.h"
#include "worker/ring/ring_options.h"
#include "worker/ring/ring_peer_rules.h"
#include "worker/ring/ring_schedule.h"

namespace grpc {
class Service;
}  // namespace grpc

namespace psrt {

class GrpcRingTransport final : public RingTransport, public RingControl {
 public:
  // Uses every option but the timeline and the data plane's.
  explicit GrpcRingTransport(const RingOptions& options);
  ~GrpcRingTransport() override;

  // The service that receives the previous worker's messages (see
  // Collective::service). Owned by the transport.
  grpc::Service* service();

  // Where this worker takes segments over the data plane
  // (data_plane_ring_transport.h): TCP ("host:port") and its Unix socket
  // ("" for none), told to whoever pings it. REQUIRES: called before
  // service() is registered.
  void set_data_addresses(std::string tcp, std::string local) {
    data_address_ = std::move(tcp);
    data_local_address_ = std::move(local);
  }

  // What the service does with a message of the previous worker (or a
  // neighbour's ping): `ack` is its answer when OK. For a service that
  // hands messages on to this transport (elastic_ring.h).
  absl::Status Deliver(const grpc::ByteBuffer& frame, proto::CollectiveAck* ack);
  // Fails the op in progress (its receive returns at once, its send is not
  // retried) and every later one with `why`.
  void Abort(const absl::Status& why);
  // This worker's ring failed for good with `why` (the Collective stays
  // failed): a neighbour's ping is answered with it from now on, so that a
  // neighbour waiting for this worker fails too instead of waiting for it
  // as for a busy one.
  void Failed(const absl::Status& why);

  absl::Status PingPrevious(absl::Duration deadline) override;
  absl::StatusOr<std::vector<std::string>> NextDataAddresses(absl::Duration deadline) override;

  std::unique_ptr<Send> StartSend(int64_t op, int step, absl::Span<const char> bytes) override;
  absl::Status FinishSend(std::unique_ptr<Send> send, bool op_failed) override;
  absl::Status Receive(int64_t op, int step, absl::Span<char> bytes, bool add) override;

 private:
  class Service;
  struct Call;
  // Sends call->request once more, on a new context.
  void StartAttempt(Call* call);
  // If `call`'s last attempt found the next worker Unavailable, sends it
  // again once its backoff is over (before its give_up); never waits.
  // True when no attempt is due any more: the send failed for good. (The
  // attempt it starts may already have failed when it returns.)
  bool RetryWhenDue(Call* call);
  // A Deliver of op 0 to `stub`'s worker, answered within `deadline`.
  absl::StatusOr<proto::CollectiveAck> PingOver(grpc::GenericStub* stub, absl::Duration deadline);

  // Its state (Judge, Took, the refusals of Deliver calls without this
  // process's token) under mu_.
  RingPeerRules rules_;
  std::string data_address_, data_local_address_;
  std::unique_ptr<Service> service_;
  // To the next worker; reset when a send failed for good.
  std::unique_ptr<grpc::GenericStub> next_;
  std::unique_ptr<grpc::GenericStub> previous_;  // For pings.
  // The op thread's send between StartSend and FinishSend, retried while
  // Receive waits.
  Call* sending_ = nullptr;
  int refused_listener_ = -1;  // AddRefusedCallListener's id.

  absl::Mutex mu_;
  // Received and not yet taken, by (op, step).
  std::map<std::pair<int64_t, int>, std::unique_ptr<grpc::ByteBuffer>> inbox_ ABSL_GUARDED_BY(mu_);
  // From Deliver, sends and refusals; sticky.
  absl::Status peer_error_ ABSL_GUARDED_BY(mu_);
  absl::Status failed_ ABSL_GUARDED_BY(mu_);  // Failed's.
};

}  // namespace psrt

#endif  // PSRT_WORKER_RING_GRPC_RING_TRANSPORT_H_
