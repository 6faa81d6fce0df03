// FrameConnection and FrameListener over real sockets on 127.0.0.1 and
// abstract Unix sockets: frames gathered from and scattered into the caller's
// memory, and every way a connection fails.
#include "dataplane/frame_connection.h"

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/random_id.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace psrt {
namespace dataplane {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMaxData = 1ull << 30;

absl::Time Soon() { return absl::Now() + absl::Seconds(20); }

// A connected pair through a listener on `address`.
struct Pair {
  std::unique_ptr<FrameListener> listener;
  std::unique_ptr<FrameConnection> client;
  std::unique_ptr<FrameConnection> server;
};

Pair Connect(const std::string& address) {
  Pair pair;
  absl::StatusOr<std::unique_ptr<FrameListener>> listener = FrameListener::Listen(address);
  EXPECT_TRUE(listener.ok()) << listener.status();
  if (!listener.ok()) return pair;
  pair.listener = *std::move(listener);
  absl::StatusOr<std::unique_ptr<FrameConnection>> client =
      FrameConnection::Connect(pair.listener->address(), kMaxData, Soon());
  EXPECT_TRUE(client.ok()) << client.status();
  absl::StatusOr<std::unique_ptr<FrameConnection>> server = pair.listener->Accept(kMaxData);
  EXPECT_TRUE(server.ok()) << server.status();
  if (client.ok()) pair.client = *std::move(client);
  if (server.ok()) pair.server = *std::move(server);
  return pair;
}

std::vector<char> Pattern(size_t n, int seed) {
  std::vector<char> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<char>((i * 131 + seed) & 0xff);
  return bytes;
}

class FrameConnectionTest : public ::testing::TestWithParam<std::string> {
 protected:
  // 127.0.0.1 with a free port, or an abstract socket of its own.
  std::string Address() const {
    return GetParam() == "tcp" ? "127.0.0.1:0"
                               : absl::StrCat("unix-abstract:psrt-test-", NewRandomHexId());
  }
};

// 13 MB gathered from three pieces and received into two destinations of
// other sizes, while the other side sends: the socket fills and drains many
// times over (partial sends, waits for room).
TEST_P(FrameConnectionTest, AFrameGoesFromPiecesToDestinationsByteForByte) {
  Pair pair = Connect(Address());
  ASSERT_TRUE(pair.client && pair.server);
  const std::vector<char> a = Pattern(5'000'001, 1), b = Pattern(7, 2), c = Pattern(7'999'992, 3);
  std::thread sender([&] {
    FrameHeader header;
    header.kind = FrameKind::kRequest;
    header.method = FrameMethod::kPush;
    header.stripe = 1;
    header.request_id = 42;
    const std::vector<absl::Span<const char>> pieces = {a, b, c};
    absl::Status sent = pair.client->Send(header, "meta", pieces, Soon());
    EXPECT_TRUE(sent.ok()) << sent;
  });
  FrameHeader header;
  std::string meta;
  ASSERT_TRUE(pair.server->ReceiveHeader(&header, &meta, Soon()).ok());
  EXPECT_EQ(header.method, FrameMethod::kPush);
  EXPECT_EQ(header.request_id, 42u);
  EXPECT_EQ(header.stripe, 1u);
  EXPECT_EQ(meta, "meta");
  ASSERT_EQ(header.data_size, a.size() + b.size() + c.size());
  std::vector<char> first(6'000'000), second(header.data_size - first.size());
  ASSERT_TRUE(pair.server->ReceiveData(absl::MakeSpan(first), Soon()).ok());
  ASSERT_TRUE(pair.server->ReceiveData(absl::MakeSpan(second), Soon()).ok());
  EXPECT_EQ(pair.server->data_left(), 0u);
  sender.join();
  std::vector<char> expected(a);
  expected.insert(expected.end(), b.begin(), b.end());
  expected.insert(expected.end(), c.begin(), c.end());
  std::vector<char> got(first);
  got.insert(got.end(), second.begin(), second.end());
  EXPECT_TRUE(got == expected);
  // The next frame follows on the same connection; data can be skipped.
  std::thread again(
      [&] { EXPECT_TRUE(pair.client->Send({}, "", {absl::MakeConstSpan(b)}, Soon()).ok()); });
  ASSERT_TRUE(pair.server->ReceiveHeader(&header, &meta, Soon()).ok());
  EXPECT_EQ(header.data_size, b.size());
  EXPECT_TRUE(pair.server->SkipData(b.size(), Soon()).ok());
  again.join();
}

TEST_P(FrameConnectionTest, DeadlinesAndShutdownEndWaits) {
  Pair pair = Connect(Address());
  ASSERT_TRUE(pair.client && pair.server);
  FrameHeader header;
  std::string meta;
  const absl::Time start = absl::Now();
  absl::Status late =
      pair.server->ReceiveHeader(&header, &meta, absl::Now() + absl::Milliseconds(200));
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded) << late;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(190));
  std::thread waker([&] {
    absl::SleepFor(absl::Milliseconds(100));
    pair.server->Shutdown();
  });
  absl::Status woken = pair.server->ReceiveHeader(&header, &meta, absl::InfiniteFuture());
  waker.join();
  EXPECT_EQ(woken.code(), absl::StatusCode::kCancelled) << woken;
  std::thread accept_waker([&] {
    absl::SleepFor(absl::Milliseconds(100));
    pair.listener->Shutdown();
  });
  absl::StatusOr<std::unique_ptr<FrameConnection>> none = pair.listener->Accept(kMaxData);
  accept_waker.join();
  EXPECT_EQ(none.status().code(), absl::StatusCode::kCancelled) << none.status();
}

