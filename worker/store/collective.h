// Collective: the ring collectives of the workers of an allreduce-mode job
// (proto/psrt.proto's Collective service), as Horovod and NCCL run them: the
// schedule of ring_schedule.h (reduce-scatter and all-gather around the
// ring, each worker sending 2 (W-1) / W of the buffer; every worker ends
// with the same bits) over the gRPC transport of grpc_ring_transport.h, or
// the data plane's of socket_ring_transport.h (Options::data_plane).
//
// Every worker must make the same sequence of calls with buffers of the same
// sizes (the ops are numbered, and a message of another op or size is
// refused).
//
// Faults: a previous worker that sends nothing for Options::timeout and
// then does not answer a ping either (its process died, hung or is
// unreachable; one that answers is waited for up to busy_timeout), a next
// worker that cannot be
// reached within it or refuses a message, or a peer that restarted
// (another incarnation) fail the call with an error naming that worker and
// its address; the Collective then stays failed. Sends are retried while the
// next worker is Unavailable (it may still be starting, or be stopping
// because it saw this one restart). The first op waits up to
// Options::startup_timeout for the others to start (Join); a worker takes
// its predecessor's process to be the one it joined with, and refuses
// messages of later ops from any other (processes of the run before a
// restart), so that a job restarted by its supervisor comes back together.
//
// Thread safety: AllreduceSum and Broadcast from one thread at a time; the
// service is called by gRPC concurrently.
#ifndef PSRT_WORKER_STORE_COLLECTIVE_H_
#define PSRT_WORKER_STORE_COLLECTIVE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "worker/store/ring_schedule.h"

namespace grpc {
class Service;
}  // namespace grpc

namespace psrt {

class GrpcRingTransport;    // worker/store/grpc_ring_transport.h
class SocketRingTransport;  // worker/store/socket_ring_transport.h
class Timeline;             // common/timeline.h
class TransportSecurity;    // common/transport_security.h

class Collective {
 public:
  struct Options {
    int rank = 0;
    std::vector<std::string> addresses;  // Worker r's "host:port" at [r].
    // TLS and the auth token of the channel to the next worker; null:
    // plaintext, no token. (The server side is the worker's own server.)
    std::shared_ptr<const TransportSecurity> security;
    // How long a peer may stay silent or unreachable within an op.
    absl::Duration timeout = absl::Seconds(60);
    // The same for the first op, while the workers start.
    absl::Duration startup_timeout = absl::Seconds(300);
    // How long a previous worker that still answers (a ping, once it has
    // been silent for `timeout`) may go on sending nothing: the chief
    // evaluating or saving between steps.
    absl::Duration busy_timeout = absl::Minutes(30);
    // Reach the next worker over its Unix socket when its address is a
    // loopback one (rpc_util.h's PreferLocalSocket; it must serve there).
    // Not with TLS, whose certificates name the TCP host.
    bool unix_socket = false;
    // Move the segments over the data plane (socket_ring_transport.h),
    // gRPC keeping the control (pings); not with TLS, which the data plane
    // does not have.
    bool data_plane = false;
    // The host whose interface the data plane listens on; empty: the host
    // of addresses[rank]. Its TCP port; 0: any free one. (Others reach it at
    // addresses[rank]'s host and that port.)
    std::string data_listen_host;
    int data_port = 0;
    // Records each AllreduceSum's reduce_scatter and all_gather phases;
    // null: none. REQUIRES: outlives the Collective.
    Timeline* timeline = nullptr;
  };

  explicit Collective(Options options);
  ~Collective();
  Collective(const Collective&) = delete;
  Collective& operator=(const Collective&) = delete;

  // The service that receives the previous worker's messages: register it
  // on the server at addresses[rank] (with no message size cap) before the
  // first op. Owned by the Collective.
  grpc::Service* service();

  int rank() const { return options_.rank; }
  int size() const { return static_cast<int>(options_.addresses.size()); }

  // The first op, which every call makes first if it has not run: a
  // barrier that returns once every worker is up and reaches the next one
  // (its address, TLS and token work), and that fixes which process of the
  // previous worker this one takes messages from.
  absl::Status Join();
  // Replaces `data` on every worker by the element-wise sum of all workers'.
  absl::Status AllreduceSum(absl::Span<float> data);
  // Replaces `data` on every worker by `root`'s.
  absl::Status Broadcast(absl::Span<char> data, int root);

 private:
  const Options options_;
  const std::unique_ptr<GrpcRingTransport> grpc_;      // The service; the segments without
                                                       // the data plane.
  const std::unique_ptr<SocketRingTransport> socket_;  // The segments with it.
  RingSchedule schedule_;
};

}  // namespace psrt

#endif  // PSRT_WORKER_STORE_COLLECTIVE_H_
