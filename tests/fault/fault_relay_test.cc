#include "tests/fault/fault_relay.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace psrt {
namespace {

// A socket on 127.0.0.1 whose blocking reads give up after 10 s, so that a
// broken relay fails a test instead of hanging it.
int NewSocket() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  return fd;
}

sockaddr_in Loopback(int port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return address;
}

int Connect(int port) {
  const int fd = NewSocket();
  sockaddr_in address = Loopback(port);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0)
      << strerror(errno);
  return fd;
}

void SendAll(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    ASSERT_GT(n, 0) << strerror(errno);
    sent += n;
  }
}

// Reads exactly `size` bytes; fewer if the stream ends or fails first, with
// the failing read's errno in *error (0 for a clean end of stream).
std::string ReceiveExactly(int fd, size_t size, int* error = nullptr) {
  std::string out(size, '\0');
  size_t got = 0;
  while (got < size) {
    const ssize_t n = recv(fd, out.data() + got, size - got, 0);
    if (n <= 0) {
      if (error != nullptr) *error = n < 0 ? errno : 0;
      break;
    }
    got += n;
  }
  out.resize(got);
  return out;
}

// Outcome of one read that should fail: errno, or 0 for end of stream.
int ReadOutcome(int fd) {
  char byte;
  const ssize_t n = recv(fd, &byte, 1, 0);
  if (n > 0) return -1;  // Data: no fault seen.
  return n == 0 ? 0 : errno;
}

// A TCP server on 127.0.0.1 that echoes every connection, or (reset_after_read)
// reads once and answers with an RST.
class EchoServer {
 public:
  explicit EchoServer(bool reset_after_read = false) : reset_after_read_(reset_after_read) {
    listen_fd_ = NewSocket();
    sockaddr_in address = Loopback(0);
    EXPECT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    EXPECT_EQ(listen(listen_fd_, 16), 0);
    socklen_t length = sizeof(address);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    acceptor_ = std::thread([this] { AcceptLoop(); });
  }
  ~EchoServer() {
    shutdown(listen_fd_, SHUT_RDWR);  // Unblocks accept().
    acceptor_.join();
    for (std::thread& t : connections_) t.join();
    close(listen_fd_);
  }
  int port() const { return port_; }
  // errno of the last connection's failed read or write; 0 when every one
  // ended cleanly.
  int last_error() {
    absl::MutexLock lock(&mu_);
    return last_error_;
  }

 private:
  void AcceptLoop() {
    while (true) {
      const int fd = accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) return;
      connections_.emplace_back([this, fd] { Serve(fd); });
    }
  }
  void Serve(int fd) {
    char buffer[8192];
    while (true) {
      const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
      if (n < 0) {
        absl::MutexLock lock(&mu_);
        last_error_ = errno;
      }
      if (n <= 0) break;
      if (reset_after_read_) {
        linger hard{1, 0};
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof(hard));
        break;
      }
      if (send(fd, buffer, n, MSG_NOSIGNAL) != n) break;
    }
    close(fd);
  }

  const bool reset_after_read_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread acceptor_;
  std::vector<std::thread> connections_;  // Only the acceptor adds.
  absl::Mutex mu_;
  int last_error_ ABSL_GUARDED_BY(mu_) = 0;
};

std::unique_ptr<FaultRelay> StartRelay(int target_port, FaultRelay::Options options = {}) {
  options.target_port = target_port;
  auto relay = FaultRelay::Start(options);
  EXPECT_TRUE(relay.ok()) << relay.status();
  return relay.ok() ? std::move(*relay) : nullptr;
}

TEST(FaultRelayTest, ForwardsBytesIntactAndInOrderDespiteJitter) {
  EchoServer server;
  FaultRelay::Options options;
  options.delay = absl::Milliseconds(4);
  options.jitter = absl::Milliseconds(4);
  std::unique_ptr<FaultRelay> relay = StartRelay(server.port(), options);
  ASSERT_NE(relay, nullptr);
  const int fd = Connect(relay->port());

  // 4 MB in writes of random sizes, each delayed by a random 0-8 ms: any
  // reordering or loss shows in the comparison.
  std::mt19937 random(42);
  std::string sent(4 << 20, '\0');
  for (char& c : sent) c = static_cast<char>(random());
  std::thread writer([&] {
    std::mt19937 sizes(7);
    for (size_t at = 0; at < sent.size();) {
      const size_t n = std::min<size_t>(sent.size() - at, 1 + sizes() % 100000);
      SendAll(fd, sent.substr(at, n));
      at += n;
    }
    shutdown(fd, SHUT_WR);
  });
  const std::string received = ReceiveExactly(fd, sent.size());
  writer.join();
  EXPECT_TRUE(received == sent) << "received " << received.size() << " of " << sent.size()
                                << " bytes, or out of order";
  // The echo server closes after our FIN: the relay passes its FIN back.
  EXPECT_EQ(ReadOutcome(fd), 0);
  close(fd);
  const FaultRelay::Stats stats = relay->stats();
  EXPECT_EQ(stats.bytes_forwarded, 2 * static_cast<int64_t>(sent.size()));
  EXPECT_EQ(stats.connections, 1);
  EXPECT_EQ(stats.resets + stats.closes + stats.stalls, 0);
}

