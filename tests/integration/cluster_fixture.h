// Shared by the multi-process tests: run commands, generate cluster specs,
// launch clusters with scripts/launch.sh, read their logs and results.
#ifndef PSRT_TESTS_INTEGRATION_CLUSTER_FIXTURE_H_
#define PSRT_TESTS_INTEGRATION_CLUSTER_FIXTURE_H_

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"

namespace psrt {

inline constexpr char kDataDir[] = "/usr/share/datasets/fashion-mnist";

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr.
};

inline CommandResult RunCommand(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Largest |a - b| over every tensor of two safetensors files with the same
// tensors; -1 (and a test failure) when they cannot be compared.
inline double MaxAbsDiff(const std::string& path_a, const std::string& path_b) {
  auto a = ReadSafetensors(path_a);
  auto b = ReadSafetensors(path_b);
  EXPECT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(b.ok()) << b.status();
  if (!a.ok() || !b.ok() || a->tensors.size() != b->tensors.size()) return -1;
  double diff = 0;
  for (size_t i = 0; i < a->tensors.size(); ++i) {
    const Tensor& x = a->tensors[i].second;
    const Tensor& y = b->tensors[i].second;
    EXPECT_EQ(a->tensors[i].first, b->tensors[i].first);
    if (x.shape() != y.shape()) return -1;
    for (int64_t j = 0; j < x.num_elements(); ++j) {
      diff = std::max(diff, double(std::fabs(x.data()[j] - y.data()[j])));
    }
  }
  return diff;
}

// One task started by the test itself (not by launch.sh), so that the test
// can kill -9 it and start it again. Its output is appended to `log`. The
// destructor kills it if it still runs. Not thread-safe.
class TaskProcess {
 public:
  TaskProcess(std::string command, std::string log)
      : command_(std::move(command)), log_(std::move(log)) {}
  ~TaskProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  TaskProcess(const TaskProcess&) = delete;
  TaskProcess& operator=(const TaskProcess&) = delete;

  void Start() {
    const std::string shell = absl::StrCat("exec ", command_, " >> ", log_, " 2>&1");
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execl("/bin/bash", "bash", "-c", shell.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  // kill -9, as a crash would end it.
  void Kill() {
    ASSERT_GT(pid_, 0);
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // Its exit code, or -1 (and it is killed) if it still runs after `timeout`.
  int Wait(absl::Duration timeout) {
    const absl::Time give_up = absl::Now() + timeout;
    while (pid_ > 0) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      if (absl::Now() >= give_up) {
        Kill();
        return -1;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    return -1;
  }
  const std::string& log() const { return log_; }

 private:
  const std::string command_;
  const std::string log_;
  pid_t pid_ = -1;
};

class ClusterFixture : public testing::Test {
 protected:
  void SetUp() override {
    source_ = PSRT_SOURCE_DIR;
    bin_ = PSRT_BIN_DIR;
    if (std::ifstream(std::string(kDataDir) + "/train-images-idx3-ubyte.gz").fail()) {
      GTEST_SKIP() << "Fashion-MNIST not installed (scripts/setup.sh installs it)";
    }
    // Per process too: two runs of the suite at once (two checkouts on one
    // machine) must not share a folder, whose removal by one would pull the
    // other's certificates or checkpoints away.
    dir_ = absl::StrCat(testing::TempDir(), "psrt_",
                        testing::UnitTest::GetInstance()->current_test_info()->name(), ".",
                        ::getpid());
    RunCommand("rm -rf " + dir_ + " && mkdir -p " + dir_);
  }
  // A passing test's folder goes; a failing one's stays for its logs.
  void TearDown() override {
    if (!dir_.empty() && !HasFailure()) RunCommand("rm -rf " + dir_);
  }

  std::string MakeSpec(int ps, int workers, const std::string& name = "cluster.json") {
    const std::string path = dir_ + "/" + name;
    CommandResult r = RunCommand(absl::StrCat(
        "PSRT_BIN_DIR=", bin_, " ", source_, "/scripts/make_cluster_spec.sh --ps ", ps,
        " --workers ", workers, " --out ", path));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return path;
  }

  // Runs scripts/launch.sh to completion (at most 5 minutes).
  // `launcher_flags` go before "--" (e.g. --checkpoint_dir D).
  CommandResult Launch(const std::string& spec, const std::string& logdir,
                       const std::string& worker_flags,
                       const std::string& launcher_flags = "") {
    return RunCommand(absl::StrCat("PSRT_BIN_DIR=", bin_, " timeout 300 ", source_,
                                   "/scripts/launch.sh --cluster_spec ", spec,
                                   " --logdir ", logdir, " ", launcher_flags, " -- ",
                                   worker_flags));
  }

  // The last "step N, loss" the chief logged in DIR/worker-0.log (its
  // log as the fault tests start it); -1 before the first.
  long ChiefStep() const {
    static const std::regex kStep(R"(step (\d+), loss)");
    const std::string log = ReadFile(dir_ + "/worker-0.log");
    long step = -1;
    for (auto it = std::sregex_iterator(log.begin(), log.end(), kStep);
         it != std::sregex_iterator(); ++it) {
      step = std::stol((*it)[1]);
    }
    return step;
  }

  // Waits until the chief has logged `step`; false after `timeout`.
  bool WaitForChiefStep(long step, absl::Duration timeout = absl::Seconds(90)) const {
    const absl::Time give_up = absl::Now() + timeout;
    while (ChiefStep() < step) {
      if (absl::Now() >= give_up) return false;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return true;
  }

  // A step in [low, high), logged so that a failure can be replayed.
  static long RandomStep(long low, long high) {
    std::random_device device;
    const long step = std::uniform_int_distribution<long>(low, high - 1)(device);
    std::cout << "fault injected at step " << step << std::endl;
    return step;
  }

  // Waits until `log` holds `text` `times` times; false after `timeout`.
  bool WaitForLog(const std::string& log, const std::string& text, int times = 1,
                  absl::Duration timeout = absl::Seconds(60)) {
    const absl::Time give_up = absl::Now() + timeout;
    while (true) {
      const std::string content = ReadFile(log);
      int found = 0;
      for (size_t at = content.find(text); at != std::string::npos;
           at = content.find(text, at + 1)) {
        ++found;
      }
      if (found >= times) return true;
      if (absl::Now() >= give_up) return false;
      absl::SleepFor(absl::Milliseconds(20));
    }
  }

  // Every worker's exit code, in task order (workers_).
  std::vector<int> WaitForWorkers(absl::Duration timeout = absl::Seconds(180)) {
    std::vector<int> codes;
    for (auto& w : workers_) codes.push_back(w->Wait(timeout));
    return codes;
  }

  // Every task's log (ps_, then workers_), for a failure's message.
  std::string AllLogs() const {
    std::string all;
    for (const auto& tasks : {&ps_, &workers_}) {
      for (const auto& t : *tasks) all += "\n==> " + t->log() + "\n" + ReadFile(t->log());
    }
    return all;
  }

  // Parses the chief's "final: global_step=N test_accuracy=A" line.
  static bool ParseFinal(const std::string& log, long* step, double* accuracy) {
    std::smatch m;
    static const std::regex kFinal(R"(final: global_step=(\d+) test_accuracy=([0-9.]+))");
    if (!std::regex_search(log, m, kFinal)) return false;
    *step = std::stol(m[1]);
    *accuracy = std::stod(m[2]);
    return true;
  }

  std::string source_, bin_, dir_;
  // The tasks a fault test starts by hand (TaskProcess), if any.
  std::vector<std::unique_ptr<TaskProcess>> ps_, workers_;
};

}  // namespace psrt

#endif  // PSRT_TESTS_INTEGRATION_CLUSTER_FIXTURE_H_
