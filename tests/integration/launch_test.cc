// scripts/launch.sh as a supervisor: restart policies (Never, OnFailure,
// ExitCode), the restart cap and backoff, the end-of-job summary, and the
// signal paths. Policy cases run tests/integration/fake_task.sh in place of
// psrt_ps and psrt_worker (through PSRT_BIN_DIR), so each task fails exactly
// as planned; the kill -9, Never and Ctrl-C cases run the real binaries.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"

extern char** environ;

namespace psrt {
namespace {

// scripts/launch.sh running in the background, stdout and stderr in a file.
// Unlike a job started with "&" by a shell, it gets SIGINT's default action,
// so an interrupt reaches its trap as Ctrl-C in a terminal would. The
// destructor stops a launcher still running (SIGTERM stops its tasks).
class BackgroundLaunch {
 public:
  // `command` is a shell command line that ends by exec'ing the launcher.
  BackgroundLaunch(const std::string& command, const std::string& output_path)
      : output_path_(output_path) {
    const std::string line = command + " > " + output_path + " 2>&1";
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    sigset_t defaults, empty;
    sigemptyset(&defaults);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&defaults, sig);
    sigemptyset(&empty);
    posix_spawnattr_setsigdefault(&attributes, &defaults);
    posix_spawnattr_setsigmask(&attributes, &empty);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
    const char* argv[] = {"/bin/bash", "-c", line.c_str(), nullptr};
    if (posix_spawn(&pid_, argv[0], nullptr, &attributes, const_cast<char**>(argv),
                    environ) != 0) {
      pid_ = -1;
    }
    posix_spawnattr_destroy(&attributes);
  }

  ~BackgroundLaunch() {
    if (pid_ <= 0 || exit_code_ != kRunning) return;
    kill(pid_, SIGTERM);
    if (Wait(absl::Seconds(20)) == kRunning) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  bool started() const { return pid_ > 0; }
  std::string Output() const { return ReadFile(output_path_); }
  void Signal(int sig) const { kill(pid_, sig); }

  // True once the launcher's output contains `text`.
  bool WaitForOutput(const std::string& text, absl::Duration timeout) const {
    return WaitUntil([&] { return Output().find(text) != std::string::npos; }, timeout);
  }

  // The launcher's exit code; kRunning if it still runs after `timeout`, and
  // 128 + signal if a signal killed it.
  int Wait(absl::Duration timeout) {
    if (exit_code_ != kRunning) return exit_code_;
    WaitUntil([&] {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) != pid_) return false;
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return true;
    }, timeout);
    return exit_code_;
  }

  // The pid of task `task` ("worker/1"), from the launcher's "started" line.
  pid_t TaskPid(const std::string& task) const {
    std::smatch m;
    const std::string output = Output();
    const std::regex started("started " + task + " on \\S+ \\(pid (\\d+)");
    return std::regex_search(output, m, started) ? std::stoi(m[1]) : -1;
  }

  static constexpr int kRunning = -1;