TEST(FaultRelayTest, DelaysEveryChunkBothWays) {
  EchoServer server;
  FaultRelay::Options options;
  options.delay = absl::Milliseconds(100);
  std::unique_ptr<FaultRelay> relay = StartRelay(server.port(), options);
  ASSERT_NE(relay, nullptr);
  const int fd = Connect(relay->port());
  for (const std::string message : {"ping", "pong"}) {
    const absl::Time start = absl::Now();
    SendAll(fd, message);
    EXPECT_EQ(ReceiveExactly(fd, message.size()), message);
    const absl::Duration round_trip = absl::Now() - start;
    EXPECT_GE(round_trip, absl::Milliseconds(200));  // 100 ms up, 100 ms down.
    EXPECT_LT(round_trip, absl::Seconds(3));         // Generous: a loaded machine.
  }
  close(fd);
}

TEST(FaultRelayTest, ResetIsSeenAsConnectionResetByBothPeers) {
  EchoServer server;
  std::unique_ptr<FaultRelay> relay = StartRelay(server.port());
  ASSERT_NE(relay, nullptr);
  const int fd = Connect(relay->port());
  SendAll(fd, "hello");
  ASSERT_EQ(ReceiveExactly(fd, 5), "hello");
  relay->InjectAll(FaultRelay::Fault::kReset);
  EXPECT_EQ(ReadOutcome(fd), ECONNRESET);
  close(fd);
  EXPECT_EQ(relay->stats().resets, 1);
  for (int i = 0; i < 100 && server.last_error() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(server.last_error(), ECONNRESET);
}

TEST(FaultRelayTest, CloseIsSeenAsEndOfStream) {
  EchoServer server;
  std::unique_ptr<FaultRelay> relay = StartRelay(server.port());
  ASSERT_NE(relay, nullptr);
  const int fd = Connect(relay->port());
  SendAll(fd, "hello");
  ASSERT_EQ(ReceiveExactly(fd, 5), "hello");
  relay->InjectAll(FaultRelay::Fault::kClose);
  EXPECT_EQ(ReadOutcome(fd), 0);
  close(fd);
  EXPECT_EQ(relay->stats().closes, 1);
}

TEST(FaultRelayTest, RandomResetHitsAChunkInFlightAndRespectsMaxFaults) {
  EchoServer server;
  FaultRelay::Options options;
  options.reset_probability = 1;  // The first chunk forwarded...
  options.max_faults = 1;         // ...and no other.
  std::unique_ptr<FaultRelay> relay = StartRelay(server.port(), options);
  ASSERT_NE(relay, nullptr);
  const int first = Connect(relay->port());
  SendAll(first, "lost");
  EXPECT_EQ(ReadOutcome(first), ECONNRESET);
  close(first);
  const int second = Connect(relay->port());
  SendAll(second, "kept");
  EXPECT_EQ(ReceiveExactly(second, 4), "kept");
  close(second);
  const FaultRelay::Stats stats = relay->stats();
  EXPECT_EQ(stats.resets, 1);
  EXPECT_EQ(stats.connections, 2);
}

TEST(FaultRelayTest, FaultOnNextChunkPicksItsDirectionAndSize) {
  EchoServer server;
  std::unique_ptr<FaultRelay> relay = StartRelay(server.port());
  ASSERT_NE(relay, nullptr);
  const std::string large(200000, 'x');
  {
    // Armed for a large reply: the small exchange passes, the large request
    // passes, its echo is cut.
    relay->InjectOnNextChunk(FaultRelay::Fault::kReset,
                             FaultRelay::Direction::kTargetToClient, 1000);
    const int fd = Connect(relay->port());
    SendAll(fd, "small");
    EXPECT_EQ(ReceiveExactly(fd, 5), "small");
    SendAll(fd, large);
    int error = 0;
    EXPECT_LT(ReceiveExactly(fd, large.size(), &error).size(), large.size());
    EXPECT_EQ(error, ECONNRESET);
    close(fd);
    EXPECT_EQ(relay->stats().resets, 1);
  }
  {
    // Armed for a large request, to close: nothing of it reaches the target.
    relay->InjectOnNextChunk(FaultRelay::Fault::kClose,
                             FaultRelay::Direction::kClientToTarget, 1000);
    const int fd = Connect(relay->port());
    SendAll(fd, "small");
    EXPECT_EQ(ReceiveExactly(fd, 5), "small");
    send(fd, large.data(), large.size(), MSG_NOSIGNAL);  // May fail midway.
    int error = -1;
    EXPECT_EQ(ReceiveExactly(fd, 1, &error), "");
    EXPECT_TRUE(error == 0 || error == ECONNRESET) << strerror(error);
    close(fd);
    EXPECT_EQ(relay->stats().closes, 1);
  }
}

TEST(FaultRelayTest, TimedResetsEndLongConnections) {
  EchoServer server;
  FaultRelay::Options options;
  options.reset_every = absl::Milliseconds(200);
  std::unique_ptr<FaultRelay> relay = StartRelay(server.port(), options);
  ASSERT_NE(relay, nullptr);
  const int fd = Connect(relay->port());
  SendAll(fd, "x");
  ASSERT_EQ(ReceiveExactly(fd, 1), "x");
  int error = 0;
  const absl::Time start = absl::Now();
  EXPECT_EQ(ReceiveExactly(fd, 1, &error), "");  // Nothing comes; the reset does.
  EXPECT_EQ(error, ECONNRESET);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  close(fd);
}

TEST(FaultRelayTest, StallHoldsBytesThenDeliversThem) {
  EchoServer server;
  std::unique_ptr<FaultRelay> relay = StartRelay(server.port());
  ASSERT_NE(relay, nullptr);
  const int fd = Connect(relay->port());
  SendAll(fd, "before");
  ASSERT_EQ(ReceiveExactly(fd, 6), "before");
  const absl::Time start = absl::Now();
  relay->StallAll(absl::Milliseconds(600));
  absl::SleepFor(absl::Milliseconds(50));  // The relay has taken the request.
  SendAll(fd, "during");
  EXPECT_EQ(ReceiveExactly(fd, 6), "during");
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(600));
  close(fd);
  EXPECT_EQ(relay->stats().stalls, 1);
  EXPECT_EQ(relay->stats().resets, 0);
}

