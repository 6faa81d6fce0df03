// RingSchedule: the ring collectives' schedule, free of any transport: which
// segment of the buffer goes to the next worker and which one comes from the
// previous worker at each step, over a RingTransport (gRPC in
// grpc_ring_transport.h, the data plane in data_plane_ring_transport.h;
// tests use an in-memory one). Collective (collective.h) puts them
// together.
//
// Worker r of W sends only to worker r+1 (mod W) and receives only from
// worker r-1. AllreduceSum cuts the buffer into W segments (segment i of n
// elements: [i n / W, (i + 1) n / W)) and runs W-1 reduce-scatter steps (send
// a segment, add the one received into its own) and W-1 all-gather steps
// (send a reduced segment, copy the one received); each worker sends and
// receives 2 (W-1) / W of the buffer. Each segment's sum is computed once, by
// one worker, in ring order, and copied to the others, so every worker ends
// with the same bits. Broadcast passes a buffer around the ring from its
// root.
//
// Ops are numbered from 1 (op 1 is Join, which every call makes first if it
// has not run), and every worker must make the same sequence of calls with
// buffers of the same sizes. The first error of the transport sticks: every
// later call returns it.
//
// Thread safety: one thread at a time.
#ifndef PSRT_WORKER_RING_RING_SCHEDULE_H_
#define PSRT_WORKER_RING_RING_SCHEDULE_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace psrt {

class Timeline;  // common/timeline.h

// RingTransport: the messages of a ring collective: step `step` of op `op`
// goes to the next worker, and comes from the previous one. An
// implementation waits for its peers as long as op's timeouts allow, and its
// errors name the peer (its rank and address).
//
// Thread safety: called by one RingSchedule, from one thread at a time.
class RingTransport {
 public:
  // A message on its way to the next worker.
  class Send {
   public:
    virtual ~Send() = default;
  };

  virtual ~RingTransport() = default;

  // Starts sending `bytes` as step `step` of op `op` to the next worker.
  // REQUIRES: `bytes` stays valid until FinishSend returns.
  virtual std::unique_ptr<Send> StartSend(int64_t op, int step,
                                          absl::Span<const char> bytes) = 0;
  // Waits until `send` is delivered and its bytes are no longer read. With
  // `op_failed` (the op failed already, its receive did) the send is not
  // waited for: it stops being retried and is cancelled, and FinishSend
  // returns once its bytes are no longer read.
  virtual absl::Status FinishSend(std::unique_ptr<Send> send, bool op_failed) = 0;
  // Waits for step `step` of op `op` from the previous worker, of exactly
  // bytes.size() bytes, and adds it into `bytes` as floats (`add`) or
  // copies it there.
  virtual absl::Status Receive(int64_t op, int step, absl::Span<char> bytes, bool add) = 0;
};

class RingSchedule {
 public:
  // Worker `rank` of `size`. REQUIRES: 0 <= rank < size; `transport`
  // outlives the schedule; `timeline` (records each AllreduceSum's
  // reduce_scatter and all_gather phases) is null or outlives it.
  RingSchedule(int rank, int size, RingTransport* transport, Timeline* timeline = nullptr);

  // The first op: a barrier over the ring (an allreduce of one float).
  absl::Status Join();
  // Replaces `data` on every worker by the element-wise sum of all workers'.
  absl::Status AllreduceSum(absl::Span<float> data);
  // Replaces `data` on every worker by `root`'s.
  absl::Status Broadcast(absl::Span<char> data, int root);

 private:
  // AllreduceSum once joined.
  absl::Status Reduce(absl::Span<float> data);
  // Records `status` as the schedule's failure (the first one sticks).
  absl::Status Fail(absl::Status status);

  const int rank_;
  const int size_;
  RingTransport* const transport_;
  Timeline* const timeline_;
  int64_t op_ = 0;        // Ops started so far.
  absl::Status failed_;
};

}  // namespace psrt

#endif  // PSRT_WORKER_RING_RING_SCHEDULE_H_
