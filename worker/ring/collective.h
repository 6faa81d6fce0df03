// Collective: the ring collectives of the workers of an allreduce-mode job
// (proto/psrt.proto's Collective service), as Horovod and NCCL run them: the
// schedule of ring_schedule.h (reduce-scatter and all-gather around the
// ring, each worker sending 2 (W-1) / W of the buffer; every worker ends
// with the same bits) over the gRPC transport of grpc_ring_transport.h, or
// the data plane's of data_plane_ring_transport.h (RingOptions::data_plane),
// gRPC then keeping the control (pings).
//
// Every worker must make the same sequence of calls with buffers of the same
// sizes (the ops are numbered, and a message of another op or size is
// refused).
//
// Faults (ring_peer_rules.h has them all): a previous worker that sends
// nothing for RingOptions::timeout and then does not answer a ping either
// (its process died, hung or is unreachable; one that answers is waited for
// up to busy_timeout), a next worker that cannot be reached within it or
// refuses a message, or a peer that restarted (another incarnation) fail
// the call with an error naming that worker and its address; the
// Collective then stays failed, and answers its neighbours' pings with the
// failure (so that one waiting for it fails too, naming the cause). Sends
// are retried while the next worker is Unavailable (it may still be
// starting, or be stopping because it saw this one restart). The first op
// waits up to RingOptions::startup_timeout for the others to start (Join);
// a worker takes its predecessor's process to be the one it joined with,
// and refuses messages of later ops from any other (processes of the run
// before a restart), so that a job restarted by its supervisor comes back
// together.
//
// Thread safety: AllreduceSum and Broadcast from one thread at a time; the
// service is called by gRPC concurrently.
#ifndef PSRT_WORKER_RING_COLLECTIVE_H_
#define PSRT_WORKER_RING_COLLECTIVE_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "proto/psrt.pb.h"
#include "worker/ring/ring_options.h"
#include "worker/ring/ring_schedule.h"

namespace grpc {
class ByteBuffer;
class Service;
}  // namespace grpc

namespace psrt {

class DataPlaneRingTransport;  // worker/ring/data_plane_ring_transport.h
class GrpcRingTransport;       // worker/ring/grpc_ring_transport.h

class Collective {
 public:
  using Options = RingOptions;

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

  // What service() does with a message (or a ping) of a neighbour, for a
  // service of another's that hands this ring its messages
  // (elastic_ring.h): `ack` is the answer when OK.
  absl::Status Deliver(const grpc::ByteBuffer& frame, proto::CollectiveAck* ack);
  // Fails the op in progress and every later one with `why`, from any
  // thread. REQUIRES: the segments travel over gRPC (not
  // RingOptions::data_plane).
  void Abort(const absl::Status& why);

 private:
  // `op`, told to the neighbours' pings when it failed.
  absl::Status Ended(absl::Status op);

  const Options options_;
  // The service and the control; the segments without the data plane.
  const std::unique_ptr<GrpcRingTransport> grpc_;
  const std::unique_ptr<DataPlaneRingTransport> data_plane_;  // The segments with it.
  RingSchedule schedule_;
};

}  // namespace psrt

#endif  // PSRT_WORKER_RING_COLLECTIVE_H_
