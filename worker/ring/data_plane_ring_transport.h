// DataPlaneRingTransport: the ring collectives' segments over the data
// plane (dataplane/), worker to worker, beside the ring's control (pings,
// over gRPC: ring_control.h): a RingTransport (ring_schedule.h) with the
// gRPC transport's semantics (RingPeerRules, ring_peer_rules.h) and without
// gRPC's copies. Collective (collective.h) chooses it with
// RingOptions::data_plane (psrt_worker's --tensor_transport=socket).
//
// Each worker listens for its previous worker on a TCP port of its own
// (RingOptions::data_port, else any free one, on data_listen_host) and,
// with RingOptions::local_data_plane, on an abstract Unix socket of its
// own name; whoever pings it learns both (data_address,
// data_local_address), and its sender asks the next worker so before
// connecting: to the Unix socket, found only on the next worker's host,
// else TCP. Every connection opens with a hello carrying the auth token
// (dataplane/hello.h).
//
// A segment is one frame (method kRingSegment) whose metadata is a
// CollectiveHeader (op, step, sender, incarnation) and whose data is the
// segment: sent with sendmsg from the caller's buffer by a sender thread,
// and read by the receiving op thread straight into its destination, or
// added into it 64 KiB at a time. The receiver acknowledges each frame once
// read (an empty reply) or refuses it (an error reply, as RingPeerRules
// judges it, or a step other than the one awaited), and the sender waits
// for that answer. A receiver's hello answer names the last segment it
// took, so that a sender whose answer was lost does not wait for the
// receiver's next op to hear it again.
//
// Faults: a send whose connection fails is sent again on a new one, with
// backoff, until the op's timeout; its receiver skips what it had read of
// it already (a segment added in part is not added twice), or drops it
// when it had taken it whole. A silent previous worker, or a next worker
// that has not read a segment within the op's timeout, is pinged and
// waited for while it answers. A hello refused for its token, when the
// previous worker does not answer a ping either, fails the receive
// (Unauthenticated). Errors name the peer.
//
// Thread safety: StartSend, FinishSend and Receive from one thread at a
// time; the listeners' threads and the sender thread are the transport's.
#ifndef PSRT_WORKER_RING_DATA_PLANE_RING_TRANSPORT_H_
#define PSRT_WORKER_RING_DATA_PLANE_RING_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "worker/ring/ring_control.h"
#include "worker/ring/ring_options.h"
#include "worker/ring/ring_peer_rules.h"
#include "worker/ring/ring_schedule.h"

namespace psrt {

namespace dataplane {
class FrameConnection;
class FrameListener;
}  // namespace dataplane

class TransportSecurity;  // common/transport_security.h

class DataPlaneRingTransport final : public RingTransport {
 public:
  // Listens at once; a listener that cannot start fails every op, naming
  // why. Uses every option but the timeline. REQUIRES: `control` outlives
  // the transport.
  DataPlaneRingTransport(const RingOptions& options, RingControl* control);
  ~DataPlaneRingTransport() override;

  // Where the previous worker reaches this one's TCP listener ("host:port";
  // empty when it could not start), and its Unix socket ("": none): to be
  // told to whoever pings this worker.
  const std::string& data_address() const { return data_address_; }
  const std::string& data_local_address() const { return data_local_address_; }

  std::unique_ptr<Send> StartSend(int64_t op, int step, absl::Span<const char> bytes) override;
  absl::Status FinishSend(std::unique_ptr<Send> send, bool op_failed) override;
  absl::Status Receive(int64_t op, int step, absl::Span<char> bytes, bool add) override;

 private:
  struct Outgoing;

  // Accepts connections on `listener` until the transport closes; each one
  // that says hello with the token becomes the incoming connection.
  void AcceptLoop(dataplane::FrameListener* listener);
  // Sends the queued segments, one at a time.
  void SendLoop();
  // One segment, connecting (again) as needed.
  absl::Status SendSegment(Outgoing* out);
  // One attempt on the current connection (opened first if there is none).
  absl::Status TrySend(Outgoing* out);

  // The frame of (op, step) from `in` into `bytes`: OK once it is taken,
  // NotFound for a frame taken before (a retry: dropped), else why not.
  // `refused` says whether the error is this worker's verdict on the frame
  // (told to its sender), not the connection's failure.
  absl::Status ReadSegment(dataplane::FrameConnection* in, int64_t op, int step,
                           absl::Span<char> bytes, bool add, bool* refused);
  // The newest incoming connection, if one arrived since the last call.
  std::unique_ptr<dataplane::FrameConnection> TakeIncoming();

  RingControl* const control_;
  const std::shared_ptr<const TransportSecurity> security_;
  const std::string credential_;  // Said in the hello to the next worker.
  absl::Status listen_error_;     // Set in the constructor only.
  std::string data_address_;      // Likewise.
  std::string data_local_address_;  // Likewise.
  std::vector<std::unique_ptr<dataplane::FrameListener>> listeners_;
  std::vector<std::thread> accept_threads_;

  // The op thread's own: the connection from the previous worker it reads,
  // and how far into the segment (op, step) it got (a resent frame skips
  // that much).
  std::unique_ptr<dataplane::FrameConnection> in_;
  std::pair<int64_t, int> partial_ = {0, 0};
  uint64_t partial_bytes_ = 0;

  absl::Mutex mu_;
  // Its state under mu_: what the op thread took (told in hello answers by
  // the accept threads) and the hellos refused for their token.
  RingPeerRules rules_;
  std::unique_ptr<dataplane::FrameConnection> incoming_ ABSL_GUARDED_BY(mu_);
  Outgoing* queued_ ABSL_GUARDED_BY(mu_) = nullptr;
  // A send that failed for good: the receive need not wait any longer.
  absl::Status send_error_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  // The sender thread's connection to the next worker; shut down by
  // FinishSend to cancel a send.
  std::unique_ptr<dataplane::FrameConnection> out_ ABSL_GUARDED_BY(mu_);
  uint64_t request_id_ = 0;  // The sender thread's.
  int connects_ = 0;         // Likewise: connections opened to the next worker.
  std::thread send_thread_;
};

}  // namespace psrt

#endif  // PSRT_WORKER_RING_DATA_PLANE_RING_TRANSPORT_H_
