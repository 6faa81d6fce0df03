#include "common/transport_security.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/rpc_util.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"

namespace psrt {
namespace {

// Certificates made once per process by scripts/make_test_certs.sh (ctest
// runs each test in its own process, several at once): the cluster's CA with
// a certificate for the loopback host and one for another host, and a second
// CA (an attacker's) with its own loopback certificate.
std::string* cert_base = nullptr;
std::string* cert_dir = nullptr;
std::string* rogue_dir = nullptr;
bool certs_made = false;

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream contents;
  contents << in.rdbuf();
  EXPECT_FALSE(contents.str().empty()) << path;
  return contents.str();
}

bool MakeCerts(const std::string& dir, const std::string& hosts) {
  const std::string command =
      absl::StrCat(PSRT_SOURCE_DIR, "/scripts/make_test_certs.sh --out ", dir, " ", hosts,
                   " >/dev/null");
  const int status = std::system(command.c_str());
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

class TransportSecurityTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    cert_base = new std::string(
        absl::StrCat(testing::TempDir(), "transport_security_test.", getpid()));
    cert_dir = new std::string(*cert_base + "/certs");
    rogue_dir = new std::string(*cert_base + "/rogue");
    certs_made = MakeCerts(*cert_dir, "127.0.0.1 node-a.example.com") &&
                 MakeCerts(*rogue_dir, "127.0.0.1");
  }
  static void TearDownTestSuite() {
    std::system(("rm -rf " + *cert_base).c_str());
  }
  // A failure to make the certificates fails every test (not skips them).
  void SetUp() override { ASSERT_TRUE(certs_made) << "make_test_certs.sh failed"; }

  // A file in this process's directory, with `mode`.
  std::string WriteFile(const std::string& name, const std::string& contents,
                        mode_t mode = 0600) {
    const std::string path = *cert_base + "/" + name;
    std::ofstream(path, std::ios::trunc) << contents;
    chmod(path.c_str(), mode);
    return path;
  }

  static TransportSecurityOptions Tls(const std::string& dir = *cert_dir,
                                      const std::string& host = "localhost") {
    TransportSecurityOptions options;
    options.tls_cert_file = dir + "/" + host + ".crt";
    options.tls_key_file = dir + "/" + host + ".key";
    options.tls_ca_file = dir + "/ca.crt";
    return options;
  }

  static TransportSecurityOptions WithToken(TransportSecurityOptions options,
                                            const std::string& token) {
    options.auth_token = token;
    return options;
  }

  static TransportSecurity Load(const TransportSecurityOptions& options) {
    absl::StatusOr<TransportSecurity> security = LoadTransportSecurity(options);
    EXPECT_TRUE(security.ok()) << security.status();
    return security.ok() ? *security : TransportSecurity();
  }

  // Expects `options` to be refused with a message holding every `parts`.
  static void ExpectRefused(const TransportSecurityOptions& options,
                            std::initializer_list<std::string> parts) {
    absl::StatusOr<TransportSecurity> security = LoadTransportSecurity(options);
    ASSERT_FALSE(security.ok());
    for (const std::string& part : parts) {
      EXPECT_NE(security.status().message().find(part), std::string::npos)
          << security.status() << " lacks \"" << part << "\"";
    }
  }
};

// ------------------------------------------------------------ loading

TEST_F(TransportSecurityTest, NothingConfiguredIsPlaintextWithoutToken) {
  TransportSecurity security = Load(TransportSecurityOptions());
  EXPECT_FALSE(security.tls());
  EXPECT_FALSE(security.has_auth_token());
  EXPECT_EQ(security.Describe(), "plaintext, no auth token");
}

TEST_F(TransportSecurityTest, LoadsMutualTlsAndToken) {
  TransportSecurity security = Load(WithToken(Tls(), "s3cret"));
  EXPECT_TRUE(security.tls());
  EXPECT_TRUE(security.has_auth_token());
  EXPECT_EQ(security.Describe(), "mutual TLS + auth token");
  EXPECT_EQ(security.Describe().find("s3cret"), std::string::npos);
}

