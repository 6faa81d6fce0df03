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
  // checkpoint directory.
  void StartCluster(const std::string& spec, int ps, int workers, const std::string& flags) {
    for (int k = 0; k < ps; ++k) {
      ps_.push_back(std::make_unique<TaskProcess>(
          absl::StrCat(bin_, "/psrt_ps --cluster_spec=", spec, " --job_name=ps --task_index=",
                       k, " --ps_replicas=1"),
          absl::StrCat(dir_, "/ps-", k, ".log")));
      ps_.back()->Start();
    }
    for (int i = 0; i < workers; ++i) {
      workers_.push_back(std::make_unique<TaskProcess>(
          absl::StrCat(bin_, "/psrt_worker --cluster_spec=", spec,
                       " --job_name=worker --task_index=", i, " --ps_replicas=1 ", flags),
          absl::StrCat(dir_, "/worker-", i, ".log")));
      workers_.back()->Start();
    }
  }

  // The last "step N, loss" the chief logged; -1 before the first.
  long ChiefStep() {
    static const std::regex kStep(R"(step (\d+), loss)");
    const std::string log = ReadFile(dir_ + "/worker-0.log");
    long step = -1;
    for (auto it = std::sregex_iterator(log.begin(), log.end(), kStep);
         it != std::sregex_iterator(); ++it) {
      step = std::stol((*it)[1]);
    }
    return step;
  }

  bool WaitForChiefStep(long step, absl::Duration timeout = absl::Seconds(90)) {
    const absl::Time give_up = absl::Now() + timeout;
    while (ChiefStep() < step) {
      if (absl::Now() >= give_up) return false;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return true;
  }

  // Waits until `log` holds `text`; false after `timeout`.
  bool WaitForLog(const std::string& log, const std::string& text,
                  absl::Duration timeout = absl::Seconds(60)) {
    const absl::Time give_up = absl::Now() + timeout;
    while (ReadFile(log).find(text) == std::string::npos) {
      if (absl::Now() >= give_up) return false;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return true;
  }

  static long RandomStep(long low, long high) {
    std::random_device device;
    const long step = std::uniform_int_distribution<long>(low, high - 1)(device);
    std::cout << "fault injected at step " << step << std::endl;
    return step;
  }

  std::vector<int> WaitForWorkers(absl::Duration timeout = absl::Seconds(180)) {
    std::vector<int> codes;
    for (auto& w : workers_) codes.push_back(w->Wait(timeout));
    return codes;
  }

  std::string AllLogs() {
    std::string all;
    for (const auto& tasks : {&ps_, &workers_}) {
      for (const auto& t : *tasks) all += "\n==> " + t->log() + "\n" + ReadFile(t->log());
    }
    return all;
  }

  // No worker rolled back: nobody recovered from a checkpoint.
  void ExpectNoRollback() {
    for (int i = 0; i < static_cast<int>(workers_.size()); ++i) {
      const std::string log = ReadFile(absl::StrCat(dir_, "/worker-", i, ".log"));
      EXPECT_EQ(log.find("carrying on at global step"), std::string::npos) << log;
      EXPECT_EQ(log.find("recovered in"), std::string::npos) << log;
    }
  }

  // The undisturbed run's final parameters (launch.sh, no replicas).
  std::string Reference(const std::string& flags) {
    const std::string out = dir_ + "/reference.safetensors";
    CommandResult r = Launch(MakeSpec(2, 2, "reference.json"), dir_ + "/reference",
                             absl::StrCat(flags, " --final_params_out=", out));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return out;
  }

  std::vector<std::unique_ptr<TaskProcess>> ps_, workers_;
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

}  // namespace
}  // namespace psrt
