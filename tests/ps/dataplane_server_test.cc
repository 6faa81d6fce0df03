// DataPlaneServer over real sockets on 127.0.0.1, with real ParameterShards
// and a raw frame client: the hello's token, pushes and pulls, and what a
// bad or broken request leaves behind (nothing applied).
#include "ps/dataplane_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/ps/shard_test_util.h"

namespace psrt {
namespace {

using dataplane::FrameConnection;
using dataplane::FrameHeader;
using dataplane::FrameKind;
using dataplane::FrameMethod;
using shard_test::Config;
using shard_test::InitShard;
using shard_test::kSize;
using shard_test::Meta;
using shard_test::PullNow;
using ::testing::HasSubstr;

absl::Time Soon() { return absl::Now() + absl::Seconds(20); }

std::shared_ptr<const TransportSecurity> Token(const std::string& token) {
  TransportSecurityOptions options;
  options.auth_token = token;
  absl::StatusOr<TransportSecurity> security = LoadTransportSecurity(options);
  EXPECT_TRUE(security.ok()) << security.status();
  return std::make_shared<const TransportSecurity>(*std::move(security));
}

class DataPlaneServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (auto& shard : shards_) {
      shard = std::make_unique<ParameterShard>(ParameterShard::Options{});
      InitShard(shard.get(), Config(proto::SYNC, 1, 1));
    }
    DataPlaneServer::Options options;
    options.listen_address = "127.0.0.1:0";
    options.security = Token("s3cret");
    absl::StatusOr<std::unique_ptr<DataPlaneServer>> server =
        DataPlaneServer::Start({shards_[0].get(), shards_[1].get()}, options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  // A connection that has said hello with `credential`; the reply's status.
  std::unique_ptr<FrameConnection> Connect(const std::string& credential, absl::Status* greeted) {
    absl::StatusOr<std::unique_ptr<FrameConnection>> connection =
        FrameConnection::Connect(server_->address(), 1 << 20, Soon());
    EXPECT_TRUE(connection.ok()) << connection.status();
    FrameHeader hello;
    hello.kind = FrameKind::kHello;
    EXPECT_TRUE((*connection)->Send(hello, credential, {}, Soon()).ok());
    FrameHeader reply;
    std::string text;
    *greeted = (*connection)->ReceiveHeader(&reply, &text, Soon());
    if (greeted->ok() && reply.status != 0) {
      *greeted = absl::Status(static_cast<absl::StatusCode>(reply.status), text);
    }
    return *std::move(connection);
  }
  std::unique_ptr<FrameConnection> Connect() {
    absl::Status greeted;
    auto connection = Connect("Bearer s3cret", &greeted);
    EXPECT_TRUE(greeted.ok()) << greeted;
    return connection;
  }

  // A raw TCP socket to the server that has said hello with the token and
  // read the reply; -1 on failure.
  int RawGreeted() {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(server_->port());
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) return -1;
    FrameHeader hello;
    hello.kind = FrameKind::kHello;
    const std::string credential = "Bearer s3cret";
    hello.meta_size = credential.size();
    char hello_bytes[dataplane::kFrameHeaderBytes];
    dataplane::EncodeFrameHeader(hello, hello_bytes);
    const std::string greeting = std::string(hello_bytes, sizeof(hello_bytes)) + credential;
    char answer[dataplane::kFrameHeaderBytes];
    if (write(fd, greeting.data(), greeting.size()) != ssize_t(greeting.size()) ||
        recv(fd, answer, sizeof(answer), MSG_WAITALL) != ssize_t(sizeof(answer))) {
      close(fd);
      return -1;
    }
    return fd;
  }

  static std::string PushMeta(int64_t version) {
    proto::PushHeader header;
    header.set_replica(0);
    header.set_version(version);
    *header.add_variables() = Meta("w", {kSize});
    return header.SerializeAsString();
  }
  // Sends a request; returns the reply's header and metadata.
  static FrameHeader Call(FrameConnection* connection, FrameMethod method, uint32_t stripe,
                          const std::string& meta, absl::Span<const char> data,
                          std::string* reply_meta) {
    FrameHeader request;
    request.kind = FrameKind::kRequest;
    request.method = method;
    request.stripe = stripe;
    request.request_id = 5;
    EXPECT_TRUE(connection->Send(request, meta, {data}, Soon()).ok());
    FrameHeader reply;
    EXPECT_TRUE(connection->ReceiveHeader(&reply, reply_meta, Soon()).ok());
    EXPECT_EQ(reply.kind, FrameKind::kReply);
    EXPECT_EQ(reply.request_id, 5u);
    return reply;
  }

