// Replicated shards (--ps_replicas=1) on real clusters on 127.0.0.1: kill -9
// a primary at a random step of a job that has no checkpoint directory at
// all, so that only the backup copies can save it, and check that the job
// ends exactly where an undisturbed run ends, with no step rolled back.
#include <memory>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"

namespace psrt {
namespace {

constexpr char kSyncFlags[] =
    "--sync_replicas --noshuffle --optimizer=momentum --learning_rate=0.02 "
    "--hidden_units=64 --batch_size=50 --log_every_steps=5 --train_steps=200";
constexpr char kAsyncFlags[] =
    "--optimizer=sgd --learning_rate=0.05 --hidden_units=64 --batch_size=50 "
    "--log_every_steps=5 --train_steps=300";

class ReplicationTest : public ClusterFixture {
 protected:
  // Starts every task of `spec` by hand, with --ps_replicas=1 and no
  // checkpoint directory; `common_flags` go to every task.
  void StartCluster(const std::string& spec, int ps, int workers, const std::string& flags,
                    const std::string& common_flags = "") {
    for (int k = 0; k < ps; ++k) {
      ps_.push_back(std::make_unique<TaskProcess>(
          absl::StrCat(bin_, "/psrt_ps --cluster_spec=", spec, " --job_name=ps --task_index=",
                       k, " --ps_replicas=1 ", common_flags),
          absl::StrCat(dir_, "/ps-", k, ".log")));
      ps_.back()->Start();
    }
    for (int i = 0; i < workers; ++i) {
      workers_.push_back(std::make_unique<TaskProcess>(
          absl::StrCat(bin_, "/psrt_worker --cluster_spec=", spec,
                       " --job_name=worker --task_index=", i, " --ps_replicas=1 ", flags, " ",
                       common_flags),
          absl::StrCat(dir_, "/worker-", i, ".log")));
      workers_.back()->Start();
    }
  }

  // No worker rolled back: nobody recovered from a checkpoint.
  void ExpectNoRollback() {
    for (int i = 0; i < static_cast<int>(workers_.size()); ++i) {
      const std::string log = ReadFile(absl::StrCat(dir_, "/worker-", i, ".log"));
      EXPECT_EQ(log.find("carrying on at global step"), std::string::npos) << log;
      EXPECT_EQ(log.find("recovered in"), std::string::npos) << log;
    }
  }

