// GrpcRingTransport: the ring collectives' messages over gRPC (proto/
// psrt.proto's Collective service): a RingTransport (ring_schedule.h) that
// sends to the next worker's Deliver and serves its own Deliver to the
// previous worker. Collective (collective.h, whose Options it takes) is its
// one user.
//
// Messages are tensor frames: a segment travels from the caller's buffer
// without a copy, and is read from gRPC's buffers straight into the
// destination. Each names its op, step, sender and the sender's
// incarnation; a message of another sender, op or size is refused.
//
// Faults: as collective.h states them. A previous worker that sends nothing
// for the op's timeout (Options::startup_timeout for the first op) is pinged
// (a Deliver of op 0), and waited for up to busy_timeout if it answers;
// sends are retried with backoff (50 ms doubling to 1 s) while the next
// worker is Unavailable, until the op's timeout. A previous worker's
// process is the one that joined (op 1); another one (a restart) fails the
// receive. Every error names the peer: "worker/1 (host:port)".
//
// Thread safety: StartSend, FinishSend and Receive from one thread at a
// time; the service is called by gRPC concurrently.
#ifndef PSRT_WORKER_STORE_GRPC_RING_TRANSPORT_H_
#define PSRT_WORKER_STORE_GRPC_RING_TRANSPORT_H_

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
#include "worker/store/collective.h"
#include "worker/store/ring_schedule.h"

namespace grpc {
class Service;
}  // namespace grpc

namespace psrt::proto {
class CollectiveAck;
}  // namespace psrt::proto

namespace psrt {

class GrpcRingTransport final : public RingTransport {
 public:
  // Uses every option but the timeline.
  explicit GrpcRingTransport(const Collective::Options& options);
  ~GrpcRingTransport() override;

  // The service that receives the previous worker's messages (see
  // Collective::service). Owned by the transport.
  grpc::Service* service();

  // Where this worker takes segments over the data plane
  // (socket_ring_transport.h), told to whoever pings it. REQUIRES: called
  // before service() is registered.
  void set_data_address(std::string address) { data_address_ = std::move(address); }
  // Whether the previous worker's process answers within `deadline` (a
  // Deliver of op 0).
  absl::Status Ping(absl::Duration deadline);
  // The next worker's data address, from its answer to a ping; an error
  // when it does not answer, or serves the ring over gRPC only.
  absl::StatusOr<std::string> NextDataAddress(absl::Duration deadline);
  // Names worker `rank` in errors: "worker/1 (host:port)".
  std::string PeerName(int rank) const;
  // The silence allowed now: startup_timeout for the first op.
  absl::Duration Timeout(int64_t op) const;

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
  void RetryWhenDue(Call* call);
  // The error of a send that failed with `status`, naming the next worker.
  absl::Status SendError(const grpc::Status& status) const;
  // A Deliver of op 0 to `stub`'s worker, answered within `deadline`.
  absl::StatusOr<proto::CollectiveAck> PingOver(grpc::GenericStub* stub, absl::Duration deadline);
  // After a refused Deliver: OK when the previous worker takes this
  // worker's token (a ping), else the Unauthenticated error naming it
  // (sticky, as peer_error_).
  absl::Status CheckRefusal();
  // From the service: a message of the previous worker.
  absl::Status Deliver(const grpc::ByteBuffer& frame);

  const Collective::Options options_;
  const int next_rank_;
  const int previous_rank_;
  const int64_t incarnation_;
  std::string data_address_;
  std::unique_ptr<Service> service_;
  // To the next worker; reset when a send failed for good.
  std::unique_ptr<grpc::GenericStub> next_;
  std::unique_ptr<grpc::GenericStub> previous_;  // For pings.
  // The op thread's send between StartSend and FinishSend, retried while
  // Receive waits.
  Call* sending_ = nullptr;
  int refused_listener_ = -1;  // AddRefusedCallListener's id.
  int refusals_checked_ = 0;   // Of refused_deliveries_, by the op thread.

  absl::Mutex mu_;
  // Received and not yet taken, by (op, step).
  std::map<std::pair<int64_t, int>, std::unique_ptr<grpc::ByteBuffer>> inbox_ ABSL_GUARDED_BY(mu_);
  int64_t previous_incarnation_ ABSL_GUARDED_BY(mu_) = 0;  // 0: none seen.
  // The last (op, step) taken from the inbox: a retry of it is dropped.
  std::pair<int64_t, int> last_taken_ ABSL_GUARDED_BY(mu_) = {0, 0};
  absl::Status peer_error_ ABSL_GUARDED_BY(mu_);  // From Deliver and sends.
  // Deliver calls this process's servers refused for their auth token: the
  // previous worker's, if it does not answer a ping either.
  int refused_deliveries_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace psrt

#endif  // PSRT_WORKER_STORE_GRPC_RING_TRANSPORT_H_
