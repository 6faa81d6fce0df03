// Backoff: the delays between the attempts of a retry loop, doubling from
// `initial` up to `max` (exponential backoff without jitter).
//
//   Backoff backoff(absl::Milliseconds(100), absl::Seconds(2));
//   while (!TryOnce()) absl::SleepFor(backoff.Next());  // 100 ms, 200 ms, ... 2 s, 2 s
//
// A plain value: copyable; not thread-safe (one loop owns each).
#ifndef PSRT_COMMON_BACKOFF_H_
#define PSRT_COMMON_BACKOFF_H_

#include <algorithm>

#include "absl/time/time.h"
#include "glog/logging.h"

namespace psrt {

class Backoff {
 public:
  // REQUIRES: 0 < initial <= max.
  Backoff(absl::Duration initial, absl::Duration max) : delay_(initial), max_(max) {
    CHECK(absl::ZeroDuration() < initial && initial <= max) << initial << " " << max;
  }

  // The delay before the next attempt; then doubles it, up to max.
  absl::Duration Next() {
    const absl::Duration delay = delay_;
    delay_ = std::min(delay_ * 2, max_);
    ++retries_;
    return delay;
  }
  // The delay that Next will return, without advancing.
  absl::Duration Peek() const { return delay_; }
  // How many delays Next has returned: 0 before the first retry.
  int retries() const { return retries_; }

 private:
  absl::Duration delay_;
  absl::Duration max_;
  int retries_ = 0;
};

}  // namespace psrt

#endif  // PSRT_COMMON_BACKOFF_H_