TEST_F(TransportSecurityTest, TlsNeedsAllThreeFiles) {
  TransportSecurityOptions options = Tls();
  options.tls_key_file.clear();
  ExpectRefused(options, {"--tls_key"});
  options = Tls();
  options.tls_cert_file.clear();
  options.tls_ca_file.clear();
  ExpectRefused(options, {"--tls_cert", "--tls_ca"});
}

TEST_F(TransportSecurityTest, MissingFilesNameTheFlagAndTheFile) {
  TransportSecurityOptions options = Tls();
  options.tls_cert_file = "/nonexistent/cert.pem";
  ExpectRefused(options, {"--tls_cert=/nonexistent/cert.pem"});
  EXPECT_EQ(LoadTransportSecurity(options).status().code(), absl::StatusCode::kNotFound);
  options = Tls();
  options.tls_ca_file = testing::TempDir();  // A directory.
  ExpectRefused(options, {"--tls_ca=", "not a regular file"});
  TransportSecurityOptions token;
  token.auth_token_file = "/nonexistent/token";
  ExpectRefused(token, {"--auth_token_file=/nonexistent/token"});
}

TEST_F(TransportSecurityTest, BadPemNamesTheFlagAndTheFile) {
  TransportSecurityOptions options = Tls();
  options.tls_cert_file = WriteFile("not_a_cert.pem", "hello\n", 0644);
  ExpectRefused(options, {"--tls_cert=" + options.tls_cert_file, "no PEM certificate"});

  // A damaged block after a good one.
  options = Tls();
  options.tls_ca_file = WriteFile(
      "damaged_ca.pem",
      ReadText(*cert_dir + "/ca.crt") +
          "-----BEGIN CERTIFICATE-----\nMIIB!!!\n-----END CERTIFICATE-----\n",
      0644);
  ExpectRefused(options, {"--tls_ca=" + options.tls_ca_file, "bad PEM"});

  options = Tls();
  options.tls_key_file = WriteFile("not_a_key.pem", ReadText(*cert_dir + "/ca.crt"));
  ExpectRefused(options, {"--tls_key=" + options.tls_key_file, "private key"});
}

TEST_F(TransportSecurityTest, KeyMustBelongToTheCertificate) {
  TransportSecurityOptions options = Tls();
  options.tls_key_file = *cert_dir + "/node-a.example.com.key";
  ExpectRefused(options, {"--tls_key=" + options.tls_key_file, "--tls_cert="});
}

TEST_F(TransportSecurityTest, CertificateMustBeSignedByTheCa) {
  TransportSecurityOptions options = Tls();
  options.tls_ca_file = *rogue_dir + "/ca.crt";
  ExpectRefused(options, {"--tls_cert=", "does not verify against the CA in --tls_ca=" +
                                             options.tls_ca_file});
}

TEST_F(TransportSecurityTest, EmptyTokensAreRefused) {
  TransportSecurityOptions options;
  options.auth_token_file = WriteFile("empty_token", "");
  ExpectRefused(options, {"--auth_token_file=" + options.auth_token_file, "empty"});
  options.auth_token_file = WriteFile("newline_token", "\n");
  ExpectRefused(options, {"empty"});
  TransportSecurityOptions env;
  env.auth_token = "";  // PSRT_AUTH_TOKEN= (set, but empty).
  ExpectRefused(env, {"PSRT_AUTH_TOKEN", "empty"});
}

TEST_F(TransportSecurityTest, AChiefTokenNeedsItsOwnValueAndTheWorkersToken) {
  TransportSecurityOptions alone;
  alone.chief_token = "boss";
  absl::StatusOr<TransportSecurity> refused = LoadTransportSecurity(alone);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("needs the workers' auth token"), std::string::npos)
      << refused.status();
  TransportSecurityOptions same;
  same.auth_token = "s3cret";
  same.chief_token = "s3cret";
  refused = LoadTransportSecurity(same);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message().find("s3cret"), std::string::npos);
  TransportSecurityOptions both;
  both.auth_token = "s3cret";
  both.chief_token = "boss";
  absl::StatusOr<TransportSecurity> loaded = LoadTransportSecurity(both);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->has_chief_token());
  EXPECT_EQ(loaded->Describe(), "plaintext + auth token + chief token (roles)");
}

