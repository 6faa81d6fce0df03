// Transport security end to end: real psrt_ps, psrt_worker and psrtctl
// processes with mutual TLS and the auth token, certificates from
// scripts/make_test_certs.sh.
#include <csignal>
#include <cstdlib>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"

namespace psrt {
namespace {

class SecurityTest : public ClusterFixture {
 protected:
  void SetUp() override {
    ClusterFixture::SetUp();
    if (IsSkipped()) return;
    certs_ = dir_ + "/certs";
    CommandResult r = RunCommand(absl::StrCat("PSRT_BIN_DIR=", bin_, " ", source_,
                                              "/scripts/make_test_certs.sh --token --out ",
                                              certs_, " 127.0.0.1"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    token_ = std::string(absl::StripAsciiWhitespace(ReadFile(certs_ + "/token")));
    ASSERT_EQ(token_.size(), 64u);
    tls_ = absl::StrCat("--tls_cert=", certs_, "/localhost.crt --tls_key=", certs_,
                        "/localhost.key --tls_ca=", certs_, "/ca.crt");
    token_flag_ = absl::StrCat("--auth_token_file=", certs_, "/token");
  }

  void TearDown() override {
    if (ps_pid_ > 0) ::kill(ps_pid_, SIGKILL);  // Only when a test failed early.
    ClusterFixture::TearDown();
  }

  // Fails the test when `text` (a log, a command's output) holds the token.
  void ExpectNoToken(const std::string& what, const std::string& text) {
    EXPECT_EQ(text.find(token_), std::string::npos) << what << " shows the auth token";
  }

  CommandResult Psrtctl(const std::string& args, const std::string& env = "") {
    CommandResult r = RunCommand(absl::StrCat(env, " timeout 30 ", bin_, "/psrtctl ", args));
    ExpectNoToken("psrtctl " + args, r.output);
    return r;
  }

  std::string certs_, token_, tls_, token_flag_;
  int ps_pid_ = 0;
};

// The data plane has no TLS: with TLS on, --tensor_transport=data_plane is
// refused at start by the ps and by the worker, never run in plaintext.
TEST_F(SecurityTest, TheDataPlaneIsRefusedWithTls) {
  const std::string spec = MakeSpec(1, 1);
  for (const char* binary : {"psrt_ps --job_name=ps", "psrt_worker --job_name=worker"}) {
    CommandResult r = RunCommand(absl::StrCat("timeout 30 ", bin_, "/", binary,
                                              " --task_index=0 --cluster_spec=", spec, " ", tls_,
                                              " ", token_flag_, " --tensor_transport=data_plane 2>&1"));
    EXPECT_NE(r.exit_code, 0) << binary << "\n" << r.output;
    EXPECT_NE(r.output.find("--tensor_transport=data_plane: the data plane has no TLS, and TLS is "
                            "on: use --tensor_transport=grpc"),
              std::string::npos)
        << binary << "\n" << r.output;
  }
}

TEST_F(SecurityTest, ClusterWithMutualTlsAndTokenTrainsAndNeverLogsTheToken) {
  const std::string spec = MakeSpec(1, 2);
  const std::string security = tls_ + " " + token_flag_;
  CommandResult r = Launch(spec, dir_ + "/logs",
                           "--sync_replicas --train_steps=100 --learning_rate=0.1 "
                           "--log_every_steps=50 " + security,
                           "--ps_flags '" + security + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  long step = 0;
  double accuracy = 0;
  const std::string chief = ReadFile(dir_ + "/logs/worker-0.log");
  ASSERT_TRUE(ParseFinal(chief, &step, &accuracy)) << r.output;
  EXPECT_EQ(step, 100);
  EXPECT_GE(accuracy, 0.6);
  const std::string ps = ReadFile(dir_ + "/logs/ps-0.log");
  EXPECT_NE(ps.find("done: 100 versions"), std::string::npos) << ps;
  for (const std::string& task : {"ps-0", "worker-0", "worker-1"}) {
    const std::string log = ReadFile(dir_ + "/logs/" + task + ".log");
    EXPECT_NE(log.find("transport security: mutual TLS + auth token"), std::string::npos)
        << task << ":\n" << log;
    ExpectNoToken(task + ".log", log);
  }
  ExpectNoToken("the launcher's output", r.output);
  ExpectNoToken("the cluster spec", ReadFile(spec));
}

// Allreduce mode: the workers' ring runs over the same mutual TLS and
// token; a worker with another token is refused at once by its neighbours,
// and fails at once too, instead of waiting out the ring's timeout.
TEST_F(SecurityTest, TheAllreduceRingNeedsTlsAndTheToken) {
  const std::string spec = MakeSpec(0, 2);
  const std::string security = tls_ + " " + token_flag_;
  CommandResult r = Launch(spec, dir_ + "/ring",
                           "--train_steps=40 --learning_rate=0.1 --log_every_steps=20 " + security);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  long step = 0;
  double accuracy = 0;
  ASSERT_TRUE(ParseFinal(ReadFile(dir_ + "/ring/worker-0.log"), &step, &accuracy)) << r.output;
  EXPECT_EQ(step, 40);
  ExpectNoToken("the launcher's output", r.output);

  const std::string run = absl::StrCat(
      " timeout 60 ", bin_, "/psrt_worker --cluster_spec=", spec,
      " --job_name=worker --train_steps=10 --allreduce_timeout_secs=30 ", tls_);
  const absl::Time start = absl::Now();
  const std::string log = dir_ + "/wrong.log";
  RunCommand(absl::StrCat("PSRT_AUTH_TOKEN=", token_, run, " --task_index=0 > ", log,
                          " 2>&1 &"));
  CommandResult wrong = RunCommand("PSRT_AUTH_TOKEN=wrong" + run + " --task_index=1");
  EXPECT_EQ(wrong.exit_code, 1) << wrong.output;
  EXPECT_NE(wrong.output.find("worker/0 (127.0.0.1:"), std::string::npos) << wrong.output;
  EXPECT_NE(wrong.output.find("unauthenticated"), std::string::npos) << wrong.output;
  EXPECT_LT(absl::Now() - start, absl::Seconds(25)) << "waited for the ring's timeout";
  RunCommand("pkill -9 -f '[c]luster_spec=" + spec + "'");

  // The other order: the worker with the wrong token starts first, finds
  // worker/0 not yet listening, and still fails at once when it comes (and
  // goes: worker/0 fails too, refused by it).
  const absl::Time second = absl::Now();
  const std::string wrong_log = dir_ + "/wrong-first.log";
  RunCommand(absl::StrCat("(PSRT_AUTH_TOKEN=wrong", run, " --task_index=1 > ", wrong_log,
                          " 2>&1; echo $? > ", wrong_log, ".rc) > /dev/null 2>&1 &"));
  absl::SleepFor(absl::Seconds(2));
  RunCommand(absl::StrCat("PSRT_AUTH_TOKEN=", token_, run, " --task_index=0 > ", log, " 2>&1"));
  std::string rc;
  for (int i = 0; i < 600 && rc.empty(); ++i) {
    rc = ReadFile(wrong_log + ".rc");
    if (rc.empty()) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(rc, "1\n") << ReadFile(wrong_log);
  const std::string wrong_first = ReadFile(wrong_log);
  EXPECT_NE(wrong_first.find("worker/0 (127.0.0.1:"), std::string::npos) << wrong_first;
  EXPECT_NE(wrong_first.find("unauthenticated"), std::string::npos) << wrong_first;
  EXPECT_LT(absl::Now() - second, absl::Seconds(30)) << "waited for the ring's timeout";
  RunCommand("pkill -9 -f '[c]luster_spec=" + spec + "'");
}

TEST_F(SecurityTest, ClientsWithoutTheTokenOrTlsAreRefused) {
  const std::string spec = MakeSpec(1, 1);
  const std::string ps_log = dir_ + "/ps-0.log";
  CommandResult started = RunCommand(absl::StrCat(
      bin_, "/psrt_ps --cluster_spec=", spec, " --job_name=ps --task_index=0 ",
      "--shutdown_grace_secs=1 ", tls_, " ", token_flag_, " >", ps_log, " 2>&1 & echo $!"));
  ps_pid_ = std::atoi(started.output.c_str());
  ASSERT_GT(ps_pid_, 0) << started.output;
  const std::string cluster = "--cluster_spec=" + spec + " ";

  // `psrtctl status` reached ps/0 (the worker of the spec never runs, so
  // its line says unreachable and the exit code is 1 either way).
  auto reached_ps = [](const CommandResult& status) {
    static const std::regex kPsLine(R"(ps/0 +\S+ +not ready +health=NOT_SERVING)");
    return std::regex_search(status.output, kPsLine);
  };
  // The right certificate and token, from the file or the environment.
  CommandResult ok;
  for (int i = 0; i < 50 && !reached_ps(ok); ++i) {
    ok = Psrtctl("status " + cluster + tls_ + " " + token_flag_);
    if (!reached_ps(ok)) absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_TRUE(reached_ps(ok)) << ok.output << ReadFile(ps_log);
  CommandResult env = Psrtctl("status " + cluster + tls_, "PSRT_AUTH_TOKEN=" + token_);
  EXPECT_TRUE(reached_ps(env)) << env.output;

  // No token, or a wrong one: UNAUTHENTICATED.
  for (const std::string& env : {std::string(), std::string("PSRT_AUTH_TOKEN=wrong"),
                                 "PSRT_AUTH_TOKEN=" + token_ + "x"}) {
    CommandResult refused = Psrtctl("status " + cluster + tls_, env);
    EXPECT_FALSE(reached_ps(refused)) << env << ": " << refused.output;
    EXPECT_NE(refused.output.find("unauthenticated"), std::string::npos)
        << env << ": " << refused.output;
  }
  // A worker with a wrong token gives up at once instead of waiting for the
  // parameter server.
  CommandResult worker = RunCommand(absl::StrCat(
      "PSRT_AUTH_TOKEN=wrong timeout 60 ", bin_, "/psrt_worker ", cluster,
      "--job_name=worker --task_index=0 --train_steps=10 ", tls_));
  EXPECT_EQ(worker.exit_code, 1) << worker.output;
  EXPECT_NE(worker.output.find("unauthenticated"), std::string::npos) << worker.output;

  // Plaintext against TLS: no connection.
  CommandResult plaintext = Psrtctl("status " + cluster + token_flag_);
  EXPECT_NE(plaintext.exit_code, 0) << plaintext.output;
  EXPECT_FALSE(reached_ps(plaintext)) << plaintext.output;

  // Bad configuration is refused at start, naming the flag and the file.
  CommandResult no_key = Psrtctl(absl::StrCat("status ", cluster, "--tls_cert=", certs_,
                                              "/localhost.crt --tls_ca=", certs_, "/ca.crt"));
  EXPECT_NE(no_key.exit_code, 0);
  EXPECT_NE(no_key.output.find("--tls_key"), std::string::npos) << no_key.output;

  // The operator ends it; the shard exits 0.
  CommandResult shutdown = Psrtctl("shutdown " + cluster + tls_ + " " + token_flag_);
  EXPECT_EQ(shutdown.exit_code, 0) << shutdown.output;
  CommandResult exited = RunCommand(absl::StrCat(
      "for i in $(seq 100); do kill -0 ", ps_pid_, " 2>/dev/null || exit 0; sleep 0.1; done; "
      "exit 1"));
  EXPECT_EQ(exited.exit_code, 0) << "psrt_ps still runs";
  if (exited.exit_code == 0) ps_pid_ = 0;
  const std::string log = ReadFile(ps_log);
  EXPECT_NE(log.find("done: 0 versions"), std::string::npos) << log;
  ExpectNoToken("ps-0.log", log);
  ExpectNoToken("the worker's output", worker.output);
}

}  // namespace
}  // namespace psrt
