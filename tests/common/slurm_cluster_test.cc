#include "common/rank_cluster.h"
#include "common/slurm_cluster.h"

#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace psrt {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Hosts(const std::string& list) {
  absl::StatusOr<std::vector<std::string>> hosts = ExpandSlurmHostlist(list);
  EXPECT_TRUE(hosts.ok()) << hosts.status();
  return hosts.ok() ? *hosts : std::vector<std::string>();
}

std::string HostlistError(const std::string& list) {
  absl::StatusOr<std::vector<std::string>> hosts = ExpandSlurmHostlist(list);
  EXPECT_FALSE(hosts.ok()) << list;
  EXPECT_EQ(hosts.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(hosts.status().message());
}

TEST(SlurmHostlistTest, ExpandsNamesRangesAndPadding) {
  EXPECT_THAT(Hosts("n3"), ElementsAre("n3"));
  EXPECT_THAT(Hosts("gpu[01-04,07],n3"),
              ElementsAre("gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "n3"));
  EXPECT_THAT(Hosts("n[8-10]"), ElementsAre("n8", "n9", "n10"));
  EXPECT_THAT(Hosts("n[08-10]"), ElementsAre("n08", "n09", "n10"));
  EXPECT_THAT(Hosts("r[1-2]-n[01-02].cluster"),
              ElementsAre("r1-n01.cluster", "r1-n02.cluster", "r2-n01.cluster",
                          "r2-n02.cluster"));
  EXPECT_THAT(Hosts("a,b[5],c_1"), ElementsAre("a", "b5", "c_1"));
}

TEST(SlurmHostlistTest, MalformedListsAreNamed) {
  EXPECT_THAT(HostlistError("n[1-3"), HasSubstr("\"n[1-3\": unclosed '['"));
  EXPECT_THAT(HostlistError("n1-3]"), HasSubstr("']' without '['"));
  EXPECT_THAT(HostlistError("n[[1]]"), HasSubstr("nested '['"));
  EXPECT_THAT(HostlistError("n[3-1]"), HasSubstr("range \"3-1\" runs backwards"));
  EXPECT_THAT(HostlistError("n[a-b]"), HasSubstr("bad range \"a-b\""));
  EXPECT_THAT(HostlistError("n[1-]"), HasSubstr("bad range \"1-\""));
  EXPECT_THAT(HostlistError("n[]"), HasSubstr("bad range \"\""));
  EXPECT_THAT(HostlistError("a,,b"), HasSubstr("empty host name"));
  EXPECT_THAT(HostlistError(""), HasSubstr("empty host name"));
  EXPECT_THAT(HostlistError("n 1"), HasSubstr("unexpected character ' '"));
  EXPECT_THAT(HostlistError("n\"1"), HasSubstr("unexpected character '\"'"));
  EXPECT_THAT(HostlistError("n[1-99999999]"), HasSubstr("more than 65536 hosts"));
  EXPECT_THAT(HostlistError("a[1-300]b[1-300]"), HasSubstr("more than 65536 hosts"));
}

TEST(SlurmTasksPerNodeTest, ExpandsCountsAndRepeats) {
  EXPECT_THAT(*ExpandSlurmTasksPerNode("2(x3),1"), ElementsAre(2, 2, 2, 1));
  EXPECT_THAT(*ExpandSlurmTasksPerNode("4"), ElementsAre(4));
  EXPECT_THAT(*ExpandSlurmTasksPerNode("1,3(x2)"), ElementsAre(1, 3, 3));
  for (const char* bad : {"", "0", "2(x0)", "2(3)", "2(x3", "x", "2,,1", "1(x99999999)"}) {
    absl::StatusOr<std::vector<int>> counts = ExpandSlurmTasksPerNode(bad);
    ASSERT_FALSE(counts.ok()) << bad;
    EXPECT_THAT(std::string(counts.status().message()),
                HasSubstr(absl::StrCat("\"", bad, "\"")));
  }
}

class SlurmClusterTest : public ::testing::Test {
 protected:
  // Slurm's variables of a 3-node step of 2, 1 and 2 tasks.
  std::map<std::string, std::string> env_ = {
      {"SLURM_STEP_NODELIST", "n[1-3]"},
      {"SLURM_STEP_TASKS_PER_NODE", "2,1,2"},
      {"SLURM_STEP_NUM_TASKS", "5"},
      {"SLURM_PROCID", "0"},
      {"SLURM_LOCALID", "0"},
  };
  absl::StatusOr<ClusterConfig> Resolve(int num_ps, int base_port = 2222) {
    SlurmClusterOptions options;
    options.num_ps = num_ps;
    options.base_port = base_port;
    return ClusterFromSlurm(
        [this](const char* name) {
          auto it = env_.find(name);
          return it == env_.end() ? nullptr : it->second.c_str();
        },
        options);
  }
  std::string Error(int num_ps) {
    absl::StatusOr<ClusterConfig> config = Resolve(num_ps);
    EXPECT_FALSE(config.ok());
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(config.status().message());
  }
};

TEST_F(SlurmClusterTest, RanksGoNodeByNodeAndRolesByRank) {
  absl::StatusOr<ClusterConfig> config = Resolve(/*num_ps=*/2);
  ASSERT_TRUE(config.ok()) << config.status();
  const auto& jobs = config->spec.jobs();
  EXPECT_THAT(jobs.at("ps"), ElementsAre("n1:2222", "n1:2223"));
  EXPECT_THAT(jobs.at("worker"), ElementsAre("n2:2222", "n3:2222", "n3:2223"));
  EXPECT_EQ(config->task.ToString(), "ps/0");

  env_["SLURM_PROCID"] = "4";
  env_["SLURM_LOCALID"] = "1";
  config = Resolve(2, 3000);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->task.ToString(), "worker/2");
  EXPECT_EQ(config->spec.address("worker", 2), "n3:3001");
  EXPECT_EQ(config->spec.ReplicaIndex(config->task), 2);

  // No ps tasks: an allreduce job of every rank.
  config = Resolve(0);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->spec.num_ps(), 0);
  EXPECT_EQ(config->spec.num_replicas(), 5);
  EXPECT_EQ(config->task.ToString(), "worker/4");
}

// sbatch's default: one task per node in turn, while a node has room.
TEST_F(SlurmClusterTest, CyclicRanksGoOnePerNodeInTurn) {
  env_["SLURM_DISTRIBUTION"] = "cyclic:cyclic";
  env_["SLURM_PROCID"] = "3";
  env_["SLURM_LOCALID"] = "1";
  absl::StatusOr<ClusterConfig> config = Resolve(/*num_ps=*/1);
  ASSERT_TRUE(config.ok()) << config.status();
  // Ranks 0, 1, 2 on n1, n2, n3; then 3 on n1 and 4 on n3 (n2 holds one).
  EXPECT_THAT(config->spec.jobs().at("ps"), ElementsAre("n1:2222"));
  EXPECT_THAT(config->spec.jobs().at("worker"),
              ElementsAre("n2:2222", "n3:2222", "n1:2223", "n3:2223"));
  EXPECT_EQ(config->task.ToString(), "worker/2");
}

TEST_F(SlurmClusterTest, TheTfConfigReadsBackAsTheSameCluster) {
  env_["SLURM_PROCID"] = "2";
  env_["SLURM_LOCALID"] = "0";
  absl::StatusOr<ClusterConfig> config = Resolve(1);
  ASSERT_TRUE(config.ok()) << config.status();
  const std::string tf_config = ToTfConfig(*config);
  absl::StatusOr<ClusterConfig> back = ResolveClusterConfig("", tf_config, "", 0);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << tf_config;
  EXPECT_EQ(back->spec.jobs(), config->spec.jobs());
  EXPECT_EQ(back->task.ToString(), "worker/1");
}

// A batch script (psrt_task.sh run without srun) has the job's variables and
// SLURM_PROCID=0 but no step: it is told so instead of becoming ps/0.
TEST_F(SlurmClusterTest, TheJobsVariablesAloneAreNoStep) {
  env_.erase("SLURM_STEP_NODELIST");
  env_.erase("SLURM_STEP_TASKS_PER_NODE");
  env_.erase("SLURM_STEP_NUM_TASKS");
  env_["SLURM_JOB_NODELIST"] = "n[1-3]";
  env_["SLURM_TASKS_PER_NODE"] = "2,1,2";
  env_["SLURM_NTASKS"] = "5";
  env_["SLURM_PROCID"] = "0";
  EXPECT_THAT(Error(1), HasSubstr("SLURM_STEP_NODELIST is not set: is this task started by "
                                  "srun"));
}

TEST_F(SlurmClusterTest, MissingOrInconsistentVariablesAreNamed) {
  env_.erase("SLURM_PROCID");
  EXPECT_THAT(Error(1), HasSubstr("SLURM_PROCID is not set: is this task started by srun"));
  env_["SLURM_PROCID"] = "five";
  EXPECT_THAT(Error(1), HasSubstr("SLURM_PROCID=\"five\" is not a whole number"));
  env_["SLURM_PROCID"] = "5";
  EXPECT_THAT(Error(1), HasSubstr("SLURM_PROCID=5 is out of range: the step has 5 tasks"));
  env_["SLURM_PROCID"] = "1";
  EXPECT_THAT(Error(1), HasSubstr("SLURM_LOCALID=0, but rank 1 is task 1 of its node"));
  env_["SLURM_LOCALID"] = "1";
  EXPECT_THAT(Error(5), HasSubstr("--ps=5 leaves no worker among the step's 5 tasks"));
  env_["SLURM_STEP_NUM_TASKS"] = "6";
  EXPECT_THAT(Error(1), HasSubstr("SLURM_STEP_NUM_TASKS=6 but SLURM_STEP_TASKS_PER_NODE=\"2,1,2\" "
                                  "adds up to 5"));
  env_["SLURM_STEP_NUM_TASKS"] = "5";
  env_["SLURM_STEP_TASKS_PER_NODE"] = "2,3";
  EXPECT_THAT(Error(1), HasSubstr("names 3 nodes but SLURM_STEP_TASKS_PER_NODE=\"2,3\" counts 2"));
  env_["SLURM_STEP_TASKS_PER_NODE"] = "2,1,2";
  env_["SLURM_DISTRIBUTION"] = "plane=2";
  EXPECT_THAT(Error(1), HasSubstr("SLURM_DISTRIBUTION=plane=2: psrt knows the block and "
                                  "cyclic layouts only"));
  env_["SLURM_DISTRIBUTION"] = "cyclic";  // Rank 1 is on n2 then.
  EXPECT_THAT(Error(1), HasSubstr("SLURM_LOCALID=1, but rank 1 is task 0 of its node in the "
                                  "cyclic layout"));
  env_["SLURM_DISTRIBUTION"] = "block:cyclic";
  EXPECT_TRUE(Resolve(1).ok());
  env_["SLURM_STEP_NODELIST"] = "n[1-3";
  EXPECT_THAT(Error(1), HasSubstr("Slurm hostlist \"n[1-3\": unclosed '['"));
  env_.erase("SLURM_STEP_NODELIST");
  EXPECT_THAT(Error(1), HasSubstr("SLURM_STEP_NODELIST is not set"));
}

TEST_F(SlurmClusterTest, PortsPastTheRangeAreRefused) {
  absl::StatusOr<ClusterConfig> config = Resolve(1, 65535);
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(std::string(config.status().message()),
              HasSubstr("--base_port=65535 + local rank 1 is not a port"));
}

}  // namespace
}  // namespace psrt
