// Jobs through a real Slurm: scripts/slurm/local_slurm.sh starts Debian's
// slurmctld and three slurmd on this host for the suite and stops them after;
// srun and sbatch run psrt's tasks through scripts/slurm/psrt_task.sh, which
// finds the cluster from Slurm's variables alone.
#include <unistd.h>

#include <cstdio>
#include <regex>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"

namespace psrt {
namespace {

// A batch job (scripts/slurm/psrt_job.sh) and what it prints, once it ended.
struct BatchJob {
  int exit_code = -1;
  std::string id;
  std::string log;
};

class SlurmTest : public ClusterFixture {
 protected:
  static void SetUpTestSuite() {
    slurm_dir_ = new std::string(absl::StrCat(testing::TempDir(), "psrt_slurm.", ::getpid()));
    CommandResult r = RunCommand(absl::StrCat(
        PSRT_SOURCE_DIR, "/scripts/slurm/local_slurm.sh start ", *slurm_dir_, " 2>&1"));
    if (r.exit_code != 0) start_error_ = new std::string(r.output);
  }
  static void TearDownTestSuite() {
    RunCommand(absl::StrCat(PSRT_SOURCE_DIR, "/scripts/slurm/local_slurm.sh stop ", *slurm_dir_,
                            " && rm -rf ", *slurm_dir_));
    delete slurm_dir_;
    delete start_error_;
    start_error_ = nullptr;
  }
  void SetUp() override {
    ClusterFixture::SetUp();
    if (IsSkipped()) return;
    if (start_error_ != nullptr) GTEST_SKIP() << "Slurm cannot start here:\n" << *start_error_;
  }
  void TearDown() override {
    // A test that failed or timed out leaves no job behind for the next.
    if (start_error_ == nullptr) Slurm("scancel --user=$(id -un)");
    ClusterFixture::TearDown();
  }

  // A Slurm command (srun, sbatch, ...) against the local cluster.
  CommandResult Slurm(const std::string &command) {
    return RunCommand(absl::StrCat("SLURM_CONF=", *slurm_dir_, "/slurm.conf PSRT_BIN_DIR=", bin_,
                                   " timeout 300 ", command, " 2>&1"));
  }
  std::string Task() const { return source_ + "/scripts/slurm/psrt_task.sh"; }

  // Submits a batch script of `directives` (#SBATCH lines) whose body runs
  // psrt_job.sh with `job_args`, and waits for the job to end.
  BatchJob SubmitAndWait(const std::string &directives, const std::string &job_args,
                         int base_port) {
    const std::string script = absl::StrCat(dir_, "/job", base_port, ".sbatch");
    FILE *f = std::fopen(script.c_str(), "w");
    EXPECT_NE(f, nullptr) << script;
    if (f == nullptr) return {};
    std::fprintf(f,
                 "#!/usr/bin/env bash\n#SBATCH --output=psrt-%%j.out\n%sexec "
                 "%s/scripts/slurm/psrt_job.sh %s\n",
                 directives.c_str(), source_.c_str(), job_args.c_str());
    std::fclose(f);
    CommandResult r = Slurm(absl::StrCat("sbatch --parsable --wait --chdir=", dir_,
                                         " --export=ALL,PSRT_ROOT=", source_,
                                         ",PSRT_BASE_PORT=", base_port, " ", script));
    BatchJob job;
    job.exit_code = r.exit_code;
    job.id = std::string(absl::StripAsciiWhitespace(r.output.substr(0, r.output.find('\n'))));
    job.log = absl::StrCat(r.output, "\n", ReadFile(absl::StrCat(dir_, "/psrt-", job.id, ".out")));
    return job;
  }

