// CpuBudget: how many cores this process may use, which is what every
// "0: one per core" default (kernel threads, the ps's update threads, image
// decoders) means.
//
// std::thread::hardware_concurrency() counts the machine's online CPUs and
// ignores what a cluster manager gave the process: Slurm's and mpirun's
// core binding, taskset and cpusets narrow its CPU affinity mask, and
// Kubernetes' limits.cpu (docker --cpus) caps its cgroup's CPU time. A pool
// as large as the machine then time-slices a few cores and its barriers wait
// on threads that are not running. The budget is the affinity mask's CPUs,
// capped by the cgroup's CPU limit rounded up (the lowest on the way from
// the process's cgroup to its hierarchy's root; cgroup v1's cpu controller
// or v2's cpu.max), and at least 1.
//
// Thread safety: the functions read /proc and /sys on each call and keep no
// state; any thread may call them.
#ifndef PSRT_COMMON_CPU_BUDGET_H_
#define PSRT_COMMON_CPU_BUDGET_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace psrt {

struct CpuBudget {
  int cores = 1;  // >= 1.
  // What set it, for logs: "2 CPUs in its affinity mask", or the cgroup
  // file that capped it and its values.
  std::string reason;
};

// The calling process's budget (its affinity is that of the calling thread,
// which every thread it starts inherits).
CpuBudget ProcessCpuBudget();

// A cgroup's CPU limit, in CPUs (quota / period), and the file it came from.
struct CgroupCpuLimit {
  double cpus = 0;
  std::string file;
};

// The lowest CPU limit between the process's cgroup and its hierarchy's
// root, given the text of /proc/self/cgroup and /proc/self/mountinfo (the
// files are then read at the mount points that mountinfo names); nullopt
// when there is no cpu controller or no limit. cgroup v1's cpu controller
// is preferred to v2 where both are mounted (it is the one that limits).
std::optional<CgroupCpuLimit> FindCgroupCpuLimit(absl::string_view proc_cgroup,
                                                 absl::string_view mountinfo);

}  // namespace psrt

#endif  // PSRT_COMMON_CPU_BUDGET_H_
