// Fault tests with real clusters on 127.0.0.1: kill -9 a parameter server or
// a worker at a random step of a running job, start it again as a
// supervisor would, and check that the job finishes where an undisturbed run
// finishes; and that a job whose worker dies for good fails with a message
// instead of hanging, unless backup workers cover for it.
#include <filesystem>
#include <memory>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"

namespace psrt {
namespace {

constexpr char kSyncFlags[] =
    "--sync_replicas --noshuffle --optimizer=momentum --learning_rate=0.02 "
    "--hidden_units=64 --batch_size=50 --save_checkpoint_steps=25 --log_every_steps=5";
// Async runs differ from one another; evaluating the moving averages makes
// their final accuracy steady (5 undisturbed runs: 0.8379 to 0.8401).
constexpr char kAsyncFlags[] =
    "--optimizer=sgd --learning_rate=0.1 --hidden_units=128 --batch_size=100 "
    "--moving_average_decay=0.99 --eval_moving_average "
    "--save_checkpoint_steps=50 --log_every_steps=10";

class RecoveryTest : public ClusterFixture {
 protected:
  // Starts every task of `spec` by hand: ps tasks with a checkpoint dir,
  // workers with `worker_flags`.
  void StartCluster(const std::string& spec, int ps, int workers,
                    const std::string& worker_flags, const std::string& ps_flags = "") {
    for (int k = 0; k < ps; ++k) {
      ps_.push_back(std::make_unique<TaskProcess>(
          absl::StrCat(bin_, "/psrt_ps --cluster_spec=", spec, " --job_name=ps --task_index=",
                       k, " --checkpoint_dir=", dir_, "/ckpt ", ps_flags),
          absl::StrCat(dir_, "/ps-", k, ".log")));
      ps_.back()->Start();
    }
    for (int i = 0; i < workers; ++i) {
      workers_.push_back(std::make_unique<TaskProcess>(
          absl::StrCat(bin_, "/psrt_worker --cluster_spec=", spec,
                       " --job_name=worker --task_index=", i, " ", worker_flags),
          absl::StrCat(dir_, "/worker-", i, ".log")));
      workers_.back()->Start();
    }
  }

  // Every checkpoint file on disk reads back with a valid checksum.
  void ExpectEveryCheckpointLoads() {
    int files = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir_ + "/ckpt")) {
      if (entry.path().extension() != ".safetensors") continue;
      ++files;
      auto loaded = ReadSafetensors(entry.path().string());
      EXPECT_TRUE(loaded.ok()) << entry.path() << ": " << loaded.status();
    }
    EXPECT_GT(files, 0);
  }

  // An undisturbed run with launch.sh; returns the chief's final accuracy.
  double Reference(const std::string& spec, const std::string& flags,
                   const std::string& params_out) {
    CommandResult r = Launch(spec, dir_ + "/reference",
                             absl::StrCat(flags, " --final_params_out=", params_out));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    long step = 0;
    double accuracy = -1;
    EXPECT_TRUE(ParseFinal(ReadFile(dir_ + "/reference/worker-0.log"), &step, &accuracy));
    return accuracy;
  }

  // One line for the record: where the fault hit, where training went back
  // to, how long the chief took to recover, and the accuracies.
  void Report(const std::string& scenario, long fault_step, double accuracy,
              double reference_accuracy) {
    const std::string chief = ReadFile(dir_ + "/worker-0.log");
    std::smatch m;
    static const std::regex kRecovered(R"(carrying on at global step (\d+))");
    std::cout << "recovery: " << scenario << ": killed once the chief had logged step "
              << fault_step;
    if (std::regex_search(chief, m, kRecovered)) {
      std::cout << "; training resumed at step " << m[1] << ", "
                << absl::ToDoubleSeconds(back_to_training_) << " s after the kill";
    }
    std::cout << "; final accuracy " << accuracy << " (undisturbed " << reference_accuracy
              << ")" << std::endl;
  }