 private:
  template <class Predicate>
  static bool WaitUntil(Predicate done, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (!done()) {
      if (absl::Now() >= deadline) return false;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return true;
  }

  std::string output_path_;
  pid_t pid_ = -1;
  int exit_code_ = kRunning;
};

class LaunchTest : public ClusterFixture {
 protected:
  // A bin dir whose psrt_ps and psrt_worker are tests/integration/fake_task.sh
  // (psrtctl is the real one: it reads the spec). Returns the environment
  // that makes the launcher use it with `plan` (see fake_task.sh).
  std::string FakeTasks(const std::string& plan) {
    const std::string fake_bin = dir_ + "/fake_bin";
    const std::string fake = source_ + "/tests/integration/fake_task.sh";
    CommandResult r = RunCommand(absl::StrCat(
        "mkdir -p ", fake_bin, " ", dir_, "/state && ln -sf ", fake, " ", fake_bin,
        "/psrt_ps && ln -sf ", fake, " ", fake_bin, "/psrt_worker && ln -sf ", bin_,
        "/psrtctl ", fake_bin, "/psrtctl"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return absl::StrCat("PSRT_BIN_DIR=", fake_bin, " FAKE_STATE_DIR=", dir_,
                        "/state FAKE_PLAN='", plan, "' ");
  }

  // How many times the fake task `file_name` ("worker-1") was started.
  int FakeStarts(const std::string& file_name) {
    const std::string starts = ReadFile(dir_ + "/state/" + file_name + ".starts");
    return starts.empty() ? 0 : std::stoi(starts);
  }

  // The launcher with `env` (e.g. from FakeTasks) and `flags`, run to the end.
  CommandResult LaunchWith(const std::string& env, const std::string& spec,
                           const std::string& flags, const std::string& worker_flags = "") {
    return RunCommand(absl::StrCat(env, "timeout 120 ", source_,
                                   "/scripts/launch.sh --cluster_spec ", spec, " --logdir ",
                                   dir_, "/logs ", flags, " -- ", worker_flags));
  }

  void ExpectAKilledPsIsRestartedAndTheJobRecovers(const std::string& transport);

  // The launcher in the background, output in dir_/NAME.out.
  std::unique_ptr<BackgroundLaunch> LaunchInBackground(const std::string& env,
                                                       const std::string& spec,
                                                       const std::string& flags,
                                                       const std::string& worker_flags,
                                                       const std::string& name = "launch") {
    auto launch = std::make_unique<BackgroundLaunch>(
        absl::StrCat(env, "exec ", source_, "/scripts/launch.sh --cluster_spec ", spec,
                     " --logdir ", dir_, "/logs ", flags, " -- ", worker_flags),
        absl::StrCat(dir_, "/", name, ".out"));
    EXPECT_TRUE(launch->started());
    return launch;
  }

  // The summary row of `task`: "worker/1  succeeded  2" and so on.
  static std::string SummaryRow(const std::string& output, const std::string& task) {
    std::smatch m;
    const std::regex row("\n  (" + task + " +[^\n]*)");
    const size_t summary = output.find("launch: summary");
    if (summary == std::string::npos) return "";
    const std::string tail = output.substr(summary);
    return std::regex_search(tail, m, row) ? m[1].str() : "";
  }

  // Status and restart count of `task` in the summary, e.g. ("succeeded", 1).
  static std::pair<std::string, int> Summary(const std::string& output,
                                             const std::string& task) {
    std::smatch m;
    const std::string row = SummaryRow(output, task);
    static const std::regex kRow(R"(^\S+ +(.*\S) +(\d+)( +<- made the job fail)?$)");
    if (!std::regex_search(row, m, kRow)) return {"(no row for " + task + ")", -1};
    return {m[1].str(), std::stoi(m[2])};
  }

  // True when no process of this test's cluster (named by its spec) is left.
  static bool NoTaskLeft(const std::string& spec) {
    // "[-]": the pattern must not match the shell that runs pgrep.
    return RunCommand("pgrep -f '[-]-cluster_spec=" + spec + "'").exit_code == 1;
  }
};

// A summary row: status and restart count.
using Row = std::pair<std::string, int>;

// --gpus_per_worker: each worker gets its own GPUs through
// CUDA_VISIBLE_DEVICES, and towers to match; ps tasks get none, and the
// evaluator runs on the CPU; a restart keeps them; too few GPUs are refused
// before anything starts.
TEST_F(LaunchTest, GivesEachWorkerItsOwnGpus) {
  const std::string spec = MakeSpec(1, 2);
  {  // And an evaluator (a fake task binds nothing: any port will do).
    std::string text = ReadFile(spec);
    text.insert(text.rfind('}'), R"(, "evaluator": ["127.0.0.1:1"])");
    std::ofstream(spec) << text;
  }
  // worker/1 dies at once and is restarted while the chief still runs.
  const std::string env = "FAKE_SHOW_ENV=1 " + FakeTasks("worker/0=0@2 worker/1=137@0.05,0");
  CommandResult r = LaunchWith(env, spec,
                               "--gpus=0,1,2,3,4 --gpus_per_worker=2 "
                               "--restart_policy=ExitCode --restart_backoff_secs=0");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const std::string worker0 = ReadFile(dir_ + "/logs/worker-0.log");
  const std::string worker1 = ReadFile(dir_ + "/logs/worker-1.log");
  const std::string ps0 = ReadFile(dir_ + "/logs/ps-0.log");
  EXPECT_NE(worker0.find("CUDA_VISIBLE_DEVICES=0,1 "), std::string::npos) << worker0;
  EXPECT_NE(worker0.find("--num_gpus=2"), std::string::npos) << worker0;
  // Started twice (137 then 0), with the same GPUs both times.
  EXPECT_EQ(FakeStarts("worker-1"), 2);
  size_t first = worker1.find("CUDA_VISIBLE_DEVICES=2,3 ");
  ASSERT_NE(first, std::string::npos) << worker1;
  EXPECT_NE(worker1.find("CUDA_VISIBLE_DEVICES=2,3 ", first + 1), std::string::npos)
      << worker1;
  EXPECT_NE(ps0.find("CUDA_VISIBLE_DEVICES= "), std::string::npos) << ps0;
  EXPECT_EQ(ps0.find("--num_gpus"), std::string::npos) << ps0;
  EXPECT_NE(r.output.find("GPUs 2,3"), std::string::npos) << r.output;
  const std::string evaluator = ReadFile(dir_ + "/logs/evaluator-0.log");
  EXPECT_NE(evaluator.find("CUDA_VISIBLE_DEVICES= "), std::string::npos) << evaluator;
  EXPECT_NE(evaluator.find("--task_index=0 --device=cpu --num_gpus=1"), std::string::npos)
      << evaluator;

  // The user's own --num_gpus stands.
  r = LaunchWith(env, spec, "--gpus=0,1 --gpus_per_worker=1", "--num_gpus=1 --foo");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // A run without restarts ends its loop cleanly (bash 5.2's set -u once
  // called the never-assigned timer table unbound there).
  EXPECT_EQ(r.output.find("unbound variable"), std::string::npos) << r.output;
  EXPECT_EQ(ReadFile(dir_ + "/logs/worker-1.log").find("--num_gpus=1 --foo --num_gpus"),
            std::string::npos);

  r = LaunchWith(env, spec, "--gpus=0,1,2 --gpus_per_worker=2");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--gpus_per_worker=2 for 2 worker/chief tasks here needs 4 GPUs, "
                          "but --gpus=0,1,2 gives 3"),
            std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("started"), std::string::npos) << r.output;
  r = LaunchWith(env, spec, "--gpus=0,1,1,2 --gpus_per_worker=2");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--gpus=0,1,1,2 names a GPU twice"), std::string::npos) << r.output;
  r = LaunchWith(env, spec, "--gpus=0,1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("only with --gpus_per_worker"), std::string::npos) << r.output;
  for (const std::string bad : {"two", "08"}) {
    r = LaunchWith(env, spec, "--gpus_per_worker=" + bad);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("--gpus_per_worker=" + bad + ": must be a whole number"),
              std::string::npos) << r.output;
  }
}

TEST_F(LaunchTest, RejectsUnknownPolicyAndBadRestartFlags) {
  const std::string spec = MakeSpec(1, 1);
  const std::string env = FakeTasks("");
  CommandResult r = LaunchWith(env, spec, "--restart_policy=Always");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--restart_policy=Always: must be Never, OnFailure or ExitCode"),
            std::string::npos) << r.output;
  r = LaunchWith(env, spec, "--max_restarts=-1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--max_restarts=-1"), std::string::npos) << r.output;
  r = LaunchWith(env, spec, "--restart_backoff_secs=soon");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--restart_backoff_secs=soon"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("started"), std::string::npos) << r.output;
  EXPECT_EQ(FakeStarts("ps-0"), 0);
}