  // Pushes `grad` to `stripe` at version 0; returns the reply's header.
  static FrameHeader Push(FrameConnection* connection, uint32_t stripe,
                          const std::vector<float>& grad, std::string* reply_meta) {
    return Call(connection, FrameMethod::kPush, stripe, PushMeta(0),
                {reinterpret_cast<const char*>(grad.data()), sizeof(float) * grad.size()},
                reply_meta);
  }
  // Sends a pull of `min_version` to `stripe` and waits until it waits.
  void SendWaitingPull(FrameConnection* connection, uint32_t stripe, int64_t min_version) {
    proto::PullRequest pull;
    pull.set_min_version(min_version);
    FrameHeader request;
    request.kind = FrameKind::kRequest;
    request.method = FrameMethod::kPull;
    request.stripe = stripe;
    ASSERT_TRUE(connection->Send(request, pull.SerializeAsString(), {}, Soon()).ok());
    for (int i = 0; i < 100 && shards_[stripe]->GetStatus().waiting_pulls() == 0; ++i) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_EQ(shards_[stripe]->GetStatus().waiting_pulls(), 1);
  }

  std::unique_ptr<ParameterShard> shards_[2];
  std::unique_ptr<DataPlaneServer> server_;
};

TEST_F(DataPlaneServerTest, AHelloWithoutTheTokenIsRefused) {
  absl::Status greeted;
  auto connection = Connect("Bearer guess", &greeted);
  EXPECT_EQ(greeted.code(), absl::StatusCode::kUnauthenticated) << greeted;
  EXPECT_THAT(std::string(greeted.message()), HasSubstr("requires the cluster's auth token"));
  // And the connection is closed.
  FrameHeader header;
  std::string meta;
  absl::Status closed = connection->ReceiveHeader(&header, &meta, Soon());
  EXPECT_EQ(closed.code(), absl::StatusCode::kUnavailable) << closed;
}

TEST_F(DataPlaneServerTest, APushIsAppliedAndAPullSendsTheValues) {
  auto connection = Connect();
  std::string meta;
  FrameHeader reply = Push(connection.get(), 1, {1, 2, 3, 4}, &meta);
  ASSERT_EQ(reply.status, 0u) << meta;
  proto::PushResponse pushed;
  ASSERT_TRUE(pushed.ParseFromString(meta));
  EXPECT_TRUE(pushed.accepted());
  EXPECT_EQ(pushed.version(), 1);
  // Stripe 1 took it; stripe 0 did not.
  EXPECT_EQ(PullNow(shards_[1].get(), 1)->second, (std::vector<float>{-1, -2, -3, -4}));
  EXPECT_EQ(PullNow(shards_[0].get(), 0)->first, 0);

  proto::PullRequest pull;
  pull.set_min_version(1);
  reply = Call(connection.get(), FrameMethod::kPull, 1, pull.SerializeAsString(), {}, &meta);
  ASSERT_EQ(reply.status, 0u) << meta;
  proto::PullHeader pulled;
  ASSERT_TRUE(pulled.ParseFromString(meta));
  EXPECT_EQ(pulled.version(), 1);
  ASSERT_EQ(reply.data_size, sizeof(float) * kSize);
  std::vector<float> values(kSize);
  ASSERT_TRUE(
      connection->ReceiveData({reinterpret_cast<char*>(values.data()), reply.data_size}, Soon())
          .ok());
  EXPECT_EQ(values, (std::vector<float>{-1, -2, -3, -4}));
}

// A bad request gets an error reply and the connection goes on; a push whose
// connection is cut mid-frame applies nothing.
TEST_F(DataPlaneServerTest, BadRequestsAreRefusedAndACutPushAppliesNothing) {
  auto connection = Connect();
  std::string meta;
  FrameHeader reply = Call(connection.get(), FrameMethod::kPush, 7, PushMeta(0), {}, &meta);
  EXPECT_EQ(reply.status, static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(meta, HasSubstr("the call names stripe \"7\", but this ps serves 2"));
  reply = Call(connection.get(), FrameMethod::kPush, 0, "not a header", {}, &meta);
  EXPECT_THAT(meta, HasSubstr("push: the metadata is not a PushHeader"));
  reply = Push(connection.get(), 0, {1, 2}, &meta);  // A wrong byte length.
  EXPECT_EQ(reply.status, static_cast<uint32_t>(absl::StatusCode::kInvalidArgument)) << meta;

  // The cut: a header announcing 16 bytes, then 8, then the connection closes.
  FrameHeader request;
  request.kind = FrameKind::kRequest;
  request.method = FrameMethod::kPush;
  const std::string push_meta = PushMeta(0);
  request.meta_size = push_meta.size();
  request.data_size = sizeof(float) * kSize;
  char encoded[dataplane::kFrameHeaderBytes];
  dataplane::EncodeFrameHeader(request, encoded);
  const std::vector<float> grad = {1, 1, 1, 1};
  const std::string partial = std::string(encoded, sizeof(encoded)) + push_meta +
                              std::string(reinterpret_cast<const char*>(grad.data()), 8);
  // Through a raw socket: the hello, then the partial push, then close.
  const int fd = RawGreeted();
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, partial.data(), partial.size()), ssize_t(partial.size()));
  close(fd);
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(PullNow(shards_[0].get(), 0)->second, (std::vector<float>{0, 0, 0, 0}));
  EXPECT_EQ(shards_[0]->GetStatus().pushes_applied(), 0);
  // The server still serves.
  auto again = Connect();
  reply =
      Call(again.get(), FrameMethod::kPull, 0, proto::PullRequest().SerializeAsString(), {}, &meta);
  EXPECT_EQ(reply.status, 0u) << meta;
}