  // The undisturbed run's final parameters (launch.sh, no replicas);
  // `ps_flags` go to its ps tasks.
  std::string Reference(const std::string& flags, int ps = 2, const std::string& ps_flags = "") {
    const std::string out = dir_ + "/reference.safetensors";
    CommandResult r = Launch(MakeSpec(ps, 2, "reference.json"), dir_ + "/reference",
                             absl::StrCat(flags, " --final_params_out=", out),
                             ps_flags.empty() ? "" : absl::StrCat("--ps_flags '", ps_flags, "'"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return out;
  }

};

// ps/0 dies for good: its shards' backups on ps/1 take over at the version
// they hold, the workers send them the step's pushes again, and the job
// goes on from there.
TEST_F(ReplicationTest, SyncJobLosesAPrimaryForGoodAndEndsExactly) {
  const std::string spec = MakeSpec(2, 2);
  const std::string params = dir_ + "/final.safetensors";
  StartCluster(spec, 2, 2, absl::StrCat(kSyncFlags, " --final_params_out=", params));
  ASSERT_TRUE(WaitForChiefStep(RandomStep(20, 150))) << AllLogs();
  const absl::Time killed = absl::Now();
  ps_[0]->Kill();
  EXPECT_EQ(WaitForWorkers(), (std::vector<int>{0, 0})) << AllLogs();
  std::cout << "killed ps/0; job finished " << absl::Now() - killed << " later" << std::endl;
  const std::string survivor = ReadFile(dir_ + "/ps-1.log");
  EXPECT_NE(survivor.find("takes over as the primary"), std::string::npos) << survivor;
  ExpectNoRollback();
  long step = 0;
  double accuracy = 0;
  ASSERT_TRUE(ParseFinal(ReadFile(dir_ + "/worker-0.log"), &step, &accuracy)) << AllLogs();
  EXPECT_EQ(step, 200);
  const double diff = MaxAbsDiff(params, Reference(kSyncFlags));
  EXPECT_EQ(diff, 0) << AllLogs();
}

// The same with 3 ps tasks of one stripe each (ps/1's shard's backup is on
// ps/2), Adam, moving averages and bfloat16 on the wire.
TEST_F(ReplicationTest, ThreePsTasksAdamAndBfloat16EndExactly) {
  const std::string spec = MakeSpec(3, 2);
  const std::string params = dir_ + "/final.safetensors";
  const std::string flags =
      "--sync_replicas --noshuffle --optimizer=adam --learning_rate=0.001 "
      "--moving_average_decay=0.99 --wire_dtype=bf16 --hidden_units=64 --batch_size=50 "
      "--log_every_steps=5 --train_steps=200 --ps_stripes=1";
  StartCluster(spec, 3, 2, absl::StrCat(flags, " --final_params_out=", params),
               "--ps_stripes=1");
  ASSERT_TRUE(WaitForChiefStep(RandomStep(20, 150))) << AllLogs();
  ps_[1]->Kill();
  EXPECT_EQ(WaitForWorkers(), (std::vector<int>{0, 0})) << AllLogs();
  const std::string survivor = ReadFile(dir_ + "/ps-2.log");
  EXPECT_NE(survivor.find("shard 1: this copy takes over as the primary"), std::string::npos)
      << survivor;
  ExpectNoRollback();
  EXPECT_EQ(MaxAbsDiff(params, Reference(flags, 3, "--ps_stripes=1")), 0) << AllLogs();
}

// ps/0 dies and is restarted, as a supervisor would: its copies join as the
// backups of ps/1's and are filled; then ps/1 dies for good, and ps/0's
// copies take every shard over.
TEST_F(ReplicationTest, ARestartedTaskRejoinsAndThenTheOtherPrimaryDies) {
  const std::string spec = MakeSpec(2, 2);
  const std::string params = dir_ + "/final.safetensors";
  const std::string flags = absl::StrCat(kSyncFlags, " --train_steps=1200");
  StartCluster(spec, 2, 2, absl::StrCat(flags, " --final_params_out=", params));
  ASSERT_TRUE(WaitForChiefStep(RandomStep(20, 300))) << AllLogs();
  ps_[0]->Kill();
  const long first_kill = ChiefStep();
  ps_[0]->Start();
  // Filled from ps/1: the backup of its shards 0 and 1 is ps/0's restarted
  // process now, and so is that of ps/1's own shards 2 and 3 (filled a
  // second time: the first was at the start).
  const std::string survivor = dir_ + "/ps-1.log";
  ASSERT_TRUE(WaitForLog(survivor, "shard 0: backup ps/0 stripe 0 filled")) << AllLogs();
  ASSERT_TRUE(WaitForLog(survivor, "shard 1: backup ps/0 stripe 1 filled")) << AllLogs();
  ASSERT_TRUE(WaitForLog(survivor, "shard 2: backup ps/0 stripe 2 filled", 2)) << AllLogs();
  ASSERT_TRUE(WaitForLog(survivor, "shard 3: backup ps/0 stripe 3 filled", 2)) << AllLogs();
  const long second_kill = ChiefStep() + 20;
  ASSERT_TRUE(WaitForChiefStep(second_kill)) << AllLogs();
  ASSERT_LT(second_kill, 1150) << "the job ended before the second kill";
  ps_[1]->Kill();
  std::cout << "killed ps/0 at step " << first_kill << " (restarted), ps/1 at step "
            << second_kill << std::endl;
  EXPECT_EQ(WaitForWorkers(), (std::vector<int>{0, 0})) << AllLogs();
  const std::string ps0 = ReadFile(dir_ + "/ps-0.log");
  EXPECT_NE(ps0.find("rejoins as the backup"), std::string::npos) << ps0;
  for (int shard = 0; shard < 4; ++shard) {
    EXPECT_NE(ps0.find(absl::StrCat("shard ", shard, ": this copy takes over as the primary")),
              std::string::npos)
        << ps0;
  }
  ExpectNoRollback();
  EXPECT_EQ(MaxAbsDiff(params, Reference(flags)), 0) << AllLogs();
}

// Async: every push the workers were told was taken is applied once, on the
// copy that survives, whatever the kill interrupted. Over gRPC (the other
// tests' tensors take the data plane).
TEST_F(ReplicationTest, AsyncJobLosesAPrimaryAndNoPushIsLostOrDoubled) {
  const std::string spec = MakeSpec(2, 2);
  StartCluster(spec, 2, 2, kAsyncFlags, "--tensor_transport=grpc");
  ASSERT_TRUE(WaitForChiefStep(RandomStep(20, 200))) << AllLogs();
  ps_[0]->Kill();
  EXPECT_EQ(WaitForWorkers(), (std::vector<int>{0, 0})) << AllLogs();
  EXPECT_EQ(ps_[1]->Wait(absl::Seconds(60)), 0) << AllLogs();
  ExpectNoRollback();
  // Pushes the shards took: every worker's steps but those refused after the
  // chief had ended training.
  static const std::regex kFinished(R"(finished: (\d+) local steps, global step \d+, (\d+) stale)");
  long taken = 0, refused = 0;
  for (int i = 0; i < 2; ++i) {
    std::smatch m;
    const std::string log = ReadFile(absl::StrCat(dir_, "/worker-", i, ".log"));
    ASSERT_TRUE(std::regex_search(log, m, kFinished)) << log;
    taken += std::stol(m[1]) - std::stol(m[2]);
    refused += std::stol(m[2]);
  }
  // ps/1 holds all four shards as their primary: each applied every push
  // once. A push that met the end of training counts as refused when any
  // shard refused it, though the shards that ended later took it: so each
  // shard took between `taken` and `taken + refused`.
  std::smatch m;
  const std::string survivor = ReadFile(dir_ + "/ps-1.log");
  ASSERT_TRUE(std::regex_search(survivor, m, std::regex(R"(primaries=(\S+))"))) << survivor;
  const std::string primaries = m[1].str();
  static const std::regex kShard(R"((\d+):(\d+))");
  int shards = 0;
  for (auto it = std::sregex_iterator(primaries.begin(), primaries.end(), kShard);
       it != std::sregex_iterator(); ++it, ++shards) {
    const long applied = std::stol((*it)[2]);
    EXPECT_GE(applied, taken) << "shard " << (*it)[1] << ": " << primaries;
    EXPECT_LE(applied, taken + refused) << "shard " << (*it)[1] << ": " << primaries;
  }
  EXPECT_EQ(shards, 4) << primaries;
}

// A shard's two copies die together: nothing but a checkpoint holds it, and
// the job takes the checkpoint path (every shard back to one step) and still
// ends exactly.
TEST_F(ReplicationTest, BothCopiesLostFallBackToTheCheckpoint) {
  const std::string spec = MakeSpec(2, 2);
  const std::string params = dir_ + "/final.safetensors";
  for (int k = 0; k < 2; ++k) {
    ps_.push_back(std::make_unique<TaskProcess>(
        absl::StrCat(bin_, "/psrt_ps --cluster_spec=", spec, " --job_name=ps --task_index=", k,
                     " --ps_replicas=1 --checkpoint_dir=", dir_, "/ckpt"),
        absl::StrCat(dir_, "/ps-", k, ".log")));
    ps_.back()->Start();
  }
  const std::string flags = absl::StrCat(kSyncFlags, " --save_checkpoint_steps=25");
  for (int i = 0; i < 2; ++i) {
    workers_.push_back(std::make_unique<TaskProcess>(
        absl::StrCat(bin_, "/psrt_worker --cluster_spec=", spec, " --job_name=worker --task_index=",
                     i, " --ps_replicas=1 ", flags, " --final_params_out=", params),
        absl::StrCat(dir_, "/worker-", i, ".log")));
    workers_.back()->Start();
  }
  ASSERT_TRUE(WaitForChiefStep(RandomStep(30, 150))) << AllLogs();
  ps_[0]->Kill();
  ps_[1]->Kill();
  absl::SleepFor(absl::Seconds(1));
  ps_[0]->Start();
  ps_[1]->Start();
  EXPECT_EQ(WaitForWorkers(), (std::vector<int>{0, 0})) << AllLogs();
  const std::string chief = ReadFile(dir_ + "/worker-0.log");
  // The checkpoint path: every ps restored the same checkpoint, or (one
  // had saved a newer one before the kill) the chief brought them all to
  // the newest they all hold.
  EXPECT_TRUE(chief.find("every parameter server restored checkpoint") != std::string::npos ||
              chief.find("all of them now hold checkpoint") != std::string::npos)
      << chief;
  EXPECT_TRUE(std::regex_search(chief, std::regex(R"(carrying on at global step \d+ \(\d+ steps rolled back\))")))
      << chief;
  EXPECT_EQ(MaxAbsDiff(params, Reference(kSyncFlags)), 0) << AllLogs();
}

// launch.sh with --ps_replicas=1 among --ps_flags and no restarts: a ps task
// killed for good does not fail the job, which ends exactly.
TEST_F(ReplicationTest, TheLauncherCarriesOnWithoutALostPsTask) {
  const std::string spec = MakeSpec(2, 2);
  const std::string params = dir_ + "/final.safetensors";
  const std::string logs = dir_ + "/launched";
  RunCommand(absl::StrCat("(PSRT_BIN_DIR=", bin_, " timeout 300 ", source_,
                          "/scripts/launch.sh --cluster_spec ", spec, " --logdir ", logs,
                          " --ps_flags --ps_replicas=1 -- --ps_replicas=1 ", kSyncFlags,
                          " --final_params_out=", params, " > ", dir_,
                          "/launch.out 2>&1; echo $? > ", dir_, "/launch.rc) > /dev/null 2>&1 &"));
  const long at = RandomStep(20, 150);
  const absl::Time give_up = absl::Now() + absl::Seconds(90);
  std::smatch m;
  static const std::regex kStep(R"(step (\d+), loss)");
  long step = -1;
  while (step < at && absl::Now() < give_up) {
    const std::string log = ReadFile(logs + "/worker-0.log");
    for (auto it = std::sregex_iterator(log.begin(), log.end(), kStep);
         it != std::sregex_iterator(); ++it) {
      step = std::stol((*it)[1]);
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  const std::string out = ReadFile(dir_ + "/launch.out");
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(started ps/0 on \S+ \(pid (\d+))")))
      << out;
  RunCommand(absl::StrCat("kill -9 ", m[1].str()));
  ASSERT_TRUE(WaitForLog(dir_ + "/launch.rc", "\n", 1, absl::Seconds(120)))
      << ReadFile(dir_ + "/launch.out");
  EXPECT_EQ(ReadFile(dir_ + "/launch.rc"), "0\n") << ReadFile(dir_ + "/launch.out");
  const std::string summary = ReadFile(dir_ + "/launch.out");
  EXPECT_NE(summary.find("the backups of its shards serve them"), std::string::npos) << summary;
  EXPECT_NE(summary.find("lost (exit code 137"), std::string::npos) << summary;
  const std::string chief = ReadFile(logs + "/worker-0.log");
  EXPECT_EQ(chief.find("carrying on at global step"), std::string::npos) << chief;
  EXPECT_EQ(MaxAbsDiff(params, Reference(kSyncFlags)), 0) << summary;
}

TEST_F(ReplicationTest, WorkersAndPsTasksMustAgreeOnReplicas) {
  const std::string spec = MakeSpec(2, 1);
  for (int k = 0; k < 2; ++k) {
    ps_.push_back(std::make_unique<TaskProcess>(
        absl::StrCat(bin_, "/psrt_ps --cluster_spec=", spec, " --job_name=ps --task_index=", k),
        absl::StrCat(dir_, "/ps-", k, ".log")));
    ps_.back()->Start();
  }
  CommandResult worker = RunCommand(absl::StrCat(
      bin_, "/psrt_worker --cluster_spec=", spec,
      " --job_name=worker --task_index=0 --ps_replicas=1 --train_steps=10"));
  EXPECT_NE(worker.exit_code, 0);
  EXPECT_NE(worker.output.find("runs with --ps_replicas=0, but this task was started with "
                               "--ps_replicas=1"),
            std::string::npos)
      << worker.output;
  // One ps task has nowhere to keep a backup.
  CommandResult alone = RunCommand(absl::StrCat(bin_, "/psrt_ps --cluster_spec=",
                                                MakeSpec(1, 1, "one.json"),
                                                " --job_name=ps --task_index=0 --ps_replicas=1"));
  EXPECT_EQ(alone.exit_code, 2);
  EXPECT_NE(alone.output.find("give it 2 or more"), std::string::npos) << alone.output;
}

}  // namespace
}  // namespace psrt
