// Collective: the ring collectives of the workers of an allreduce-mode job
// (proto/psrt.proto's Collective service), as Horovod and NCCL run them.
//
// Worker r of W sends only to worker r+1 (mod W) and receives only from
// worker r-1. AllreduceSum cuts the buffer into W segments and runs W-1
// reduce-scatter steps (send a segment, add the one received into its own)
// and W-1 all-gather steps (send a reduced segment, copy the one received);
// each worker sends and receives 2 (W-1) / W of the buffer. Each segment's
// sum is computed once, by one worker, in ring order, and copied to the
// others, so every worker ends with the same bits. Broadcast passes a buffer
// around the ring from its root.
//
// Every worker must make the same sequence of calls with buffers of the same
// sizes (the ops are numbered, and a message of another op or size is
// refused). Messages are tensor frames: a segment travels from the caller's
// buffer without a copy, and is read from gRPC's buffers straight into the
// destination.
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
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace grpc {
class ByteBuffer;
class Service;
class Status;
}  // namespace grpc

namespace psrt {

class Timeline;           // common/timeline.h
class TransportSecurity;  // common/transport_security.h

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
  class Service;
  struct Call;
  // AllreduceSum once joined.
  absl::Status Reduce(absl::Span<float> data);
  // Names worker `rank` in errors: "worker/1 (host:port)".
  std::string PeerName(int rank) const;
  // Starts sending `segment` as step `step` of op `op` to the next worker.
  std::unique_ptr<Call> StartSend(int64_t op, int step, absl::Span<const char> bytes);
  // Sends call->request once more, on a new context.
  void StartAttempt(Call* call);
  // The error of a send that failed with `status`, naming the next worker.
  absl::Status SendError(const grpc::Status& status) const;
  // Waits for `call` to be delivered (and its data released by gRPC).
  absl::Status FinishSend(std::unique_ptr<Call> call);
  // Waits for step `step` of op `op` from the previous worker and adds it
  // into `bytes`, as floats (or copies it there).
  absl::Status Receive(int64_t op, int step, absl::Span<char> bytes, bool add);
  // Whether the previous worker's process answers within `deadline` (a
  // Deliver of op 0).
  absl::Status Ping(absl::Duration deadline);
  // The silence allowed now: startup_timeout for the first op.
  absl::Duration Timeout(int64_t op) const;
  // Records `status` as the Collective's failure (the first one sticks).
  absl::Status Fail(absl::Status status);

  // From the service: a message of the previous worker.
  absl::Status Deliver(const grpc::ByteBuffer& frame);

  const Options options_;
  const int64_t incarnation_;
  std::unique_ptr<Service> service_;
  struct Channel;
  std::unique_ptr<Channel> next_;      // To worker rank + 1; reset when failed.
  std::unique_ptr<Channel> previous_;  // To worker rank - 1, for pings.
  int64_t op_ = 0;                 // Ops started so far.
  absl::Status failed_;            // The caller's thread only.

  absl::Mutex mu_;
  // Received and not yet taken, by (op, step).
  std::map<std::pair<int64_t, int>, std::unique_ptr<grpc::ByteBuffer>> inbox_
      ABSL_GUARDED_BY(mu_);
  int64_t previous_incarnation_ ABSL_GUARDED_BY(mu_) = 0;  // 0: none seen.
  // The last (op, step) taken from the inbox: a retry of it is dropped.
  std::pair<int64_t, int> last_taken_ ABSL_GUARDED_BY(mu_) = {0, 0};
  absl::Status peer_error_ ABSL_GUARDED_BY(mu_);           // From Deliver.
};

}  // namespace psrt

#endif  // PSRT_WORKER_STORE_COLLECTIVE_H_
