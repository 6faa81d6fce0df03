// RingPeerRules: how a worker of the ring deals with its two neighbours,
// written once for both transports (grpc_ring_transport.h,
// data_plane_ring_transport.h), which call it:
//
// - Only the previous worker sends segments, of this ring's generation
//   (CheckSender): an elastic job's message of an earlier generation is
//   refused (FailedPrecondition: its sender's ring is gone), one of a later
//   generation is Unavailable (its sender retries until this worker has
//   joined that ring).
// - The previous worker's process is the one that joins (op 1). Until one
//   has, a message of a later op comes from a process of the run before
//   this one started (a job restarting after a fault): it is refused
//   (FailedPrecondition, so that it stops too) and fails nothing here. Once
//   one has, a message of another incarnation means that it restarted: it
//   is refused as Unavailable (it retries, and reaches this worker's
//   successor once that has restarted too) and fails this worker's op,
//   Aborted. A message at or below the last segment taken was sent again
//   after its answer was lost: answered OK and dropped (Judge, Took).
// - A segment of another size than this worker's fails the op
//   (CheckSize); one is added into the buffer 64 KiB at a time, or copied
//   (TakeSegment).
// - A neighbour silent for the op's timeout (Timeout: startup_timeout for
//   the first op) is pinged, and waited for up to busy_timeout while it
//   answers (CheckSilent), unless it answers that it left the ring (its
//   Collective failed: FailedPrecondition); a message refused for its auth
//   token fails the op only when the previous worker does not answer a ping
//   either (CheckRefusal: any client may be refused).
// - Sends are retried with backoff (SendBackoff: 50 ms doubling to 1 s)
//   while the next worker is Unavailable; a failed op's send in flight is
//   given kFailedOpSendGrace to land (a live next worker then learns of the
//   op's failure from the message itself).
//
// Every error names the peer: "worker/1 (host:port)".
//
// Thread safety: the const methods may be called from any thread; Judge,
// Took, LastTakenText, CountRefusal, refusal_pending and TakeRefusal need
// external synchronization (each transport calls them under its mutex).
#ifndef PSRT_WORKER_RING_RING_PEER_RULES_H_
#define PSRT_WORKER_RING_RING_PEER_RULES_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/backoff.h"
#include "proto/psrt.pb.h"
#include "worker/ring/ring_control.h"
#include "worker/ring/ring_options.h"

namespace psrt {

class RingPeerRules {
 public:
  // How long a failed op's send in flight is given to land.
  static constexpr absl::Duration kFailedOpSendGrace = absl::Seconds(2);
  // Ends the errors of a worker refused for its auth token.
  static constexpr char kTokenHint[] = "do the workers share --auth_token_file or PSRT_AUTH_TOKEN?";

  // REQUIRES: 0 <= options.rank < options.addresses.size(); `control`
  // outlives the rules.
  RingPeerRules(const RingOptions& options, RingControl* control);

  const RingOptions& options() const { return options_; }
  int next_rank() const { return next_rank_; }
  int previous_rank() const { return previous_rank_; }
  // Names worker `rank` in errors: "worker/1 (host:port)".
  std::string PeerName(int rank) const;
  // The silence allowed within op `op`: startup_timeout for the first op.
  absl::Duration Timeout(int64_t op) const;
  // The header of this process's step `step` of op `op` (op 0: a ping).
  proto::CollectiveHeader Header(int64_t op, int step) const;
  // The delays between a send's attempts.
  static Backoff SendBackoff() { return Backoff(absl::Milliseconds(50), absl::Seconds(1)); }
  // The error of a send that failed with `status`, naming the next worker.
  absl::Status SendError(const absl::Status& status) const;

  // OK when `header`'s sender may send segments to this one.
  absl::Status CheckSender(const proto::CollectiveHeader& header) const;
  // What becomes of a message of the previous worker (its sender checked).
  struct Verdict {
    bool take = false;     // New: take it (then Took).
    absl::Status answer;   // For its sender: OK when taken or dropped.
    absl::Status failure;  // For this worker's op: OK, or Aborted (restarted).
  };
  Verdict Judge(const proto::CollectiveHeader& header);
  // Step `step` of op `op` is taken: a message at or below it is dropped.
  void Took(int64_t op, int step) { last_taken_ = {op, step}; }
  // The last segment taken, and whose (the previous worker's incarnation),
  // as text for the hello answer of a new connection: "OP STEP INCARNATION".
  std::string LastTakenText() const;
  // Whether a hello answer's LastTakenText says that this process's step
  // `step` of op `op` was taken already (a sender whose answer was lost
  // need not send it again). Never for a text of another incarnation: a
  // restarted process's op 1 is not an earlier run's.
  bool TakenAlready(absl::string_view text, int64_t op, int step) const;
  // OK when the previous worker's `sent` bytes for (op, step) are the
  // `expected` of this worker's segment.
  absl::Status CheckSize(int64_t op, int step, uint64_t sent, uint64_t expected) const;
  // Reads a segment into `bytes` from `*taken` on (what was taken of it
  // before), by calls to `read(offset, into)` in order: adds it into `bytes`
  // as floats (`add`), 64 KiB at a time, or copies it. `*taken` counts what
  // is taken, whole blocks: a segment sent again after a failed read skips
  // that much and is not added twice.
  using ReadFn = absl::FunctionRef<absl::Status(uint64_t offset, absl::Span<char> into)>;
  static absl::Status TakeSegment(absl::Span<char> bytes, bool add, uint64_t* taken, ReadFn read);

  enum class Neighbour { kPrevious, kNext };
  // After `silent` with nothing from the previous worker, or with the next
  // worker taking nothing, in step `step` of op `op`: OK to wait on (it
  // answers a ping, and busy_timeout is not over; logged), else
  // DeadlineExceeded naming it.
  absl::Status CheckSilent(Neighbour neighbour, int64_t op, int step, absl::Duration silent) const;

  // A `what` ("message", "ring connection") this process refused for its
  // auth token.
  void CountRefusal() { ++refusals_; }
  // Whether one was refused since the last TakeRefusal; TakeRefusal says
  // so and forgets it.
  bool refusal_pending() const { return refusals_ != refusals_checked_; }
  bool TakeRefusal();
  // After a refusal: OK when the previous worker answers a ping (it takes
  // this worker's token, so it was not the one refused), else
  // Unauthenticated naming it.
  absl::Status CheckRefusal(absl::string_view what) const;

 private:
  const RingOptions options_;
  RingControl* const control_;
  const int next_rank_;
  const int previous_rank_;
  const int64_t incarnation_;  // This process's.

  int64_t previous_incarnation_ = 0;  // 0: none seen.
  std::pair<int64_t, int> last_taken_ = {0, 0};
  int refusals_ = 0;
  int refusals_checked_ = 0;
};

}  // namespace psrt

#endif  // PSRT_WORKER_RING_RING_PEER_RULES_H_
