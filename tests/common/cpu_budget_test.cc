#include "common/cpu_budget.h"

#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace psrt {
namespace {

namespace fs = std::filesystem;

class CgroupTree : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/cpu_budget_test.XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    root_ = pattern;
  }
  void TearDown() override { fs::remove_all(root_); }

  // Creates the cgroup directory `dir` (below root_) with `files`.
  void Cgroup(const std::string& dir,
              std::initializer_list<std::pair<std::string, std::string>> files) {
    fs::create_directories(root_ + dir);
    std::ofstream(root_ + dir + "/cgroup.procs") << "";
    for (const auto& [name, text] : files) std::ofstream(root_ + dir + "/" + name) << text;
  }
  std::string MountLine(const std::string& root, const std::string& mount_point,
                        const std::string& fs_type, const std::string& super_options) {
    return absl::StrCat("32 31 0:29 ", root, " ", root_, mount_point,
                        " rw,relatime shared:9 - ", fs_type, " ", fs_type, " ",
                        super_options, "\n");
  }

  std::string root_;
};

TEST_F(CgroupTree, V1TakesTheLowestQuotaFromTheProcessUpToTheRoot) {
  Cgroup("/cpu", {{"cpu.cfs_quota_us", "-1\n"}, {"cpu.cfs_period_us", "100000\n"}});
  Cgroup("/cpu/job", {{"cpu.cfs_quota_us", "150000\n"}, {"cpu.cfs_period_us", "100000\n"}});
  Cgroup("/cpu/job/step", {{"cpu.cfs_quota_us", "300000\n"}, {"cpu.cfs_period_us", "100000\n"}});
  const std::string mountinfo =
      MountLine("/", "", "tmpfs", "rw,mode=755") +
      MountLine("/", "/cpuacct", "cgroup", "rw,cpuacct") +
      MountLine("/", "/cpu", "cgroup", "rw,cpu") +
      MountLine("/", "/unified", "cgroup2", "rw");
  const std::optional<CgroupCpuLimit> limit =
      FindCgroupCpuLimit("5:cpuacct:/job/step\n4:cpu:/job/step\n0::/\n", mountinfo);
  ASSERT_TRUE(limit.has_value());
  EXPECT_DOUBLE_EQ(limit->cpus, 1.5);
  EXPECT_EQ(limit->file, root_ + "/cpu/job/cpu.cfs_quota_us (150000 / 100000)");
}

TEST_F(CgroupTree, V2ReadsCpuMaxAndMaxMeansNoLimit) {
  Cgroup("/sys", {});
  Cgroup("/sys/pod", {{"cpu.max", "max 100000\n"}});
  Cgroup("/sys/pod/container", {{"cpu.max", "250000 100000\n"}});
  const std::string mountinfo = MountLine("/", "/sys", "cgroup2", "rw,nsdelegate");
  std::optional<CgroupCpuLimit> limit = FindCgroupCpuLimit("0::/pod/container\n", mountinfo);
  ASSERT_TRUE(limit.has_value());
  EXPECT_DOUBLE_EQ(limit->cpus, 2.5);

  Cgroup("/sys/pod/container", {{"cpu.max", "max 100000\n"}});
  EXPECT_FALSE(FindCgroupCpuLimit("0::/pod/container\n", mountinfo).has_value());
}

TEST_F(CgroupTree, AContainerSeesItsCgroupAsTheMountsRoot) {
  // Docker without a cgroup namespace: the mount's root is the container's
  // cgroup, and /proc/self/cgroup names it in full.
  Cgroup("/cpu", {{"cpu.cfs_quota_us", "50000\n"}, {"cpu.cfs_period_us", "100000\n"}});
  const std::string mountinfo = MountLine("/docker/abc", "/cpu", "cgroup", "rw,cpu,cpuacct");
  std::optional<CgroupCpuLimit> limit =
      FindCgroupCpuLimit("3:cpu,cpuacct:/docker/abc\n", mountinfo);
  ASSERT_TRUE(limit.has_value());
  EXPECT_DOUBLE_EQ(limit->cpus, 0.5);
  // With a cgroup namespace the path may not lie below the mount: the mount
  // point's own limit counts.
  limit = FindCgroupCpuLimit("3:cpu,cpuacct:/elsewhere\n", mountinfo);
  ASSERT_TRUE(limit.has_value());
  EXPECT_DOUBLE_EQ(limit->cpus, 0.5);
}