  // Restarts `task` after a supervisor's backoff of 1 s, and records how long
  // after `killed` the chief was training again.
  void RestartAndTime(TaskProcess* task, absl::Time killed) {
    absl::SleepFor(absl::Seconds(1));
    task->Start();
    for (int i = 0; i < 600; ++i) {
      if (ReadFile(dir_ + "/worker-0.log").find("carrying on at global step") !=
          std::string::npos) {
        back_to_training_ = absl::Now() - killed;
        return;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  }

  absl::Duration back_to_training_;

};

TEST_F(RecoveryTest, SyncJobSurvivesAPsKilledAtARandomStep) {
  const std::string spec = MakeSpec(2, 2);
  const std::string flags = absl::StrCat(kSyncFlags, " --train_steps=200");
  const std::string params = dir_ + "/final.safetensors";
  StartCluster(spec, 2, 2, absl::StrCat(flags, " --final_params_out=", params));
  const long fault_step = RandomStep(30, 150);
  ASSERT_TRUE(WaitForChiefStep(fault_step)) << AllLogs();
  const absl::Time killed = absl::Now();
  ps_[1]->Kill();
  RestartAndTime(ps_[1].get(), killed);
  EXPECT_EQ(WaitForWorkers(), (std::vector<int>{0, 0})) << AllLogs();
  std::cout << "killed ps/1; job finished " << absl::Now() - killed << " later" << std::endl;

  const std::string chief = ReadFile(dir_ + "/worker-0.log");
  // The chief saw the restarted shard (its new incarnation, or its
  // unconfirmed state) and rolled every shard back.
  EXPECT_TRUE(std::regex_search(
      chief, std::regex("restarted or was rolled back|waits for the chief to confirm")))
      << chief;
  EXPECT_NE(chief.find("all of them now hold checkpoint"), std::string::npos) << chief;
  EXPECT_NE(chief.find("recovered in"), std::string::npos) << chief;
  long step = 0;
  double accuracy = 0;
  ASSERT_TRUE(ParseFinal(chief, &step, &accuracy)) << chief;
  EXPECT_EQ(step, 200);
  ExpectEveryCheckpointLoads();

  // Sync training rolled back to a checkpoint and replayed the same data:
  // it ends exactly where an undisturbed run ends.
  const std::string reference = dir_ + "/reference.safetensors";
  const double reference_accuracy =
      Reference(MakeSpec(2, 2, "reference.json"), flags, reference);
  EXPECT_NEAR(accuracy, reference_accuracy, 0.01);
  Report("sync, 2 ps + 2 workers, kill -9 ps/1", fault_step, accuracy, reference_accuracy);
  const double diff = MaxAbsDiff(params, reference);
  EXPECT_GE(diff, 0);
  EXPECT_LE(diff, 1e-5);
}

// The sparse path: a DLRM job whose embedding rows live on the ps. The
// killed shard restores its rows with its dense variables, every shard
// rolls back to the same checkpoint, and the one sync worker replays the
// same lines: the job ends exactly as an undisturbed one.
TEST_F(RecoveryTest, CtrJobSurvivesAPsKilledAtARandomStep) {
  CommandResult data = RunCommand(absl::StrCat(
      bin_, "/psrt_make_criteo --out=", dir_, "/train.gz --rows=20000 --seed=1 && ", bin_,
      "/psrt_make_criteo --out=", dir_, "/test.gz --rows=2000 --seed=2"));
  ASSERT_EQ(data.exit_code, 0) << data.output;
  const std::string spec = MakeSpec(2, 1);
  const std::string flags = absl::StrCat(
      "--sync_replicas --model=dlrm --data_format=criteo --train_data=", dir_,
      "/train.gz --test_data=", dir_, "/test.gz --bottom_mlp=16 --top_mlp=16 --embedding_dim=8 ",
      "--optimizer=adagrad --learning_rate=0.1 --sparse_learning_rate=0.5 --batch_size=64 ",
      "--train_steps=200 --save_checkpoint_steps=25 --log_every_steps=5 --intra_op_threads=1");
  StartCluster(spec, 2, 1, flags);
  const long fault_step = RandomStep(30, 150);
  ASSERT_TRUE(WaitForChiefStep(fault_step)) << AllLogs();
  const absl::Time killed = absl::Now();
  ps_[1]->Kill();
  RestartAndTime(ps_[1].get(), killed);
  EXPECT_EQ(WaitForWorkers(), (std::vector<int>{0})) << AllLogs();
  const std::string chief = ReadFile(dir_ + "/worker-0.log");
  EXPECT_NE(chief.find("all of them now hold checkpoint"), std::string::npos) << chief;
  // The restarted ps read its rows back.
  EXPECT_NE(ReadFile(dir_ + "/ps-1.log").find("restored checkpoint"), std::string::npos)
      << ReadFile(dir_ + "/ps-1.log");
  ExpectEveryCheckpointLoads();
  std::smatch final_line;
  ASSERT_TRUE(std::regex_search(chief, final_line, std::regex("final: [^\n]*"))) << chief;

  CommandResult r = Launch(MakeSpec(2, 1, "reference.json"), dir_ + "/reference", flags);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string reference = ReadFile(dir_ + "/reference/worker-0.log");
  std::smatch reference_line;
  ASSERT_TRUE(std::regex_search(reference, reference_line, std::regex("final: [^\n]*")));
  EXPECT_EQ(final_line.str(), reference_line.str());
  std::cout << "recovery: ctr, 2 ps + 1 worker, kill -9 ps/1 once the chief had logged step "
            << fault_step << ": " << final_line.str() << " (undisturbed "
            << reference_line.str() << ")" << std::endl;
}

TEST_F(RecoveryTest, AsyncJobSurvivesAPsKilledAtARandomStep) {
  const std::string spec = MakeSpec(2, 2);
  const std::string flags = absl::StrCat(kAsyncFlags, " --train_steps=1000");
  StartCluster(spec, 2, 2, flags);
  const long fault_step = RandomStep(100, 400);
  ASSERT_TRUE(WaitForChiefStep(fault_step)) << AllLogs();
  const absl::Time killed = absl::Now();
  ps_[0]->Kill();
  RestartAndTime(ps_[0].get(), killed);
  EXPECT_EQ(WaitForWorkers(), (std::vector<int>{0, 0})) << AllLogs();

  const std::string chief = ReadFile(dir_ + "/worker-0.log");
  EXPECT_NE(chief.find("recovered in"), std::string::npos) << chief;
  long step = 0;
  double accuracy = 0;
  ASSERT_TRUE(ParseFinal(chief, &step, &accuracy)) << chief;
  EXPECT_GE(step, 1000);
  ExpectEveryCheckpointLoads();
  const double reference =
      Reference(MakeSpec(2, 2, "reference.json"), flags, dir_ + "/reference.safetensors");
  EXPECT_NEAR(accuracy, reference, 0.01);
  Report("async, 2 ps + 2 workers, kill -9 ps/0", fault_step, accuracy, reference);
}

TEST_F(RecoveryTest, RestartedWorkerRejoinsASyncJob) {
  const std::string spec = MakeSpec(1, 2);
  const std::string flags = absl::StrCat(kSyncFlags, " --train_steps=300");
  StartCluster(spec, 1, 2, flags);
  const long fault_step = RandomStep(30, 200);
  ASSERT_TRUE(WaitForChiefStep(fault_step)) << AllLogs();
  workers_[1]->Kill();
  absl::SleepFor(absl::Seconds(1));
  workers_[1]->Start();
  EXPECT_EQ(WaitForWorkers(), (std::vector<int>{0, 0})) << AllLogs();
  long step = 0;
  double accuracy = 0;
  ASSERT_TRUE(ParseFinal(ReadFile(dir_ + "/worker-0.log"), &step, &accuracy));
  EXPECT_EQ(step, 300);
  const double reference =
      Reference(MakeSpec(1, 2, "reference.json"), flags, dir_ + "/reference.safetensors");
  EXPECT_NEAR(accuracy, reference, 0.01);
  Report("sync, 1 ps + 2 workers, kill -9 worker/1 and restart it", fault_step, accuracy,
         reference);
}

TEST_F(RecoveryTest, DeadWorkerFailsASyncJobAtTheDeadlineInsteadOfHanging) {
  const std::string spec = MakeSpec(1, 2);
  StartCluster(spec, 1, 2,
               absl::StrCat(kSyncFlags, " --train_steps=100000 --pull_timeout_secs=4"),
               "--chief_timeout_secs=5");
  ASSERT_TRUE(WaitForChiefStep(20)) << AllLogs();
  workers_[1]->Kill();
  const absl::Time killed = absl::Now();
  EXPECT_EQ(workers_[0]->Wait(absl::Seconds(60)), 1) << AllLogs();
  EXPECT_LT(absl::Now() - killed, absl::Seconds(30));
  const std::string chief = ReadFile(dir_ + "/worker-0.log");
  EXPECT_NE(chief.find("none yet from replica(s) 1"), std::string::npos) << chief;
  // A failed chief does not end training (a supervisor would restart it);
  // with nobody to, the parameter server fails too once the chief has been
  // silent for --chief_timeout_secs, instead of waiting forever.
  EXPECT_EQ(ps_[0]->Wait(absl::Seconds(60)), 1) << AllLogs();
  EXPECT_NE(ReadFile(dir_ + "/ps-0.log").find("the chief failed and was not restarted"),
            std::string::npos)
      << AllLogs();
}

TEST_F(RecoveryTest, BackupWorkerCoversForADeadWorker) {
  const std::string spec = MakeSpec(1, 3);
  StartCluster(spec, 1, 3,
               absl::StrCat(kSyncFlags, " --replicas_to_aggregate=2 --train_steps=200 "
                                        "--pull_timeout_secs=90"));
  ASSERT_TRUE(WaitForChiefStep(RandomStep(20, 100))) << AllLogs();
  workers_[2]->Kill();
  const absl::Time killed = absl::Now();
  EXPECT_EQ(workers_[0]->Wait(absl::Seconds(60)), 0) << AllLogs();
  EXPECT_EQ(workers_[1]->Wait(absl::Seconds(60)), 0) << AllLogs();
  // Never waited for the dead worker (its pulls would time out after 90 s).
  EXPECT_LT(absl::Now() - killed, absl::Seconds(60));
  long step = 0;
  double accuracy = 0;
  ASSERT_TRUE(ParseFinal(ReadFile(dir_ + "/worker-0.log"), &step, &accuracy));
  EXPECT_EQ(step, 200);
}

}  // namespace
}  // namespace psrt