  static std::string *slurm_dir_;
  static std::string *start_error_;
};

std::string *SlurmTest::slurm_dir_ = nullptr;
std::string *SlurmTest::start_error_ = nullptr;

TEST_F(SlurmTest, SyncJobOfOnePsAndTwoWorkersOnThreeNodes) {
  CommandResult r =
      Slurm(absl::StrCat("srun --nodes=3 --ntasks=3 --kill-on-bad-exit=1 --label ", Task(),
                         " --ps 1 --base_port 12222 -- --sync_replicas --train_steps=200 "
                         "--learning_rate=0.1 "
                         "--log_every_steps=100"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Rank 0 is ps/0 on n1; ranks 1 and 2 the workers on n2 and n3.
  EXPECT_NE(r.output.find("0: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ps/0 serving on n1:12222"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("worker/1 status and health on n3:12222"), std::string::npos) << r.output;
  long step = 0;
  double accuracy = 0;
  ASSERT_TRUE(ParseFinal(r.output, &step, &accuracy)) << r.output;
  EXPECT_EQ(step, 200);
  EXPECT_GT(accuracy, 0.7);
}

TEST_F(SlurmTest, AllreduceJobOfThreeWorkersWithTwoOnANode) {
  CommandResult r =
      Slurm(absl::StrCat("srun --nodes=2 --ntasks=3 --kill-on-bad-exit=1 --label ", Task(),
                         " --ps 0 --base_port 12322 -- --train_steps=100 --learning_rate=0.1 "
                         "--log_every_steps=50"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("allreduce mode"), std::string::npos) << r.output;
  long step = 0;
  double accuracy = 0;
  ASSERT_TRUE(ParseFinal(r.output, &step, &accuracy)) << r.output;
  EXPECT_EQ(step, 100);
}

// Sync, fixed data order, momentum (so optimizer slots are restored too):
// a resumed run ends with the parameters of an undisturbed one.
constexpr char kExactFlags[] =
    "--noshuffle --optimizer=momentum --learning_rate=0.01 --hidden_units=64 "
    "--batch_size=50 "
    "--save_checkpoint_steps=50 --log_every_steps=50 --train_steps=600";

// The ps task of a batch job is killed -9: the step ends at once
// (--kill-on-bad-exit), the job requeues itself, and its second run resumes
// from the checkpoint in the job's directory and ends exactly where an
// undisturbed run ends.
TEST_F(SlurmTest, AKilledTaskEndsTheStepAndTheRequeuedJobResumesFromItsCheckpoint) {
  const std::string reference = dir_ + "/reference.safetensors";
  CommandResult r = Slurm(absl::StrCat("srun --nodes=3 --ntasks=3 --kill-on-bad-exit=1 ", Task(),
                                       " --ps 1 --base_port 12422 -- --sync_replicas ", kExactFlags,
                                       " --final_params_out=", reference));
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const std::string resumed = dir_ + "/resumed.safetensors";
  r = Slurm(absl::StrCat("sbatch --parsable --chdir=", dir_, " --export=ALL,PSRT_ROOT=", source_,
                         ",PSRT_BASE_PORT=12522 ", source_, "/scripts/slurm/ps_sync.sbatch ",
                         kExactFlags, " --final_params_out=", resumed));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string job(absl::StripAsciiWhitespace(r.output));
  const std::string ckpt = absl::StrCat(dir_, "/psrt-ckpt-", job);
  // The last of the ps's two stripes has saved step 100: kill the ps.
  const std::string index = ckpt + "/checkpoint.ps-1-of-2";
  bool saved = false;
  for (int i = 0; i < 1200 && !saved; ++i) {
    saved = ReadFile(index).find("model.ckpt-100.") != std::string::npos;
    if (!saved) absl::SleepFor(absl::Milliseconds(50));
  }
  const std::string out = absl::StrCat(dir_, "/psrt-", job, ".out");
  ASSERT_TRUE(saved) << ReadFile(out);
  const absl::Time killed = absl::Now();
  ASSERT_EQ(RunCommand("pkill -9 -f '[p]srt_ps --checkpoint_dir=" + ckpt + "'").exit_code, 0);
  // The job ends (requeued once, then done).
  bool done = false;
  for (int i = 0; i < 1200 && !done; ++i) {
    done = Slurm("squeue --noheader --jobs=" + job).output.find(job) == std::string::npos;
    if (!done) absl::SleepFor(absl::Milliseconds(100));
  }
  const std::string log = ReadFile(out);
  ASSERT_TRUE(done) << log;
  EXPECT_NE(log.find("requeueing job " + job + " (requeue 1 of at most 3)"), std::string::npos)
      << log;
  EXPECT_NE(log.find("psrt_job: job " + job + " run 2"), std::string::npos) << log;
  EXPECT_NE(log.find("every parameter server restored checkpoint"), std::string::npos) << log;
  EXPECT_NE(log.find("resuming at global step"), std::string::npos) << log;
  long step = 0;
  double accuracy = 0;
  ASSERT_TRUE(ParseFinal(log, &step, &accuracy)) << log;
  EXPECT_EQ(step, 600);
  const double diff = MaxAbsDiff(resumed, reference);
  EXPECT_GE(diff, 0);
  EXPECT_LE(diff, 1e-5);
  std::printf("slurm: from the kill to the requeued job's end: %s\n",
              absl::FormatDuration(absl::Now() - killed).c_str());
}

// The ps and the workers as the components of a heterogeneous job (as
// scripts/slurm/gpu.sbatch asks GPUs for the workers only): psrt_job.sh runs
// one step over both, ranks in component order.
TEST_F(SlurmTest, HeterogeneousJobWithThePsAndTheWorkersAsComponents) {
  BatchJob job = SubmitAndWait(
      "#SBATCH --nodes=1 --ntasks=1\n#SBATCH hetjob\n#SBATCH "
      "--nodes=2 --ntasks-per-node=1\n",
      "--ps 1 -- --sync_replicas --train_steps=200 "
      "--learning_rate=0.1 --log_every_steps=100",
      12622);
  ASSERT_EQ(job.exit_code, 0) << job.log;
  EXPECT_NE(job.log.find("ps/0 serving on n1:12622"), std::string::npos) << job.log;
  EXPECT_NE(job.log.find("worker/1 status and health on n3:12622"), std::string::npos) << job.log;
  long step = 0;
  double accuracy = 0;
  ASSERT_TRUE(ParseFinal(job.log, &step, &accuracy)) << job.log;
  EXPECT_EQ(step, 200);
  EXPECT_GT(accuracy, 0.7);
}

// A task that exits 1 (a flag the worker does not know) fails the job at once:
// a rerun would fail the same way, so it is not requeued.
TEST_F(SlurmTest, AJobWhoseTaskExitsWithAnErrorIsNotRequeued) {
  BatchJob job = SubmitAndWait("#SBATCH --nodes=3 --ntasks=3\n#SBATCH --requeue\n",
                               "--ps 1 -- --sync_replicas --no_such_flag=1", 12722);
  EXPECT_NE(job.exit_code, 0) << job.log;
  EXPECT_NE(job.log.find("no_such_flag"), std::string::npos) << job.log;
  // Either worker's exit, whichever srun reports first.
  EXPECT_TRUE(std::regex_search(
      job.log, std::regex("not requeued: n[23]: task [12]: Exited with exit code 1, an error")))
      << job.log;
  EXPECT_EQ(job.log.find("requeueing"), std::string::npos) << job.log;
  EXPECT_EQ(job.log.find("run 2"), std::string::npos) << job.log;
}

TEST_F(SlurmTest, ATaskOutsideAStepIsToldWhatIsMissing) {
  CommandResult r = RunCommand(
      absl::StrCat("env -u SLURM_STEP_NODELIST -u SLURM_JOB_NODELIST PSRT_BIN_DIR=", bin_, " ",
                   Task(), " --ps 1 2>&1"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("SLURM_STEP_NODELIST is not set: is this task started by srun"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace psrt
