// FreePort: a TCP port on 127.0.0.1 that nothing listens on right now (the
// kernel's choice for a bind to port 0), for tests that start servers at
// addresses they must name beforehand (a cluster spec, a coordinator). Another
// process may take it before the test binds it; the kernel hands ports out
// in turn, so that is rare.
#ifndef PSRT_TESTS_FREE_PORT_H_
#define PSRT_TESTS_FREE_PORT_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

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

}  // namespace psrt

#endif  // PSRT_TESTS_FREE_PORT_H_