TEST_F(CgroupTree, NoControllerNoMountOrMalformedFilesMeanNoLimit) {
  Cgroup("/cpu", {{"cpu.cfs_quota_us", "garbage\n"}, {"cpu.cfs_period_us", "100000\n"}});
  const std::string mountinfo = MountLine("/", "/cpu", "cgroup", "rw,cpu");
  EXPECT_FALSE(FindCgroupCpuLimit("3:cpu:/\n", mountinfo).has_value());
  EXPECT_FALSE(FindCgroupCpuLimit("3:memory:/\n", mountinfo).has_value());
  EXPECT_FALSE(FindCgroupCpuLimit("3:cpu:/\n", "").has_value());
  EXPECT_FALSE(FindCgroupCpuLimit("not a cgroup line\n", "nor a mount line\n").has_value());
  EXPECT_FALSE(FindCgroupCpuLimit("", mountinfo).has_value());
}

// The test's thread narrows its own affinity (which the budget reads) to
// one CPU, then restores it.
TEST(ProcessCpuBudgetTest, FollowsTheAffinityMask) {
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  const CpuBudget unbound = ProcessCpuBudget();
  EXPECT_GE(unbound.cores, 1);
  EXPECT_LE(unbound.cores, CPU_COUNT(&all));

  int first = 0;
  while (!CPU_ISSET(first, &all)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  const CpuBudget bound = ProcessCpuBudget();
  ASSERT_EQ(sched_setaffinity(0, sizeof(all), &all), 0);
  EXPECT_EQ(bound.cores, 1);
  EXPECT_EQ(bound.reason, "1 CPU in its affinity mask");
}

// A real cgroup (root, with a writable cgroup v1 cpu controller or v2
// cpu.max, as on the development machines): a child process moved into a
// cgroup of half a CPU finds a budget of 1, naming the cgroup's file.
TEST(ProcessCpuBudgetTest, FollowsARealCgroupLimit) {
  std::string dir, limit_file, limit_text;
  if (fs::exists("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")) {
    dir = absl::StrCat("/sys/fs/cgroup/cpu/psrt_cpu_budget_test_", getpid());
    limit_file = dir + "/cpu.cfs_quota_us";
    limit_text = "50000";
  } else if (fs::exists("/sys/fs/cgroup/cgroup.subtree_control")) {
    dir = absl::StrCat("/sys/fs/cgroup/psrt_cpu_budget_test_", getpid());
    limit_file = dir + "/cpu.max";
    limit_text = "50000 100000";
  }
  if (ProcessCpuBudget().cores < 2) GTEST_SKIP() << "one CPU: a limit of 1 changes nothing";
  if (dir.empty() || mkdir(dir.c_str(), 0755) != 0) {
    GTEST_SKIP() << "no writable cgroup cpu controller here (needs root)";
  }
  const bool limited = static_cast<bool>(std::ofstream(limit_file) << limit_text);
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(pipe_fds[0]);
    std::ofstream(dir + "/cgroup.procs") << getpid() << std::flush;
    const CpuBudget budget = ProcessCpuBudget();
    const std::string reply = absl::StrCat(budget.cores, " ", budget.reason);
    const ssize_t written = write(pipe_fds[1], reply.data(), reply.size());
    _exit(written == static_cast<ssize_t>(reply.size()) ? 0 : 1);
  }
  close(pipe_fds[1]);
  std::string reply;
  char buffer[512];
  for (ssize_t n; (n = read(pipe_fds[0], buffer, sizeof(buffer))) > 0;) reply.append(buffer, n);
  close(pipe_fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  rmdir(dir.c_str());
  if (!limited) GTEST_SKIP() << "cannot set " << limit_file;
  EXPECT_EQ(status, 0);
  EXPECT_EQ(reply, absl::StrCat("1 its cgroup's CPU limit, ", limit_file, " (50000 / 100000)"));
}

}  // namespace
}  // namespace psrt