TEST(FaultRelayTest, TargetResetIsPassedOnToTheClient) {
  EchoServer server(/*reset_after_read=*/true);
  std::unique_ptr<FaultRelay> relay = StartRelay(server.port());
  ASSERT_NE(relay, nullptr);
  const int fd = Connect(relay->port());
  SendAll(fd, "hello");
  EXPECT_EQ(ReadOutcome(fd), ECONNRESET);
  close(fd);
  EXPECT_EQ(relay->stats().resets, 0);  // Not a fault of the relay's.
}

TEST(FaultRelayTest, RefusedTargetResetsTheClient) {
  // A port nobody listens on: bind a socket, read its port, close it.
  const int probe = NewSocket();
  sockaddr_in address = Loopback(0);
  ASSERT_EQ(bind(probe, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  socklen_t length = sizeof(address);
  getsockname(probe, reinterpret_cast<sockaddr*>(&address), &length);
  close(probe);
  std::unique_ptr<FaultRelay> relay = StartRelay(ntohs(address.sin_port));
  ASSERT_NE(relay, nullptr);
  const int fd = Connect(relay->port());
  EXPECT_EQ(ReadOutcome(fd), ECONNRESET);
  close(fd);
}

TEST(FaultRelayTest, RefusesBadOptionsNamingThem) {
  auto refused = [](FaultRelay::Options options, const std::string& named) {
    auto relay = FaultRelay::Start(options);
    ASSERT_FALSE(relay.ok());
    EXPECT_EQ(relay.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(relay.status().message().find(named), std::string::npos) << relay.status();
  };
  FaultRelay::Options options;
  options.target_port = 1;
  refused([&] { auto o = options; o.target_port = 0; return o; }(), "target port 0");
  refused([&] { auto o = options; o.jitter = absl::Milliseconds(5); return o; }(), "jitter");
  refused([&] { auto o = options; o.reset_probability = 1.5; return o; }(), "reset probability");
  refused([&] { auto o = options; o.close_probability = -1; return o; }(), "close probability");
  refused([&] { auto o = options; o.target_host = "no.such.host.invalid"; return o; }(),
          "no.such.host.invalid");
}

}  // namespace
}  // namespace psrt
