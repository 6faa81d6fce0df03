// psrt_ps --check_replica_certificates: with mutual TLS, a push as replica r
// is taken only from a caller whose certificate names replica r's host, so
// one worker's credentials cannot push as another worker.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/transport_security.h"
#include "gtest/gtest.h"
#include "tests/worker/local_ps.h"

namespace psrt {
namespace {

class ReplicaCertificatesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/replica_certs_", getpid());
    const int status = std::system(absl::StrCat(PSRT_SOURCE_DIR, "/scripts/make_test_certs.sh --out ",
                                                dir_, " 127.0.0.1 node-b.example.com >/dev/null")
                                       .c_str());
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "make_test_certs.sh failed";
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  // The TLS credentials of `host`'s certificate.
  std::shared_ptr<const TransportSecurity> CredentialsOf(const std::string& host) {
    TransportSecurityOptions options;
    options.tls_cert_file = dir_ + "/" + host + ".crt";
    options.tls_key_file = dir_ + "/" + host + ".key";
    options.tls_ca_file = dir_ + "/ca.crt";
    absl::StatusOr<TransportSecurity> security = LoadTransportSecurity(options);
    EXPECT_TRUE(security.ok()) << security.status();
    return std::make_shared<TransportSecurity>(security.ok() ? *security : TransportSecurity());
  }

  std::string dir_;
};

TEST_F(ReplicaCertificatesTest, AWorkerPushesOnlyAsTheReplicaItsCertificateNames) {
  // Replica 0 (the chief) runs on 127.0.0.1, replica 1 on node-b.example.com;
  // the ps listens on 127.0.0.1 with the loopback certificate.
  auto loopback = CredentialsOf("localhost");
  auto node_b = CredentialsOf("node-b.example.com");
  LocalPs ps(0, /*stripes=*/1, loopback, {}, {"127.0.0.1", "node-b.example.com"});
  const std::vector<VariableDef> vars = {{"w", {16}}};
  auto chief = NewClient({&ps}, 0, vars, absl::Seconds(60), 1, loopback);
  ASSERT_TRUE(chief->WaitForServers(absl::Seconds(10)).ok());
  proto::TrainingConfig config = SyncConfig(2);
  config.set_mode(proto::ASYNC);
  ASSERT_TRUE(chief->Init(config, Filled(vars, 1.0f)).ok());
  std::vector<Tensor> params = Filled(vars, 0.0f);
  ASSERT_TRUE(chief->Pull(0, &params).ok());
  EXPECT_TRUE(chief->Push(Filled(vars, 0.5f)).ok());  // Replica 0 from 127.0.0.1.

  // Replica 1 with the loopback certificate: refused, both hosts named.
  auto impostor = NewClient({&ps}, 1, vars, absl::Seconds(60), 1, loopback);
  ASSERT_TRUE(impostor->Pull(0, &params).ok());
  absl::StatusOr<PsClient::PushResult> refused = impostor->Push(Filled(vars, 0.5f));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
  EXPECT_NE(refused.status().message().find("replica 1"), std::string::npos) << refused.status();
  EXPECT_NE(refused.status().message().find("node-b.example.com"), std::string::npos);
  EXPECT_NE(refused.status().message().find("127.0.0.1"), std::string::npos);

  // Replica 1 with node-b's certificate: taken; replica 0 with it: refused.
  auto worker = NewClient({&ps}, 1, vars, absl::Seconds(60), 1, node_b);
  ASSERT_TRUE(worker->Pull(0, &params).ok());
  EXPECT_TRUE(worker->Push(Filled(vars, 0.5f)).ok());
  auto other_chief = NewClient({&ps}, 0, vars, absl::Seconds(60), 1, node_b);
  ASSERT_TRUE(other_chief->Pull(0, &params).ok());
  EXPECT_EQ(other_chief->Push(Filled(vars, 0.5f)).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ps.shard().GetStatus().version(), 2);  // The two pushes taken.
}

}  // namespace
}  // namespace psrt
