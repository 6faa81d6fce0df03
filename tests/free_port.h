// FreePort: a TCP port on 127.0.0.1 that nothing listens on right now (the
// kernel's choice for a bind to port 0), for tests that start servers at
// addresses they must name beforehand (a cluster spec, a coordinator). Another
// process may take it before the test binds it; the kernel hands ports out
// in turn, so that is rare. FreePortRun(n): the first of n consecutive free
// ports (for tasks that serve at a base port plus their local rank), below
// the kernel's ephemeral range, so that no bind to port 0 or outgoing
// connection of another test takes one of them meanwhile.
// SilentListener: a port that something listens on and never answers.
#ifndef PSRT_TESTS_FREE_PORT_H_
#define PSRT_TESTS_FREE_PORT_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <vector>

namespace psrt {

inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// A socket bound to 127.0.0.1:port, or -1.
inline int BindLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

inline int FreePortRun(int n) {
  int ephemeral_low = 32768;  // /proc/sys/net/ipv4/ip_local_port_range's first.
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> ephemeral_low;
  const int lowest = 10000;
  std::mt19937 random(std::random_device{}());
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int base = ephemeral_low - n > lowest
                         ? std::uniform_int_distribution<int>(lowest, ephemeral_low - n)(random)
                         : FreePort();
    if (base == 0 || base + n - 1 > 65535) continue;
    std::vector<int> held;  // All n bound at once: free together.
    for (int i = 0; i < n; ++i) {
      const int fd = BindLoopback(base + i);
      if (fd < 0) break;
      held.push_back(fd);
    }
    const bool all = static_cast<int>(held.size()) == n;
    for (int fd : held) close(fd);
    if (all) return base;
  }
  return 0;
}

// A socket listening on a free port of 127.0.0.1 that takes connections and
// never answers (a server there would hang its clients), closed on
// destruction.
class SilentListener {
 public:
  SilentListener() : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && listen(fd_, 8) == 0 &&
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port_ = ntohs(addr.sin_port);
    }
  }
  ~SilentListener() { close(fd_); }
  SilentListener(const SilentListener&) = delete;
  SilentListener& operator=(const SilentListener&) = delete;
  // 0 when it could not listen.
  int port() const { return port_; }

 private:
  const int fd_;
  int port_ = 0;
};

}  // namespace psrt

#endif  // PSRT_TESTS_FREE_PORT_H_
