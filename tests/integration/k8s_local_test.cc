// The Kubernetes manifests in deploy/, run locally by scripts/k8s_local.sh:
// the TF_CONFIG each pod gets (as Kubeflow's operator or deploy/entrypoint.sh
// writes it), and a short training run of the real binaries with exactly
// those values, addresses mapped to 127.0.0.1.
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"

namespace psrt {
namespace {

class K8sLocalTest : public ClusterFixture {
 protected:
  CommandResult K8sLocal(const std::string& args) {
    return RunCommand(absl::StrCat("PSRT_BIN_DIR=", bin_, " timeout 120 ", source_,
                                   "/scripts/k8s_local.sh ", args));
  }

  // Pod name -> {"in Kubernetes" TF_CONFIG, "here" TF_CONFIG}, from --render.
  static std::map<std::string, std::pair<std::string, std::string>> Rendered(
      const std::string& output) {
    std::map<std::string, std::pair<std::string, std::string>> pods;
    static const std::regex kPod(
        R"(pod (\S+):\n  in Kubernetes: TF_CONFIG=(.*)\n  here: +TF_CONFIG=(.*)\n)");
    for (std::sregex_iterator it(output.begin(), output.end(), kPod), end; it != end; ++it) {
      pods[(*it)[1]] = {(*it)[2], (*it)[3]};
    }
    return pods;
  }