// A push that announces more bytes than the stripe's values ends the
// connection at once, before the server takes memory for it or waits for the
// bytes; so does a hello longer than a credential.
TEST_F(DataPlaneServerTest, OversizedFramesAreRefusedBeforeAnyMemoryIsTaken) {
  const int fd = RawGreeted();
  ASSERT_GE(fd, 0);
  FrameHeader request;
  request.kind = FrameKind::kRequest;
  request.method = FrameMethod::kPush;
  const std::string meta = PushMeta(0);
  request.meta_size = meta.size();
  request.data_size = 512 << 20;  // The stripe holds 16 bytes.
  char encoded[dataplane::kFrameHeaderBytes];
  dataplane::EncodeFrameHeader(request, encoded);
  const std::string head = std::string(encoded, sizeof(encoded)) + meta;
  ASSERT_EQ(write(fd, head.data(), head.size()), ssize_t(head.size()));
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  char byte;
  EXPECT_EQ(recv(fd, &byte, 1, 0), 0) << "the server did not close the connection";
  close(fd);

  absl::Status greeted;
  auto long_hello = Connect(std::string(5000, 'x'), &greeted);
  EXPECT_FALSE(greeted.ok());
  EXPECT_EQ(shards_[0]->GetStatus().pushes_applied(), 0);
}

// A pull that waits for a version is freed when its connection closes.
TEST_F(DataPlaneServerTest, AWaitingPullIsCancelledWhenItsConnectionCloses) {
  auto connection = Connect();
  SendWaitingPull(connection.get(), 0, 5);  // Version 5 never comes.
  if (HasFatalFailure()) return;
  connection.reset();
  for (int i = 0; i < 100 && shards_[0]->GetStatus().waiting_pulls() != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(shards_[0]->GetStatus().waiting_pulls(), 0);
}

// A waiting pull's thread sleeps until the answer wakes it: a push on
// another connection answers it at once; a pull still waiting when the
// server stops is freed.
TEST_F(DataPlaneServerTest, AWaitingPullIsAnsweredWhenItsVersionComesOrFreedAtStop) {
  auto pulling = Connect();
  SendWaitingPull(pulling.get(), 1, 1);
  if (HasFatalFailure()) return;
  auto pushing = Connect();
  std::string meta;
  FrameHeader reply = Push(pushing.get(), 1, {1, 2, 3, 4}, &meta);
  ASSERT_EQ(reply.status, 0u) << meta;
  ASSERT_TRUE(pulling->ReceiveHeader(&reply, &meta, Soon()).ok());
  ASSERT_EQ(reply.status, 0u) << meta;
  proto::PullHeader pulled;
  ASSERT_TRUE(pulled.ParseFromString(meta));
  EXPECT_EQ(pulled.version(), 1);
  EXPECT_GT(pulled.waited_us(), 0);
  std::vector<float> values(kSize);
  ASSERT_TRUE(
      pulling->ReceiveData({reinterpret_cast<char*>(values.data()), reply.data_size}, Soon()).ok());
  EXPECT_EQ(values, (std::vector<float>{-1, -2, -3, -4}));

  // Another wait, then the server stops under it.
  SendWaitingPull(pulling.get(), 1, 5);
  if (HasFatalFailure()) return;
  const absl::Time start = absl::Now();
  server_.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(shards_[1]->GetStatus().waiting_pulls(), 0);
}

}  // namespace
}  // namespace psrt
