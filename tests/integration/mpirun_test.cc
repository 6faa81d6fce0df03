// Jobs through OpenMPI's mpirun, as Horovod's users launch them: the ranks
// run psrt_worker (and psrt_ps, for a ps job) with no cluster spec, and meet
// at a rendezvous (common/rendezvous.h) from mpirun's OMPI_COMM_WORLD_* ranks.
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/free_port.h"
#include "tests/integration/cluster_fixture.h"

namespace psrt {
namespace {

class MpirunTest : public ClusterFixture {
 protected:
  void SetUp() override {
    ClusterFixture::SetUp();
    if (IsSkipped()) return;
    if (RunCommand("command -v mpirun").exit_code != 0) {
      GTEST_SKIP() << "mpirun not found: scripts/setup.sh installs OpenMPI (openmpi-bin)";
    }
  }
  // mpirun (as root, more ranks than cores) of `apps` ("-np 2 PROGRAM FLAGS",
  // or several joined by " : "), in which FLAGS the rendezvous's flags.
  CommandResult Mpirun(const std::string& apps) {
    return RunCommand(
        absl::StrCat("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 mpirun "
                     "--oversubscribe ",
                     apps, " 2>&1"));
  }
  // The rendezvous's flags, alike in every app of a run: rank 0 serves it on
  // a free port, the ranks serve on 127.0.0.1 at the next ones (a port plus
  // the rank on the host, as every rank here runs on this host).
  std::string RendezvousFlags() {
    if (rendezvous_flags_.empty()) {
      const int base = FreePortRun(1 + kMaxRanks);
      rendezvous_flags_ = absl::StrCat("--coordinator=127.0.0.1:", base,
                                       " --advertise_host=127.0.0.1 --task_port=", base + 1);
    }
    return rendezvous_flags_;
  }
  static constexpr int kMaxRanks = 3;
  // mpirun of `ranks` psrt_worker processes with `flags`.
  CommandResult MpirunWorkers(int ranks, const std::string& flags) {
    return Mpirun(
        absl::StrCat("-np ", ranks, " ", bin_, "/psrt_worker ", RendezvousFlags(), " ", flags));
  }

 private:
  std::string rendezvous_flags_;
};

TEST_F(MpirunTest, AnAllreduceJobOfThreeRanksTrainsToItsFinalLine) {
  CommandResult r = MpirunWorkers(3, "--train_steps=100 --learning_rate=0.1 --log_every_steps=50");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rendezvous: rank 0 waits for 2 ranks"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("worker/2 is worker 2 of 3 (allreduce mode"), std::string::npos)
      << r.output;
  long step = 0;
  double accuracy = 0;
  ASSERT_TRUE(ParseFinal(r.output, &step, &accuracy)) << r.output;
  EXPECT_EQ(step, 100);
}

// A ps job as MPI runs programs of two kinds (MPMD): rank 0 runs psrt_ps,
// ranks 1 and 2 psrt_worker, all told --num_ps=1.
TEST_F(MpirunTest, APsJobRunsThePsAndTheWorkersAsTwoApps) {
  const std::string flags = RendezvousFlags() + " --num_ps=1";
  CommandResult r = Mpirun(
      absl::StrCat("-np 1 ", bin_, "/psrt_ps ", flags, " : -np 2 ", bin_, "/psrt_worker ", flags,
                   " --sync_replicas --train_steps=100 --learning_rate=0.1 --log_every_steps=50"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ps/0 serving on 127.0.0.1:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("worker/1 is replica 1 of 2 (sync), 1 parameter servers"),
            std::string::npos)
      << r.output;
  long step = 0;
  double accuracy = 0;
  ASSERT_TRUE(ParseFinal(r.output, &step, &accuracy)) << r.output;
  EXPECT_EQ(step, 100);
  EXPECT_GT(accuracy, 0.7);
}

// psrt_worker at a ps rank: every rank is told which program the rank needs.
TEST_F(MpirunTest, AWorkerProgramAtAPsRankIsRefusedNamingTheTask) {
  CommandResult r = MpirunWorkers(3, "--num_ps=1 --sync_replicas --train_steps=10");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("this task is ps/0 (use psrt_ps for ps tasks)"), std::string::npos)
      << r.output;
}

// Two ranks where three are expected: every rank fails within the
// rendezvous's deadline, naming the rank that never came.
TEST_F(MpirunTest, AMissingRankIsNamedWithinTheDeadline) {
  const absl::Time start = absl::Now();
  CommandResult r = MpirunWorkers(2, "--num_tasks=3 --rendezvous_timeout_secs=3 --train_steps=10");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(absl::Now() - start, absl::Seconds(60));
  EXPECT_NE(r.output.find("rank 2 of 3 did not register within 3s"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace psrt