TEST_F(LaunchTest, ExitCodePolicyRestartsTasksKilledBySignals) {
  const std::string spec = MakeSpec(1, 2);
  // worker/1 dies by SIGKILL, then SIGTERM, then exits 130, then succeeds;
  // the chief outlives it all (20 s: four starts of a task can take seconds
  // on a loaded machine, and the chief's end cancels pending restarts).
  CommandResult r = LaunchWith(FakeTasks("worker/0=0@20 worker/1=137,143,130,0"), spec,
                               "--restart_policy=ExitCode --restart_backoff_secs=0.1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(FakeStarts("worker-1"), 4);
  EXPECT_EQ(Summary(r.output, "worker/1"), Row("succeeded", 3)) << r.output;
  EXPECT_EQ(Summary(r.output, "worker/0"), Row("succeeded", 0)) << r.output;
  EXPECT_EQ(Summary(r.output, "ps/0"), Row("succeeded", 0)) << r.output;
  EXPECT_NE(r.output.find("task worker/1 exited (exit code 137, killed by SIGKILL)"),
            std::string::npos) << r.output;
  // One log per task; each restart appends after a separator line.
  const std::string log = ReadFile(dir_ + "/logs/worker-1.log");
  EXPECT_EQ(log,
            "fake worker/1: start 1: 137\n"
            "=== restart 1 of task worker/1 (exit code 137) ===\n"
            "fake worker/1: start 2: 143\n"
            "=== restart 2 of task worker/1 (exit code 143) ===\n"
            "fake worker/1: start 3: 130\n"
            "=== restart 3 of task worker/1 (exit code 130) ===\n"
            "fake worker/1: start 4: 0\n");
}

TEST_F(LaunchTest, ExitCodePolicyFailsTheJobOnAPermanentError) {
  const std::string spec = MakeSpec(1, 2);
  const absl::Time start = absl::Now();
  CommandResult r = LaunchWith(FakeTasks("worker/0=hang ps/0=hang worker/1=2"), spec,
                               "--restart_policy=ExitCode --restart_backoff_secs=0.1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(FakeStarts("worker-1"), 1);
  EXPECT_EQ(Summary(r.output, "worker/1"), Row("failed (exit code 2)", 0)) << r.output;
  EXPECT_NE(SummaryRow(r.output, "worker/1").find("<- made the job fail"), std::string::npos);
  EXPECT_EQ(Summary(r.output, "worker/0"), Row("stopped", 0)) << r.output;
  EXPECT_EQ(Summary(r.output, "ps/0"), Row("stopped", 0)) << r.output;
  EXPECT_NE(r.output.find("the job failed: task worker/1 failed with exit code 2, not "
                          "restarted: exit codes 1-127 are permanent errors"),
            std::string::npos) << r.output;
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
}

TEST_F(LaunchTest, OnFailureGivesUpAfterMaxRestartsWithDoublingBackoff) {
  const std::string spec = MakeSpec(1, 2);
  const absl::Time start = absl::Now();
  CommandResult r = LaunchWith(FakeTasks("worker/0=hang ps/0=hang worker/1=1@0"), spec,
                               "--restart_policy=OnFailure --max_restarts=3 "
                               "--restart_backoff_secs=0.4 --max_restart_backoff_secs=1");
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(FakeStarts("worker-1"), 4);  // The first start and 3 restarts.
  EXPECT_EQ(Summary(r.output, "worker/1"), Row("failed (exit code 1)", 3)) << r.output;
  // Backoff 0.4 s, doubled to 0.8 s, then capped at 1 s.
  const std::regex delays(
      "restarting it in 0.4s[\\s\\S]*restarting it in 0.8s[\\s\\S]*restarting it in 1s");
  EXPECT_TRUE(std::regex_search(r.output, delays)) << r.output;
  EXPECT_GE(elapsed, absl::Seconds(2.2));
  EXPECT_NE(r.output.find("it was restarted 3 times already (--max_restarts)"),
            std::string::npos) << r.output;
}

TEST_F(LaunchTest, TaskThatSucceedsIsNeverRestartedAndTheChiefEndsPendingRestarts) {
  const std::string spec = MakeSpec(1, 3);
  // worker/1 succeeds at once; worker/2 is killed and waits 30 s to restart,
  // but the chief succeeds first: the job is done.
  const absl::Time start = absl::Now();
  CommandResult r = LaunchWith(FakeTasks("worker/0=0@1.5 worker/1=0 worker/2=137"), spec,
                               "--restart_policy=OnFailure --restart_backoff_secs=30");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  EXPECT_EQ(FakeStarts("worker-1"), 1);
  EXPECT_EQ(FakeStarts("worker-2"), 1);
  EXPECT_EQ(Summary(r.output, "worker/0"), Row("succeeded", 0)) << r.output;
  EXPECT_EQ(Summary(r.output, "worker/1"), Row("succeeded", 0)) << r.output;
  EXPECT_EQ(Summary(r.output, "worker/2"), Row("stopped", 0)) << r.output;
}

TEST_F(LaunchTest, EvaluatorIsNeverRestarted) {
  const std::string spec = dir_ + "/eval.json";
  std::ofstream(spec) << R"({"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"],)"
                      << R"( "evaluator": ["127.0.0.1:3"]})";
  CommandResult r = LaunchWith(FakeTasks("worker/0=hang ps/0=hang evaluator/0=137"), spec,
                               "--restart_policy=OnFailure --restart_backoff_secs=0.1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(FakeStarts("evaluator-0"), 1);
  EXPECT_EQ(Summary(r.output, "evaluator/0"),
            Row("failed (exit code 137, killed by SIGKILL)", 0)) << r.output;
  EXPECT_NE(r.output.find("the evaluator is never restarted"), std::string::npos) << r.output;
}

TEST_F(LaunchTest, TerminateStopsRunningTasksAndPendingRestarts) {
  const std::string spec = MakeSpec(1, 2);
  auto launch = LaunchInBackground(FakeTasks("worker/0=hang ps/0=hang worker/1=143"), spec,
                                   "--restart_policy=ExitCode --restart_backoff_secs=30", "");
  ASSERT_TRUE(launch->WaitForOutput("restarting it in 30s", absl::Seconds(20)))
      << launch->Output();
  launch->Signal(SIGTERM);
  EXPECT_EQ(launch->Wait(absl::Seconds(30)), 143) << launch->Output();
  const std::string output = launch->Output();
  EXPECT_NE(output.find("launch: terminated: stopping every task"), std::string::npos);
  for (const char* task : {"ps/0", "worker/0", "worker/1"}) {
    EXPECT_EQ(Summary(output, task), Row("stopped", 0)) << task << "\n" << output;
  }
  EXPECT_EQ(FakeStarts("worker-1"), 1);
  EXPECT_TRUE(NoTaskLeft(spec));
}

TEST_F(LaunchTest, SignalWhileTasksDieEndsTheLauncher) {
  // Every task is killed by SIGKILL and the launcher gets SIGTERM at once, a
  // race that once left bash waiting forever for a child it had collected.
  const std::string spec = MakeSpec(2, 2);
  const std::string env = FakeTasks("ps/0=hang ps/1=hang worker/0=hang worker/1=hang");
  for (int round = 0; round < 5; ++round) {
    auto launch = LaunchInBackground(env, spec, "", "", absl::StrCat("round", round));
    ASSERT_TRUE(launch->WaitForOutput("started worker/1", absl::Seconds(20)));
    for (const char* task : {"ps/0", "ps/1", "worker/0", "worker/1"}) {
      ASSERT_GT(launch->TaskPid(task), 0) << launch->Output();
      kill(launch->TaskPid(task), SIGKILL);
    }
    launch->Signal(SIGTERM);
    const int code = launch->Wait(absl::Seconds(20));
    EXPECT_TRUE(code == 143 || code == 1) << "round " << round << ": " << code << "\n"
                                          << launch->Output();
    EXPECT_NE(launch->Output().find("launch: summary"), std::string::npos);
  }
  EXPECT_TRUE(NoTaskLeft(spec));
}

// Tasks killed together, two, three or all of them at the same moment:
// every death is seen and restarted. (Bash reaps a child that dies while
// the launcher handles another one, and `wait -n` then never reports it:
// two ps tasks killed together once left one of them dead for good.)
TEST_F(LaunchTest, TasksKilledTogetherAreAllRestarted) {
  const std::string spec = MakeSpec(2, 2);
  const std::vector<std::vector<std::string>> kill_sets = {
      {"ps/0", "ps/1"}, {"ps/0", "ps/1", "worker/1"}, {"ps/0", "ps/1", "worker/0", "worker/1"}};
  for (size_t round = 0; round < kill_sets.size(); ++round) {
    const std::vector<std::string>& killed = kill_sets[round];
    RunCommand("rm -rf " + dir_ + "/state " + dir_ + "/logs");
    std::string plan;
    for (const char* task : {"ps/0", "ps/1", "worker/0", "worker/1"}) {
      const bool kill_it = std::find(killed.begin(), killed.end(), task) != killed.end();
      // Killed, then 4 s more after the restart; the others outlive that
      // (the chief's success would cancel a restart still pending).
      absl::StrAppend(&plan, task, "=", kill_it ? "hang,0@4 " : "0@8 ");
    }
    auto launch =
        LaunchInBackground(FakeTasks(plan), spec,
                           "--restart_policy=ExitCode --restart_backoff_secs=0.1", "",
                           absl::StrCat("round", round));
    ASSERT_TRUE(launch->WaitForOutput("started worker/1", absl::Seconds(20)))
        << launch->Output();
    std::vector<pid_t> pids;
    for (const std::string& task : killed) {
      pids.push_back(launch->TaskPid(task));
      // Killed before it counted its start, its restart would hang again.
      std::string file = task;
      std::replace(file.begin(), file.end(), '/', '-');
      for (int i = 0; i < 400 && FakeStarts(file) < 1; ++i) absl::SleepFor(absl::Milliseconds(50));
      ASSERT_EQ(FakeStarts(file), 1) << task;
    }
    for (pid_t pid : pids) ASSERT_GT(pid, 0) << launch->Output();
    for (pid_t pid : pids) kill(pid, SIGKILL);
    const int code = launch->Wait(absl::Seconds(60));
    const std::string output = launch->Output();
    if (code == BackgroundLaunch::kRunning) launch->Signal(SIGTERM);
    ASSERT_EQ(code, 0) << "round " << round << " (plan " << plan << "):\n" << output;
    for (const std::string& task : killed) {
      EXPECT_EQ(Summary(output, task), Row("succeeded", 1)) << task << "\n" << output;
      EXPECT_NE(output.find("task " + task + " exited (exit code 137, killed by SIGKILL)"),
                std::string::npos)
          << task << "\n" << output;
    }
  }
  EXPECT_TRUE(NoTaskLeft(spec));
}

// The real binaries from here on.

constexpr char kSyncFlags[] =
    "--sync_replicas --train_steps=600 --learning_rate=0.1 --log_every_steps=20";

TEST_F(LaunchTest, WorkerKilledMidRunIsRestartedAndRejoinsUnderExitCode) {
  const std::string spec = MakeSpec(1, 2);
  auto launch = LaunchInBackground("PSRT_BIN_DIR=" + bin_ + " ", spec,
                                   "--restart_policy=ExitCode", kSyncFlags);
  const std::string worker_log = dir_ + "/logs/worker-1.log";
  for (int i = 0; i < 600 && ReadFile(worker_log).find("step 100,") == std::string::npos; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  const pid_t worker = launch->TaskPid("worker/1");
  ASSERT_GT(worker, 0) << launch->Output();
  ASSERT_EQ(kill(worker, SIGKILL), 0);
  ASSERT_EQ(launch->Wait(absl::Seconds(90)), 0) << launch->Output();
  const std::string output = launch->Output();
  EXPECT_NE(output.find("task worker/1 exited (exit code 137, killed by SIGKILL)"),
            std::string::npos) << output;
  EXPECT_EQ(Summary(output, "worker/1"), Row("succeeded", 1)) << output;
  EXPECT_EQ(Summary(output, "worker/0"), Row("succeeded", 0)) << output;
  EXPECT_EQ(Summary(output, "ps/0"), Row("succeeded", 0)) << output;
  long step = 0;
  double accuracy = 0;
  ASSERT_TRUE(ParseFinal(ReadFile(dir_ + "/logs/worker-0.log"), &step, &accuracy)) << output;
  EXPECT_EQ(step, 600);
  // The restarted worker appended to its log and picked up the current step.
  const std::string log = ReadFile(worker_log);
  const size_t restart = log.find("=== restart 1 of task worker/1 (exit code 137) ===");
  ASSERT_NE(restart, std::string::npos) << log;
  EXPECT_NE(log.find("resuming at global step", restart), std::string::npos) << log;
  EXPECT_NE(log.find("global step 600", restart), std::string::npos) << log;
  EXPECT_NE(ReadFile(dir_ + "/logs/ps-0.log").find("done: 600 versions"), std::string::npos);
}

// Supervision and recovery together: the launcher restarts a ps killed by
// SIGKILL, the ps restores its newest checkpoint, and the workers carry on.
// ps/1 of a 2 ps + 2 worker sync job is killed -9 at step 100: under
// ExitCode it is restarted, restores its checkpoint, and the job ends at its
// last step. `transport` is --tensor_transport for every task.
void LaunchTest::ExpectAKilledPsIsRestartedAndTheJobRecovers(const std::string& transport) {
  const std::string spec = MakeSpec(2, 2);
  auto launch = LaunchInBackground(
      "PSRT_BIN_DIR=" + bin_ + " ", spec,
      absl::StrCat("--restart_policy=ExitCode --checkpoint_dir ", dir_,
                   "/ckpt --ps_flags --tensor_transport=", transport),
      absl::StrCat(kSyncFlags, " --save_checkpoint_steps=50 --tensor_transport=", transport));
  const std::string chief_log = dir_ + "/logs/worker-0.log";
  for (int i = 0; i < 600 && ReadFile(chief_log).find("step 100,") == std::string::npos; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  const pid_t ps = launch->TaskPid("ps/1");
  ASSERT_GT(ps, 0) << launch->Output();
  ASSERT_EQ(kill(ps, SIGKILL), 0);
  ASSERT_EQ(launch->Wait(absl::Seconds(120)), 0) << launch->Output();
  const std::string output = launch->Output();
  EXPECT_EQ(Summary(output, "ps/1"), Row("succeeded", 1)) << output;
  EXPECT_EQ(Summary(output, "worker/0"), Row("succeeded", 0)) << output;
  EXPECT_EQ(Summary(output, "worker/1"), Row("succeeded", 0)) << output;
  const std::string chief = ReadFile(chief_log);
  EXPECT_NE(chief.find("recovered in"), std::string::npos) << chief;
  long step = 0;
  double accuracy = 0;
  ASSERT_TRUE(ParseFinal(chief, &step, &accuracy)) << output;
  EXPECT_EQ(step, 600);
  const std::string ps_log = ReadFile(dir_ + "/logs/ps-1.log");
  const size_t restart = ps_log.find("=== restart 1 of task ps/1 (exit code 137) ===");
  ASSERT_NE(restart, std::string::npos) << ps_log;
  EXPECT_NE(ps_log.find("restored checkpoint", restart), std::string::npos) << ps_log;
  if (transport == "data_plane") {
    // The restarted ps serves its data plane again, on a port of its own
    // choosing (--data_port=0), which the workers ask it for to reconnect.
    const size_t first = ps_log.find("data plane on ");
    const size_t second = ps_log.find("data plane on ", restart);
    ASSERT_NE(first, std::string::npos) << ps_log;
    ASSERT_NE(second, std::string::npos) << ps_log;
  }
}

TEST_F(LaunchTest, PsKilledMidRunIsRestartedAndTheJobRecoversUnderExitCode) {
  ExpectAKilledPsIsRestartedAndTheJobRecovers("grpc");
}

TEST_F(LaunchTest, PsKilledMidRunOverTheDataPlaneIsRestartedAndTheWorkersReconnect) {
  ExpectAKilledPsIsRestartedAndTheJobRecovers("data_plane");
}

// A chief that fails (here: its pull times out while worker/1 is stopped)
// must not end training as if it had finished: under OnFailure it is
// restarted, recovers, and the job still reaches its last step. (A failed
// chief used to say goodbye: the job "succeeded" at a partial step, and the
// restarted chief found training over and printed no final line.)
TEST_F(LaunchTest, AFailedChiefIsRestartedInsteadOfEndingTheJobUnderOnFailure) {
  const std::string spec = MakeSpec(1, 2);
  // The short pull timeout fails the chief soon after worker/1 stops; it
  // also fails a restarted worker whose peer is slower than that to start
  // again (a busy machine): restarts enough for both to come up together.
  auto launch = LaunchInBackground("PSRT_BIN_DIR=" + bin_ + " ", spec,
                                   "--restart_policy=OnFailure --max_restarts=10",
                                   absl::StrCat(kSyncFlags, " --pull_timeout_secs=3"));
  const std::string chief_log = dir_ + "/logs/worker-0.log";
  for (int i = 0; i < 600 && ReadFile(chief_log).find("step 100,") == std::string::npos; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  const pid_t worker = launch->TaskPid("worker/1");
  ASSERT_GT(worker, 0) << launch->Output();
  ASSERT_EQ(kill(worker, SIGSTOP), 0);
  // Beyond the pull timeout: the chief fails and is restarted.
  const bool restarted = launch->WaitForOutput("restarting", absl::Seconds(60));
  ASSERT_EQ(kill(worker, SIGCONT), 0);
  ASSERT_TRUE(restarted) << launch->Output();
  ASSERT_EQ(launch->Wait(absl::Seconds(120)), 0) << launch->Output();
  const std::string chief = ReadFile(chief_log);
  const size_t restart = chief.find("=== restart 1 of task worker/0");
  ASSERT_NE(restart, std::string::npos) << chief;
  long step = 0;
  double accuracy = 0;
  ASSERT_TRUE(ParseFinal(chief.substr(restart), &step, &accuracy)) << chief;
  EXPECT_EQ(step, 600);
  // Training ended once, at the end (a line per stripe).
  const std::string ps_log = ReadFile(dir_ + "/logs/ps-0.log");
  const std::regex ended("ended training at version (\\d+)");
  int endings = 0;
  for (auto it = std::sregex_iterator(ps_log.begin(), ps_log.end(), ended);
       it != std::sregex_iterator(); ++it, ++endings) {
    EXPECT_EQ((*it)[1], "600") << ps_log;
  }
  EXPECT_GT(endings, 0) << ps_log;
}

TEST_F(LaunchTest, WorkerKilledMidRunFailsTheJobUnderNever) {
  const std::string spec = MakeSpec(1, 2);
  auto launch = LaunchInBackground("PSRT_BIN_DIR=" + bin_ + " ", spec, "", kSyncFlags);
  const std::string worker_log = dir_ + "/logs/worker-1.log";
  for (int i = 0; i < 600 && ReadFile(worker_log).find("step 20,") == std::string::npos; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  const pid_t worker = launch->TaskPid("worker/1");
  ASSERT_GT(worker, 0) << launch->Output();
  ASSERT_EQ(kill(worker, SIGKILL), 0);
  EXPECT_EQ(launch->Wait(absl::Seconds(40)), 1) << launch->Output();
  const std::string output = launch->Output();
  EXPECT_EQ(Summary(output, "worker/1"), Row("failed (exit code 137, killed by SIGKILL)", 0))
      << output;
  EXPECT_EQ(Summary(output, "worker/0"), Row("stopped", 0)) << output;
  EXPECT_EQ(Summary(output, "ps/0"), Row("stopped", 0)) << output;
  EXPECT_NE(output.find("not restarted: --restart_policy=Never"), std::string::npos) << output;
  EXPECT_EQ(ReadFile(worker_log).find("=== restart"), std::string::npos);
  EXPECT_TRUE(NoTaskLeft(spec));
}

TEST_F(LaunchTest, InterruptStopsEveryTaskAndPrintsTheSummary) {
  const std::string spec = MakeSpec(2, 2);
  auto launch = LaunchInBackground("PSRT_BIN_DIR=" + bin_ + " ", spec,
                                   "--restart_policy=OnFailure",
                                   "--train_steps=1000000 --log_every_steps=20");
  // The chief's log is echoed by the launcher: wait until it trains.
  ASSERT_TRUE(launch->WaitForOutput(", loss = ", absl::Seconds(60))) << launch->Output();
  launch->Signal(SIGINT);
  EXPECT_EQ(launch->Wait(absl::Seconds(30)), 130) << launch->Output();
  const std::string output = launch->Output();
  EXPECT_NE(output.find("launch: interrupted: stopping every task"), std::string::npos);
  for (const char* task : {"ps/0", "ps/1", "worker/0", "worker/1"}) {
    EXPECT_EQ(Summary(output, task), Row("stopped", 0)) << task << "\n" << output;
  }
  EXPECT_EQ(output.find("restarting"), std::string::npos) << output;
  EXPECT_TRUE(NoTaskLeft(spec));
}

}  // namespace
}  // namespace psrt