  // The "cluster" part of a TF_CONFIG, and its addresses.
  static std::string ClusterOf(const std::string& tf_config) {
    const size_t task = tf_config.find("\"task\"");
    return tf_config.substr(0, task);
  }
  static std::vector<std::string> AddressesOf(const std::string& tf_config) {
    std::vector<std::string> addresses;
    static const std::regex kAddress(R"re("([^"]+:\d+)")re");
    const std::string cluster = ClusterOf(tf_config);
    for (std::sregex_iterator it(cluster.begin(), cluster.end(), kAddress), end; it != end; ++it) {
      addresses.push_back((*it)[1]);
    }
    return addresses;
  }

  // Checks a short run of `manifest`'s pods: every pod exited 0 and the
  // chief reached the last step.
  void ExpectShortRunTrains(const std::string& manifest, const std::string& chief_pod) {
    CommandResult r = K8sLocal(absl::StrCat("--manifest ", source_, "/deploy/", manifest,
                                            " --logdir ", dir_, "/logs -- --train_steps=100"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("k8s_local: every pod exited 0"), std::string::npos) << r.output;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.output, m,
                                  std::regex("k8s_local: chief " + chief_pod +
                                             R"(: final: global_step=(\d+) test_accuracy=)")))
        << r.output;
    EXPECT_EQ(m[1], "100");
    long step = 0;
    double accuracy = 0;
    ASSERT_TRUE(ParseFinal(ReadFile(dir_ + "/logs/" + chief_pod + ".log"), &step, &accuracy));
    EXPECT_GE(accuracy, 0.6);
    // The manifests require the cluster's token (Secret psrt-auth), which
    // stands in here for the one a user creates; no task ran without it.
    EXPECT_NE(r.output.find("k8s_local: Secret psrt-auth key token is not in the manifest"),
              std::string::npos)
        << r.output;
    const std::string chief_log = ReadFile(dir_ + "/logs/" + chief_pod + ".log");
    EXPECT_EQ(chief_log.find("no TLS and no auth token"), std::string::npos) << chief_log;
    EXPECT_NE(chief_log.find("+ auth token"), std::string::npos) << chief_log;
  }
};

TEST_F(K8sLocalTest, TfJobPodsGetTheOperatorsTfConfig) {
  CommandResult r =
      K8sLocal("--render --namespace team-a --manifest " + source_ + "/deploy/tfjob.yaml");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto pods = Rendered(r.output);
  ASSERT_EQ(pods.size(), 4u) << r.output;
  // The operator's genTFConfigJSONStr, byte for byte.
  const std::string cluster =
      R"({"cluster":{"ps":["psrt-mnist-ps-0.team-a.svc:2222","psrt-mnist-ps-1.team-a.svc:2222"],)"
      R"("worker":["psrt-mnist-worker-0.team-a.svc:2222","psrt-mnist-worker-1.team-a.svc:2222"]},)";
  EXPECT_EQ(pods.at("psrt-mnist-ps-1").first,
            cluster + R"("task":{"type":"ps","index":1},"environment":"cloud"})");
  EXPECT_EQ(pods.at("psrt-mnist-worker-0").first,
            cluster + R"("task":{"type":"worker","index":0},"environment":"cloud"})");
  // Here: the same TF_CONFIG but for the addresses, mapped one to one to
  // distinct 127.0.0.1 ports, alike in every pod.
  const std::string here_cluster = ClusterOf(pods.at("psrt-mnist-ps-0").second);
  std::set<std::string> distinct;
  for (const auto& [name, configs] : pods) {
    EXPECT_EQ(ClusterOf(configs.second), here_cluster) << name;
    const std::string task = configs.first.substr(configs.first.find("\"task\""));
    EXPECT_EQ(configs.second.substr(configs.second.find("\"task\"")), task) << name;
    for (const std::string& address : AddressesOf(configs.second)) {
      EXPECT_EQ(address.rfind("127.0.0.1:", 0), 0u) << address;
      distinct.insert(address);
    }
  }
  EXPECT_EQ(distinct.size(), 4u) << here_cluster;
}

TEST_F(K8sLocalTest, IndexedJobPodsGetTfConfigFromTheEntrypoint) {
  CommandResult r = K8sLocal("--render --manifest " + source_ + "/deploy/psrt.yaml");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto pods = Rendered(r.output);
  ASSERT_EQ(pods.size(), 4u) << r.output;
  EXPECT_EQ(pods.at("psrt-worker-1").first,
            R"({"cluster": {"ps": ["psrt-ps-0.psrt-ps:2222", "psrt-ps-1.psrt-ps:2222"], )"
            R"("worker": ["psrt-worker-0.psrt-worker:2222", "psrt-worker-1.psrt-worker:2222"]}, )"
            R"("task": {"type": "worker", "index": 1}})");
  EXPECT_NE(pods.at("psrt-ps-0").first.find(R"("task": {"type": "ps", "index": 0})"),
            std::string::npos);
  EXPECT_EQ(AddressesOf(pods.at("psrt-ps-0").second).size(), 4u);
}

TEST_F(K8sLocalTest, TfJobPodsTrainLocally) {
  ExpectShortRunTrains("tfjob.yaml", "psrt-mnist-worker-0");
  // The ps pods share the checkpoint claim, as on ReadWriteMany storage.
  const std::string volume = dir_ + "/logs/volumes/psrt-mnist-checkpoints/";
  // Two ps tasks of two stripes (the default): four shards.
  for (int k = 0; k < 4; ++k) {
    EXPECT_NE(ReadFile(absl::StrCat(volume, "checkpoint.ps-", k, "-of-4")).find("model.ckpt-100"),
              std::string::npos)
        << k;
  }
}

TEST_F(K8sLocalTest, IndexedJobPodsTrainLocally) {
  ExpectShortRunTrains("psrt.yaml", "psrt-worker-0");
}

// deploy/allreduce.yaml: no cluster anywhere; each pod knows its rank, the
// number of pods and where rank 0 is, and is reached at its name through the
// headless Service.
TEST_F(K8sLocalTest, AllreduceIndexedJobPodsMeetAtARendezvous) {
  CommandResult r = K8sLocal("--render --manifest " + source_ + "/deploy/allreduce.yaml");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto pods = Rendered(r.output);
  ASSERT_EQ(pods.size(), 4u) << r.output;
  EXPECT_EQ(pods.at("psrt-allreduce-2").first,
            "(none: a rendezvous at psrt-allreduce-0.psrt-allreduce:29500, rank 2 of 4, "
            "serving at psrt-allreduce-2.psrt-allreduce:2222)");
  // Here: one coordinator for all, a port of its own for each pod.
  static const std::regex kHere(
      R"(\(none: a rendezvous at (127\.0\.0\.1:\d+), rank (\d) of 4, serving at (127\.0\.0\.1:\d+)\))");
  std::set<std::string> coordinators, served;
  for (const auto& [name, configs] : pods) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(configs.second, m, kHere)) << configs.second;
    EXPECT_EQ(name, "psrt-allreduce-" + m[2].str());
    coordinators.insert(m[1]);
    served.insert(m[3]);
  }
  EXPECT_EQ(coordinators.size(), 1u);
  EXPECT_EQ(served.size(), 4u);
}

TEST_F(K8sLocalTest, AllreduceIndexedJobPodsTrainLocally) {
  ExpectShortRunTrains("allreduce.yaml", "psrt-allreduce-0");
  const std::string chief_log = ReadFile(dir_ + "/logs/psrt-allreduce-0.log");
  // Rank 0 serves the rendezvous on every interface (--bind_host=0.0.0.0),
  // at MASTER_PORT.
  EXPECT_NE(chief_log.find("rendezvous: rank 0 waits for 3 ranks on 0.0.0.0:"), std::string::npos)
      << chief_log;
  EXPECT_NE(chief_log.find("worker/0 is worker 0 of 4 (allreduce mode"), std::string::npos)
      << chief_log;
}

TEST_F(K8sLocalTest, TfJobWithoutATensorflowContainerIsRefused) {
  std::string manifest = ReadFile(source_ + "/deploy/tfjob.yaml");
  manifest = std::regex_replace(manifest, std::regex("name: tensorflow"), "name: trainer");
  std::ofstream(dir_ + "/bad.yaml") << manifest;
  CommandResult r = K8sLocal("--manifest " + dir_ + "/bad.yaml --logdir " + dir_ + "/logs");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("no container named \"tensorflow\""), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("started pod"), std::string::npos) << r.output;
}

TEST_F(K8sLocalTest, EntrypointWithoutATaskRefusesToStart) {
  CommandResult r = RunCommand(absl::StrCat("env -u TF_CONFIG -u MASTER_ADDR PSRT_BIN_DIR=", bin_,
                                            " ", source_, "/deploy/entrypoint.sh --train_steps=1"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("neither TF_CONFIG nor PSRT_CLUSTER is set"), std::string::npos)
      << r.output;
  r =
      RunCommand(absl::StrCat("PSRT_CLUSTER='{}' PSRT_JOB=ps JOB_COMPLETION_INDEX=x "
                              "PSRT_BIN_DIR=",
                              bin_, " ", source_, "/deploy/entrypoint.sh"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("JOB_COMPLETION_INDEX=x is not an index"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace psrt