// WaitForCloseOr wakes for its eventfd, the peer's close and Shutdown, and
// not for data that arrives.
TEST_P(FrameConnectionTest, WaitForCloseOrWakesForTheEventFdACloseOrShutdownOnly) {
  const int wake = eventfd(0, EFD_CLOEXEC);
  ASSERT_GE(wake, 0);
  const uint64_t one = 1;
  for (int way = 0; way < 3; ++way) {
    Pair pair = Connect(Address());
    ASSERT_TRUE(pair.client && pair.server);
    std::thread waker([&] {
      absl::SleepFor(absl::Milliseconds(100));
      // A frame arrives first: no wake-up for it.
      EXPECT_TRUE(pair.client->Send({}, "data", {}, Soon()).ok());
      absl::SleepFor(absl::Milliseconds(100));
      if (way == 0) {
        EXPECT_EQ(write(wake, &one, sizeof(one)), ssize_t(sizeof(one)));
      } else if (way == 1) {
        pair.client.reset();
      } else {
        pair.server->Shutdown();
      }
    });
    const absl::Time start = absl::Now();
    EXPECT_EQ(pair.server->WaitForCloseOr(wake), way == 0) << way;
    EXPECT_GE(absl::Now() - start, absl::Milliseconds(190)) << way;
    waker.join();
    uint64_t count = 0;
    if (way == 0) EXPECT_EQ(read(wake, &count, sizeof(count)), ssize_t(sizeof(count)));
  }
  close(wake);
}

INSTANTIATE_TEST_SUITE_P(TcpAndUnix, FrameConnectionTest, ::testing::Values("tcp", "unix"));

// A FrameConnection on one end of a socket pair, raw bytes on the other.
class RawPeerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int fds[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
    connection_ = std::make_unique<FrameConnection>(fds[0], "the raw peer", 1'000'000);
    raw_ = fds[1];
  }
  void TearDown() override {
    if (raw_ >= 0) close(raw_);
  }
  void Write(absl::string_view bytes) {
    ASSERT_EQ(write(raw_, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }
  std::string Header(uint64_t data_size) {
    FrameHeader header;
    header.data_size = data_size;
    char encoded[kFrameHeaderBytes];
    EncodeFrameHeader(header, encoded);
    return std::string(encoded, kFrameHeaderBytes);
  }
  std::unique_ptr<FrameConnection> connection_;
  int raw_ = -1;
  FrameHeader header_;
  std::string meta_;
};

// The peer goes away in the middle of a frame: the receiver is told how far
// the frame had come, never handed a short frame.
TEST_F(RawPeerTest, APeerThatClosesMidFrameIsUnavailableNamingHowFar) {
  Write(Header(500'000));
  Write(std::string(100'000, 'x'));
  close(raw_);
  raw_ = -1;
  ASSERT_TRUE(connection_->ReceiveHeader(&header_, &meta_, Soon()).ok());
  std::vector<char> into(500'000);
  absl::Status cut = connection_->ReceiveData(absl::MakeSpan(into), Soon());
  EXPECT_EQ(cut.code(), absl::StatusCode::kUnavailable) << cut;
  EXPECT_THAT(std::string(cut.message()),
              HasSubstr("connection with the raw peer broken after 100000 of 500000 bytes of "
                        "a frame's data: closed by the peer"));
}

// Bytes that are not a frame (an HTTP/2 client at the data port) and frames
// over the data limit are refused, naming the peer.
TEST_F(RawPeerTest, BytesThatAreNotAFrameAreRefusedNamingThePeer) {
  Write("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n012345678901234567890123");
  absl::Status refused = connection_->ReceiveHeader(&header_, &meta_, Soon());
  EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("no PSDP magic"));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("(from the raw peer)"));
}

TEST_F(RawPeerTest, AFrameOverTheDataLimitIsRefused) {
  Write(Header(2'000'000));
  absl::Status refused = connection_->ReceiveHeader(&header_, &meta_, Soon());
  EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss) << refused;
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr("data of 2000000 bytes, more than the limit of 1000000"));
}

TEST(FrameConnectionErrorsTest, ConnectingToNothingFailsAtTheDeadline) {
  absl::StatusOr<std::unique_ptr<FrameListener>> listener = FrameListener::Listen("127.0.0.1:0");
  ASSERT_TRUE(listener.ok());
  const std::string address = (*listener)->address();
  listener->reset();  // Nothing listens there now.
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<FrameConnection>> none =
      FrameConnection::Connect(address, kMaxData, absl::Now() + absl::Milliseconds(300));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kDeadlineExceeded) << none.status();
  EXPECT_THAT(std::string(none.status().message()),
              HasSubstr("cannot connect to " + address + ": Connection refused"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

}  // namespace
}  // namespace dataplane
}  // namespace psrt
