// Jobs through OpenMPI's mpirun, as Horovod's users launch them: every rank
// runs psrt_worker with no cluster spec, and the workers meet at a
// rendezvous (common/rendezvous.h) from mpirun's OMPI_COMM_WORLD_* ranks.
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
  // mpirun (as root, more ranks than cores) of psrt_worker with `flags`, its
  // ranks serving on 127.0.0.1.
  CommandResult Mpirun(int ranks, const std::string& flags) {
    return RunCommand(absl::StrCat(
        "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 mpirun "
        "--oversubscribe -np ", ranks, " ", bin_, "/psrt_worker --coordinator=127.0.0.1:",
        FreePort(), " --advertise_host=127.0.0.1 --task_port=", FreePort(), " ", flags,
        " 2>&1"));
  }
};

TEST_F(MpirunTest, AnAllreduceJobOfThreeRanksTrainsToItsFinalLine) {
  CommandResult r = Mpirun(3, "--train_steps=100 --learning_rate=0.1 --log_every_steps=50");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rendezvous: rank 0 waits for 2 ranks"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("worker/2 is worker 2 of 3 (allreduce mode"), std::string::npos)
      << r.output;
  long step = 0;
  double accuracy = 0;
  ASSERT_TRUE(ParseFinal(r.output, &step, &accuracy)) << r.output;
  EXPECT_EQ(step, 100);
}

// Two ranks where three are expected: every rank fails within the
// rendezvous's deadline, naming the rank that never came.
TEST_F(MpirunTest, AMissingRankIsNamedWithinTheDeadline) {
  const absl::Time start = absl::Now();
  CommandResult r = Mpirun(2, "--num_tasks=3 --rendezvous_timeout_secs=3 --train_steps=10");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(absl::Now() - start, absl::Seconds(60));
  EXPECT_NE(r.output.find("rank 2 of 3 did not register within 3s"), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace psrt