TEST_F(TransportSecurityTest, TokenFromFileAndEnvironmentIsAmbiguous) {
  TransportSecurityOptions options;
  options.auth_token_file = WriteFile("token", "s3cret");
  options.auth_token = "s3cret";
  ExpectRefused(options, {"--auth_token_file", "PSRT_AUTH_TOKEN"});
}

TEST_F(TransportSecurityTest, TokenOfUnsendableCharactersIsRefusedWithoutShowingIt) {
  TransportSecurityOptions options;
  options.auth_token = "two words";
  ExpectRefused(options, {"PSRT_AUTH_TOKEN", "printable ASCII"});
  EXPECT_EQ(LoadTransportSecurity(options).status().message().find("words"),
            std::string::npos);
}

TEST_F(TransportSecurityTest, TokenFileWritableByEveryoneIsRefused) {
  TransportSecurityOptions options;
  options.auth_token_file = WriteFile("open_token", "s3cret\n", 0666);
  ExpectRefused(options, {"--auth_token_file=" + options.auth_token_file, "writable"});
  // Readable by everyone: loads, with a warning.
  options.auth_token_file = WriteFile("readable_token", "s3cret\n", 0644);
  EXPECT_TRUE(LoadTransportSecurity(options).ok());
}

// ------------------------------------------------------------ on the wire

// A server that answers every call OK and remembers the "authorization"
// metadata its handler saw.
class RecordingService final : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    {
      absl::MutexLock lock(&mu_);
      auto it = context->client_metadata().find("authorization");
      last_authorization_ =
          it == context->client_metadata().end() ? "" : std::string(it->second.data(),
                                                                    it->second.size());
    }
    class Reactor final : public grpc::ServerGenericBidiReactor {
     public:
      Reactor() { Finish(grpc::Status::OK); }
      void OnDone() override { delete this; }
    };
    return new Reactor;
  }
  std::string last_authorization() {
    absl::MutexLock lock(&mu_);
    return last_authorization_;
  }

 private:
  absl::Mutex mu_;
  std::string last_authorization_ ABSL_GUARDED_BY(mu_);
};

class TestServer {
 public:
  explicit TestServer(const TransportSecurity& security) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", security.ServerCredentials(), &port_);
    builder.RegisterCallbackGenericService(&service_);
    server_ = builder.BuildAndStart();
    EXPECT_NE(port_, 0);
  }
  ~TestServer() { server_->Shutdown(); }

  std::string address(const std::string& host = "127.0.0.1") const {
    return absl::StrCat(host, ":", port_);
  }
  RecordingService& service() { return service_; }

 private:
  RecordingService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

grpc::Status Call(const std::shared_ptr<grpc::Channel>& channel,
                  const std::string& method = "/psrt.test.Recording/Call") {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1), response;
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request,
                 &response, [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  return status;
}

grpc::Status Call(const std::string& address, const TransportSecurity& client) {
  return Call(NewChannel(address, client));
}

TEST_F(TransportSecurityTest, MutualTlsWithTheRightTokenIsServed) {
  TestServer server(Load(WithToken(Tls(), "s3cret")));
  for (const std::string host : {"127.0.0.1", "localhost"}) {
    grpc::Status status = Call(server.address(host), Load(WithToken(Tls(), "s3cret")));
    EXPECT_TRUE(status.ok()) << host << ": " << status.error_message();
  }
  // The check consumed the token: no handler sees it.
  EXPECT_EQ(server.service().last_authorization(), "");
}

TEST_F(TransportSecurityTest, TokenFileMatchesTheSameTokenFromTheEnvironment) {
  TransportSecurityOptions file_options = Tls();
  file_options.auth_token_file = WriteFile("line_token", "s3cret\r\n");
  TestServer server(Load(file_options));
  EXPECT_TRUE(Call(server.address(), Load(WithToken(Tls(), "s3cret"))).ok());
}

