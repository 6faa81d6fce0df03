#include "common/cpu_budget.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace psrt {
namespace {

std::optional<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The CPUs of the calling thread's affinity mask; 0 if it cannot be read.
int AffinityCpus() {
  for (int size = 1024; size <= (1 << 20); size *= 2) {
    cpu_set_t* set = CPU_ALLOC(size);
    if (set == nullptr) return 0;
    const size_t bytes = CPU_ALLOC_SIZE(size);
    const int rc = sched_getaffinity(0, bytes, set);
    const int cpus = rc == 0 ? CPU_COUNT_S(bytes, set) : 0;
    CPU_FREE(set);
    if (rc == 0) return cpus;
    if (errno != EINVAL) return 0;  // EINVAL: the kernel's mask is larger.
  }
  return 0;
}

bool HasItem(absl::string_view comma_list, absl::string_view item) {
  for (absl::string_view entry : absl::StrSplit(comma_list, ',')) {
    if (entry == item) return true;
  }
  return false;
}

// The limit one cgroup directory sets, in CPUs: v2's "cpu.max" ("QUOTA
// PERIOD" or "max PERIOD"), v1's cpu.cfs_quota_us / cpu.cfs_period_us
// (quota -1: none).
std::optional<CgroupCpuLimit> DirectoryLimit(const std::string& dir, bool v2) {
  double quota = 0, period = 0;
  std::string file;
  if (v2) {
    file = dir + "/cpu.max";
    const std::optional<std::string> text = ReadSmallFile(file);
    if (!text) return std::nullopt;
    const std::vector<absl::string_view> fields =
        absl::StrSplit(absl::StripAsciiWhitespace(*text), ' ', absl::SkipEmpty());
    if (fields.size() != 2 || !absl::SimpleAtod(fields[0], &quota) ||
        !absl::SimpleAtod(fields[1], &period)) {
      return std::nullopt;  // "max PERIOD": no limit.
    }
  } else {
    file = dir + "/cpu.cfs_quota_us";
    const std::optional<std::string> quota_text = ReadSmallFile(file);
    const std::optional<std::string> period_text = ReadSmallFile(dir + "/cpu.cfs_period_us");
    if (!quota_text || !period_text ||
        !absl::SimpleAtod(absl::StripAsciiWhitespace(*quota_text), &quota) ||
        !absl::SimpleAtod(absl::StripAsciiWhitespace(*period_text), &period)) {
      return std::nullopt;
    }
  }
  if (quota <= 0 || period <= 0) return std::nullopt;
  return CgroupCpuLimit{quota / period, absl::StrCat(file, " (", quota, " / ", period, ")")};
}

}  // namespace

std::optional<CgroupCpuLimit> FindCgroupCpuLimit(absl::string_view proc_cgroup,
                                                 absl::string_view mountinfo) {
  // The process's path in the v1 hierarchy holding the cpu controller, or
  // in the v2 hierarchy.
  std::optional<std::string> v1_path, v2_path;
  for (absl::string_view line : absl::StrSplit(proc_cgroup, '\n', absl::SkipEmpty())) {
    const std::vector<absl::string_view> fields = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3) continue;
    if (fields[0] == "0" && fields[1].empty()) {
      v2_path = std::string(fields[2]);
    } else if (HasItem(fields[1], "cpu")) {
      v1_path = std::string(fields[2]);
    }
  }
  const bool v2 = !v1_path.has_value();
  const std::optional<std::string>& path = v2 ? v2_path : v1_path;
  if (!path) return std::nullopt;

  // Its mount: "ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] -
  // FSTYPE SOURCE SUPER_OPTIONS".
  for (absl::string_view line : absl::StrSplit(mountinfo, '\n', absl::SkipEmpty())) {
    const std::vector<absl::string_view> halves = absl::StrSplit(line, absl::MaxSplits(" - ", 1));
    if (halves.size() != 2) continue;
    const std::vector<absl::string_view> mount = absl::StrSplit(halves[0], ' ', absl::SkipEmpty());
    const std::vector<absl::string_view> fs = absl::StrSplit(halves[1], ' ', absl::SkipEmpty());
    if (mount.size() < 5 || fs.size() < 3) continue;
    const bool holds_it = v2 ? fs[0] == "cgroup2" : (fs[0] == "cgroup" && HasItem(fs[2], "cpu"));
    if (!holds_it) continue;
    const std::string mount_point(mount[4]);
    // The process's cgroup below the mount: its path less the mount's root
    // (a container sees its own cgroup as the mount's root). A cgroup
    // namespace may show a path the mount does not hold: then the mount
    // point itself.
    absl::string_view root = mount[3], relative = *path;
    if (root != "/" && !absl::ConsumePrefix(&relative, root)) relative = "";
    std::string dir = mount_point + std::string(absl::StripSuffix(relative, "/"));
    if (access((dir + "/cgroup.procs").c_str(), F_OK) != 0) dir = mount_point;
    std::optional<CgroupCpuLimit> lowest;
    while (true) {
      std::optional<CgroupCpuLimit> limit = DirectoryLimit(dir, v2);
      if (limit && (!lowest || limit->cpus < lowest->cpus)) lowest = std::move(limit);
      if (dir.size() <= mount_point.size()) break;
      dir.resize(dir.rfind('/'));
    }
    return lowest;
  }
  return std::nullopt;
}

CpuBudget ProcessCpuBudget() {
  CpuBudget budget;
  const int affinity = AffinityCpus();
  if (affinity > 0) {
    budget.cores = affinity;
    budget.reason = absl::StrCat(affinity, affinity == 1 ? " CPU" : " CPUs", " in its affinity mask");
  } else {
    budget.cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
    budget.reason = absl::StrCat(budget.cores, " online CPUs");
  }
  const std::optional<std::string> proc_cgroup = ReadSmallFile("/proc/self/cgroup");
  const std::optional<std::string> mountinfo = ReadSmallFile("/proc/self/mountinfo");
  if (proc_cgroup && mountinfo) {
    if (const std::optional<CgroupCpuLimit> limit = FindCgroupCpuLimit(*proc_cgroup, *mountinfo)) {
      const int cores = std::max(1, static_cast<int>(std::ceil(limit->cpus - 1e-9)));
      if (cores < budget.cores) {
        budget.cores = cores;
        budget.reason = absl::StrCat("its cgroup's CPU limit, ", limit->file);
      }
    }
  }
  return budget;
}

}  // namespace psrt
