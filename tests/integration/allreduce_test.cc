// Allreduce mode end to end, with real worker processes on 127.0.0.1 and no
// parameter servers: it trains exactly as a sync ps job of the same workers
// does, resumes from its checkpoints exactly, and a hung worker fails the
// job, named, instead of hanging it too.
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"

namespace psrt {
namespace {

// Fixed data order and momentum, so that optimizer slots matter on resume.
constexpr char kFlags[] =
    "--sync_replicas --noshuffle --optimizer=momentum --learning_rate=0.01 "
    "--hidden_units=64 --batch_size=50 --log_every_steps=20";

class AllreduceTest : public ClusterFixture {};

TEST_F(AllreduceTest, TrainsExactlyAsASyncPsJobOfTheSameWorkers) {
  const std::string ps_out = dir_ + "/ps.safetensors";
  CommandResult ps = Launch(MakeSpec(1, 2, "ps.json"), dir_ + "/ps",
                            absl::StrCat(kFlags, " --train_steps=40 --final_params_out=", ps_out));
  ASSERT_EQ(ps.exit_code, 0) << ps.output;
  // Fusion groups of at most 0.1 MB (the model's four variables in two
  // groups), each reduced while the backward pass goes on; with a timeline;
  // the ring's segments over the workers' data-plane Unix sockets (taken
  // without a flag: the workers share a host).
  const std::string ring_out = dir_ + "/ring.safetensors";
  CommandResult ring = Launch(
      MakeSpec(0, 2, "ring.json"), dir_ + "/ring",
      absl::StrCat(kFlags, " --train_steps=40 --fusion_mb=0.1 --overlap_comm --timeline=", dir_,
                   "/trace.json --final_params_out=", ring_out));
  ASSERT_EQ(ring.exit_code, 0) << ring.output;
  for (const std::string trace : {"/trace.json", "/trace-1.json"}) {
    const std::string events = ReadFile(dir_ + trace);
    for (const char* name : {"\"compute\"", "\"fusion\"", "\"reduce_scatter\"",
                             "\"all_gather\"", "\"apply\""}) {
      EXPECT_NE(events.find(name), std::string::npos) << trace << " has no " << name;
    }
  }
  const std::string chief = ReadFile(dir_ + "/ring/worker-0.log");
  EXPECT_NE(chief.find("allreduce mode"), std::string::npos) << chief;
  EXPECT_NE(chief.find("in 2 fusion groups"), std::string::npos) << chief;
  const size_t segments = chief.find("allreduce: segments to worker/1 (");
  ASSERT_NE(segments, std::string::npos) << chief;
  const std::string line = chief.substr(segments, chief.find('\n', segments) - segments);
  EXPECT_NE(line.find(") over unix-abstract:psrt-data-"), std::string::npos) << line;
  long step = 0;
  double accuracy = 0;
  ASSERT_TRUE(ParseFinal(chief, &step, &accuracy)) << chief;
  EXPECT_EQ(step, 40);
  const double diff = MaxAbsDiff(ring_out, ps_out);
  EXPECT_GE(diff, 0);
  EXPECT_LE(diff, 1e-5);
  // An operator's shutdown needs parameter servers; this job has none.
  CommandResult shutdown =
      RunCommand(absl::StrCat(bin_, "/psrtctl shutdown --cluster_spec=", dir_, "/ring.json"));
  EXPECT_EQ(shutdown.exit_code, 1) << shutdown.output;
  EXPECT_NE(shutdown.output.find("an allreduce-mode job"), std::string::npos) << shutdown.output;
}

TEST_F(AllreduceTest, ResumesFromItsCheckpointsExactly) {
  const std::string spec = MakeSpec(0, 2);
  const std::string ckpt = dir_ + "/ckpt";
  const std::string flags = absl::StrCat(kFlags, " --save_checkpoint_steps=20");
  CommandResult first = Launch(spec, dir_ + "/first", flags + " --train_steps=40",
                               "--checkpoint_dir " + ckpt);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  // A one-shard ps checkpoint.
  EXPECT_NE(ReadFile(ckpt + "/checkpoint.ps-0-of-1").find("model.ckpt-40.ps-0-of-1"),
            std::string::npos);

  const std::string resumed = dir_ + "/resumed.safetensors";
  CommandResult second = Launch(spec, dir_ + "/second",
                                flags + " --train_steps=60 --final_params_out=" + resumed,
                                "--checkpoint_dir " + ckpt);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(ReadFile(dir_ + "/second/worker-0.log").find("resuming at global step 40"),
            std::string::npos);

  const std::string reference = dir_ + "/reference.safetensors";
  CommandResult whole = Launch(MakeSpec(0, 2, "reference.json"), dir_ + "/reference",
                               flags + " --train_steps=60 --final_params_out=" + reference);
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const double diff = MaxAbsDiff(resumed, reference);
  EXPECT_GE(diff, 0);
  EXPECT_LE(diff, 1e-5);
}

// worker/1 is killed mid-run under a restart policy: worker/0 fails on
// seeing it come back, the launcher restarts it too, and the job resumes
// from the last checkpoint, ending exactly where an uninterrupted run ends.
TEST_F(AllreduceTest, AKilledWorkerRestartsTheJobFromItsLastCheckpoint) {
  const std::string spec = MakeSpec(0, 2);
  const std::string ckpt = dir_ + "/ckpt";
  const std::string flags = absl::StrCat(
      "--model=lenet --intra_op_threads=1 --sync_replicas --noshuffle --learning_rate=0.01 "
      "--batch_size=20 --log_every_steps=20 --save_checkpoint_steps=20 --train_steps=200 "
      "--allreduce_timeout_secs=10 --final_params_out=");
  const std::string resumed = dir_ + "/resumed.safetensors";
  RunCommand(absl::StrCat("(PSRT_BIN_DIR=", bin_, " timeout 240 ", source_,
                          "/scripts/launch.sh --cluster_spec ", spec, " --logdir ", dir_,
                          "/run --checkpoint_dir ", ckpt, " --restart_policy=OnFailure -- ",
                          flags, resumed, " > ", dir_, "/run.out 2>&1; echo $? > ", dir_,
                          "/run.rc) > /dev/null 2>&1 &"));
  const std::string index = ckpt + "/checkpoint.ps-0-of-1";
  bool saved = false;
  for (int i = 0; i < 1200 && !saved; ++i) {
    saved = ReadFile(index).find("model.ckpt-40.") != std::string::npos;
    if (!saved) absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(saved) << ReadFile(dir_ + "/run.out");
  RunCommand("pkill -9 -f '[c]luster_spec=" + spec + " --job_name=worker --task_index=1'");
  std::string rc;
  for (int i = 0; i < 2400 && rc.empty(); ++i) {
    rc = ReadFile(dir_ + "/run.rc");
    if (rc.empty()) absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_EQ(rc, "0\n") << ReadFile(dir_ + "/run.out") << "\nworker/1, restarted:\n"
                        << ReadFile(dir_ + "/run/worker-1.log");
  const std::string chief = ReadFile(dir_ + "/run/worker-0.log");
  EXPECT_NE(chief.find("resuming at global step"), std::string::npos) << chief;
  long step = 0;
  double accuracy = 0;
  ASSERT_TRUE(ParseFinal(chief, &step, &accuracy)) << chief;
  EXPECT_EQ(step, 200);

  const std::string reference = dir_ + "/reference.safetensors";
  CommandResult whole =
      Launch(MakeSpec(0, 2, "reference.json"), dir_ + "/reference", flags + reference);
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const double diff = MaxAbsDiff(resumed, reference);
  EXPECT_GE(diff, 0);
  EXPECT_LE(diff, 1e-5);
}

// worker/1 hangs (SIGSTOP: the launcher sees nothing wrong, its connections
// stay open): worker/0 fails within --allreduce_timeout_secs, naming it.
TEST_F(AllreduceTest, AHungWorkerFailsTheOthersNamingIt) {
  const std::string spec = MakeSpec(0, 2);
  const std::string run = absl::StrCat(
      "PSRT_BIN_DIR=", bin_, " ", source_, "/scripts/launch.sh --cluster_spec ", spec,
      " --logdir ", dir_, "/run -- ", kFlags,
      " --train_steps=1000000 --allreduce_timeout_secs=5 > ", dir_, "/run.out 2>&1 & echo $!");
  std::string launcher = RunCommand(run).output;
  launcher.erase(launcher.find_last_not_of(" \n") + 1);
  const std::string chief_log = dir_ + "/run/worker-0.log";
  bool training = false;
  for (int i = 0; i < 600 && !training; ++i) {
    training = ReadFile(chief_log).find("step 20,") != std::string::npos;
    if (!training) absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(training) << ReadFile(chief_log);
  // "[c]": the pattern does not match the shell that runs pkill.
  const std::string worker1 = "'[c]luster_spec=" + spec + " --job_name=worker --task_index=1'";
  const absl::Time stopped = absl::Now();
  RunCommand("pkill -STOP -f " + worker1);
  // The launcher ends once worker/0 has failed (restart policy Never).
  CommandResult waited = RunCommand("timeout 60 tail --pid=" + launcher + " -f /dev/null");
  EXPECT_EQ(waited.exit_code, 0) << "the job still runs 60 s after worker/1 hung";
  EXPECT_LT(absl::Now() - stopped, absl::Seconds(30));
  RunCommand("pkill -9 -f " + worker1);
  const std::string chief = ReadFile(chief_log);
  EXPECT_NE(chief.find("worker/1 (127.0.0.1:"), std::string::npos) << chief;
  EXPECT_NE(chief.find("allreduce"), std::string::npos) << chief;
}

}  // namespace
}  // namespace psrt
