// Small helpers the benchmarks share: medians of repeated runs, the
// process's minor page faults, and stopping on an error.
#ifndef PSRT_BENCH_BENCH_UTIL_H_
#define PSRT_BENCH_BENCH_UTIL_H_

#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "glog/logging.h"

namespace psrt::bench {

// The median (the mean of the middle two for an even count).
// REQUIRES: !v.empty().
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// First touches of fresh pages by this process so far.
inline int64_t MinorFaults() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

inline void Check(const absl::Status& status) { CHECK(status.ok()) << status; }

}  // namespace psrt::bench

#endif  // PSRT_BENCH_BENCH_UTIL_H_