TEST_F(TransportSecurityTest, MissingOrWrongTokenIsUnauthenticated) {
  for (const TransportSecurityOptions& server_options :
       {WithToken(Tls(), "s3cret"), WithToken(TransportSecurityOptions(), "s3cret")}) {
    const bool tls = !server_options.tls_cert_file.empty();
    TestServer server(Load(server_options));
    const TransportSecurityOptions client = tls ? Tls() : TransportSecurityOptions();
    for (const std::string& token : {std::string(), std::string("s3cre"),
                                     std::string("s3cret!"), std::string("S3CRET")}) {
      grpc::Status status = Call(
          server.address(), Load(token.empty() ? client : WithToken(client, token)));
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << "tls=" << tls << " token=" << token << ": " << status.error_message();
      EXPECT_EQ(status.error_message().find("s3cret"), std::string::npos);
    }
    EXPECT_TRUE(Call(server.address(), Load(WithToken(client, "s3cret"))).ok())
        << "tls=" << tls;
  }
}

// Kubernetes' gRPC probes send no token: the standard health service
// answers without one, and nothing else does.
TEST_F(TransportSecurityTest, HealthChecksNeedNoTokenAndNothingElseGetsIn) {
  TestServer server(Load(WithToken(TransportSecurityOptions(), "s3cret")));
  const auto no_token = NewChannel(server.address(), Load(TransportSecurityOptions()));
  EXPECT_TRUE(Call(no_token, "/grpc.health.v1.Health/Check").ok());
  EXPECT_TRUE(Call(no_token, "/grpc.health.v1.Health/Watch").ok());
  for (const std::string method :
       {"/grpc.health.v1.Health/Checks", "/grpc.health.v1.Health", "/psrt.proto.ParameterServer/Push",
        "/psrt.proto.ParameterServer/Shutdown", "/grpc.health.v1.Health/Check/x"}) {
    EXPECT_EQ(Call(no_token, method).error_code(), grpc::StatusCode::UNAUTHENTICATED) << method;
  }
}

TEST_F(TransportSecurityTest, ClientAttachesTheTokenToEveryCall) {
  TestServer server(Load(TransportSecurityOptions()));  // Checks nothing.
  std::shared_ptr<grpc::Channel> channel =
      NewChannel(server.address(), Load(WithToken(TransportSecurityOptions(), "s3cret")));
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(Call(channel).ok());
    EXPECT_EQ(server.service().last_authorization(), "Bearer s3cret");
  }
}

TEST_F(TransportSecurityTest, ClientWithoutCertificateFailsTheHandshake) {
  TestServer server(Load(Tls()));
  grpc::SslCredentialsOptions no_certificate;
  no_certificate.pem_root_certs = ReadText(*cert_dir + "/ca.crt");
  grpc::Status status = Call(grpc::CreateChannel(server.address(),
                                                 grpc::SslCredentials(no_certificate)));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_TRUE(Call(server.address(), Load(Tls())).ok());
}

TEST_F(TransportSecurityTest, ClientCertificateFromAnotherCaFailsTheHandshake) {
  TestServer server(Load(Tls()));
  // The rogue client trusts the real CA, but its own certificate is not
  // signed by it.
  grpc::SslCredentialsOptions rogue;
  rogue.pem_root_certs = ReadText(*cert_dir + "/ca.crt");
  rogue.pem_cert_chain = ReadText(*rogue_dir + "/localhost.crt");
  rogue.pem_private_key = ReadText(*rogue_dir + "/localhost.key");
  grpc::Status status =
      Call(grpc::CreateChannel(server.address(), grpc::SslCredentials(rogue)));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
}

TEST_F(TransportSecurityTest, PlaintextClientAgainstTlsServerFails) {
  TestServer server(Load(WithToken(Tls(), "s3cret")));
  grpc::Status status =
      Call(server.address(), Load(WithToken(TransportSecurityOptions(), "s3cret")));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
}

TEST_F(TransportSecurityTest, ServerCertificateMustNameTheDialedHost) {
  // The server presents node-a.example.com's certificate on 127.0.0.1.
  TestServer server(Load(Tls(*cert_dir, "node-a.example.com")));
  grpc::Status status = Call(server.address(), Load(Tls()));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
}

}  // namespace
}  // namespace psrt
