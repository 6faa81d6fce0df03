// FaultRelay: a TCP relay that forwards bytes between its clients and one
// target address and injects network faults on the way, so that tests can
// show how psrt behaves on a bad network without netem (which this kernel
// lacks).
//
// Every accepted connection gets its own connection to the target; bytes are
// forwarded both ways, in order, in the chunks they were read in. Faults:
//   - delay: every chunk waits `delay` +/- uniform `jitter` before it is
//     written on; the release times of one direction never decrease, so
//     jitter never reorders bytes (like netem's delay with a fixed rate);
//   - close: both ends of a connection are closed gracefully (FIN);
//   - reset: both ends are closed with SO_LINGER 0, so both peers get an RST
//     (a read there fails with ECONNRESET);
//   - stall: for a while no byte is written on, on any connection; reads go
//     on until `max_buffered_bytes` per direction, then TCP flow control
//     holds the senders: a link that is down without losing the connection.
// Faults come at random per forwarded chunk (close/reset probabilities),
// on a timer (reset_every, stall_every), or on request (InjectAll,
// InjectOnNextChunk, StallAll). Each injected fault is logged (glog WARNING)
// and counted. A reset or close seen from one peer is passed on to the other
// the same way.
//
// Thread safety: one thread runs every socket (poll loop); the public
// methods are thread-safe and may be called from any thread.
#ifndef PSRT_TESTS_FAULT_FAULT_RELAY_H_
#define PSRT_TESTS_FAULT_FAULT_RELAY_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace psrt {

class FaultRelay {
 public:
  struct Options {
    std::string listen_host = "127.0.0.1";
    int listen_port = 0;  // 0: a free port, see port().
    std::string target_host = "127.0.0.1";
    int target_port = 0;
    absl::Duration delay = absl::ZeroDuration();   // Per chunk, each way.
    absl::Duration jitter = absl::ZeroDuration();  // <= delay.
    double close_probability = 0;  // Per forwarded chunk, in [0, 1].
    double reset_probability = 0;  // Per forwarded chunk, in [0, 1].
    absl::Duration reset_every = absl::ZeroDuration();  // 0: never.
    absl::Duration stall_every = absl::ZeroDuration();  // 0: never.
    absl::Duration stall_for = absl::Seconds(3);        // Each stall's length.
    // Random and timed faults injected at most (-1: no limit); requested
    // ones always happen.
    int max_faults = -1;
    uint64_t seed = 1;    // Of the random faults and the jitter.
    int64_t max_buffered_bytes = 64 << 20;  // Per connection and direction.
  };
  // Totals since Start; a timer or request that finds no connection open
  // counts nothing.
  struct Stats {
    int64_t connections = 0;
    int64_t bytes_forwarded = 0;
    int64_t closes = 0;  // Connections closed by a fault.
    int64_t resets = 0;  // Connections reset by a fault.
    int64_t stalls = 0;
  };

  // Binds and listens, then serves on a thread of its own. InvalidArgument
  // names the bad option; a bind failure names the address.
  static absl::StatusOr<std::unique_ptr<FaultRelay>> Start(Options options);
  // Stops serving and closes every connection (gracefully).
  ~FaultRelay();
  FaultRelay(const FaultRelay&) = delete;
  FaultRelay& operator=(const FaultRelay&) = delete;

  enum class Fault { kReset, kClose };
  enum class Direction { kClientToTarget, kTargetToClient };

  int port() const { return port_; }
  // Resets (RST) or closes (FIN) every open connection now.
  void InjectAll(Fault fault);
  // The next chunk of at least `min_bytes` read in `direction` (on any
  // connection) is dropped and its connection gets `fault`: a fault in the
  // middle of a large message (a push: client to target; a pull's reply:
  // target to client). With `skip`, that many such chunks pass first (a
  // fault further into a message). Replaces an earlier request that has
  // not fired yet.
  void InjectOnNextChunk(Fault fault, Direction direction, int64_t min_bytes, int skip = 0);
  // Holds every byte in the relay for `duration` from now.
  void StallAll(absl::Duration duration);
  Stats stats() const;

 private:
  class Loop;  // The poll loop and the connections it owns.
  // Requests from other threads, taken by the loop.
  struct Requests {
    std::optional<Fault> all;
    std::optional<Fault> next_chunk;
    Direction next_chunk_direction = Direction::kClientToTarget;
    int64_t next_chunk_min_bytes = 0;
    int next_chunk_skip = 0;
    absl::Time stall_until = absl::InfinitePast();
  };

  FaultRelay(Options options, int port);
  // Wakes the poll loop (after a request or at shutdown).
  void Wake();

  const Options options_;
  const int port_;
  std::unique_ptr<Loop> loop_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};

  mutable absl::Mutex mu_;
  Requests requests_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace psrt

#endif  // PSRT_TESTS_FAULT_FAULT_RELAY_H_
