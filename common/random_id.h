// Random identifiers of processes and runs: a ps shard's or a worker's
// incarnation (which changes when the process restarts, so that its peers
// can tell a restarted process from the one they knew), and a training
// run's id. Seeded from std::random_device on every call, so two processes
// started at once get different ids.
//
// Thread safety: thread-safe.
#ifndef PSRT_COMMON_RANDOM_ID_H_
#define PSRT_COMMON_RANDOM_ID_H_

#include <cstdint>
#include <string>

namespace psrt {

// A positive id, never 0 (0 means "none" on the wire), with 63 random bits
// less the lowest.
int64_t NewIncarnation();

// 64 random bits as 16 lowercase hex digits (a run id).
std::string NewRandomHexId();

}  // namespace psrt

#endif  // PSRT_COMMON_RANDOM_ID_H_
