// Test helpers that read a Prometheus endpoint the way Prometheus does: a
// plain HTTP GET, and the value of one series of the text format.
#ifndef PSRT_TESTS_COMMON_PROMETHEUS_SCRAPE_H_
#define PSRT_TESTS_COMMON_PROMETHEUS_SCRAPE_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <string>

#include "absl/strings/numbers.h"
#include "gtest/gtest.h"

namespace psrt {

// GET http://127.0.0.1:port/path with a plain socket, as Prometheus would
// scrape it; the whole response, headers included.
inline std::string HttpGet(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ADD_FAILURE() << "cannot connect to port " << port << ": " << std::strerror(errno);
    ::close(fd);
    return "";
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  EXPECT_EQ(::send(fd, request.data(), request.size(), 0),
            static_cast<ssize_t>(request.size()));
  std::string response;
  char buffer[4096];
  ssize_t n;
  while ((n = ::recv(fd, buffer, sizeof(buffer), 0)) > 0) response.append(buffer, n);
  ::close(fd);
  return response;
}

// The value of one series ("name{labels}") in a text-format scrape; NaN
// (and a test failure) when it is not there.
inline double Sample(const std::string& scrape, const std::string& series) {
  const std::string prefix = "\n" + series + " ";
  const size_t at = scrape.find(prefix);
  if (at == std::string::npos) {
    ADD_FAILURE() << series << " not in:\n" << scrape;
    return std::numeric_limits<double>::quiet_NaN();
  }
  const size_t begin = at + prefix.size();
  double value = 0;
  EXPECT_TRUE(absl::SimpleAtod(scrape.substr(begin, scrape.find('\n', begin) - begin), &value));
  return value;
}

}  // namespace psrt

#endif  // PSRT_TESTS_COMMON_PROMETHEUS_SCRAPE_H_
