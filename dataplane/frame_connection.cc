#include "dataplane/frame_connection.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/backoff.h"
#include "common/cluster_spec.h"
#include "common/random_id.h"
#include "glog/logging.h"

namespace psrt {
namespace dataplane {
namespace {

constexpr absl::string_view kUnixAbstract = "unix-abstract:";

std::string ErrnoText(int error) { return std::strerror(error); }

// A socket address for `address`: "unix-abstract:NAME", or "host:port"
// resolved (every result, in the resolver's order), for `passive`
// (listening) or not.
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
  int family = AF_UNSPEC;
};

absl::StatusOr<std::vector<SocketAddress>> Resolve(const std::string& address, bool passive) {
  SocketAddress result;
  if (absl::StartsWith(address, kUnixAbstract)) {
    const std::string name = address.substr(kUnixAbstract.size());
    sockaddr_un un{};
    if (name.empty() || name.size() + 1 > sizeof(un.sun_path)) {
      return absl::InvalidArgumentError(absl::StrCat("bad data-plane address \"", address,
                                                     "\": an abstract socket name of 1..",
                                                     sizeof(un.sun_path) - 1, " bytes"));
    }
    un.sun_family = AF_UNIX;
    std::memcpy(un.sun_path + 1, name.data(), name.size());  // sun_path[0] = 0: abstract.
    std::memcpy(&result.storage, &un, sizeof(un));
    result.length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    result.family = AF_UNIX;
    return std::vector<SocketAddress>{result};
  }
  std::string host;
  int port = 0;
  absl::Status split = SplitHostPort(address, &host, &port);
  if (!split.ok() && !(passive && absl::EndsWith(address, ":0"))) return split;
  if (!split.ok()) host = address.substr(0, address.rfind(':'));  // Port 0: any.
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int error = getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (error != 0 || found == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("data plane: cannot resolve \"", host, "\": ", gai_strerror(error)));
  }
  std::vector<SocketAddress> results;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    std::memcpy(&result.storage, a->ai_addr, a->ai_addrlen);
    result.length = a->ai_addrlen;
    result.family = a->ai_family;
    results.push_back(result);
  }
  freeaddrinfo(found);
  return results;
}

// Connects a non-blocking stream socket to `to` by `deadline`: the socket,
// or -1 with `*error` set (ETIMEDOUT past the deadline).
int ConnectOne(const SocketAddress& to, absl::Time deadline, int* error) {
  const int fd = socket(to.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *error = errno;
    return -1;
  }
  *error = 0;
  if (connect(fd, reinterpret_cast<const sockaddr*>(&to.storage), to.length) != 0) {
    *error = errno;
    if (*error == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int ready = -1;
      do {
        const absl::Duration left = deadline - absl::Now();
        const int ms = left == absl::InfiniteDuration()
                           ? -1
                           : static_cast<int>(std::clamp<int64_t>(
                                 absl::ToInt64Milliseconds(left) + 1, 0, INT_MAX));
        ready = poll(&p, 1, ms);
      } while (ready < 0 && errno == EINTR);
      socklen_t length = sizeof(*error);
      if (ready == 1) {
        getsockopt(fd, SOL_SOCKET, SO_ERROR, error, &length);
      } else {
        *error = ETIMEDOUT;
      }
    }
  }
  if (*error != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string Describe(const sockaddr_storage& storage) {
  char text[INET6_ADDRSTRLEN] = {};
  if (storage.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&storage);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    return absl::StrCat(text, ":", ntohs(in->sin_port));
  }
  if (storage.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&storage);
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    return absl::StrCat("[", text, "]:", ntohs(in6->sin6_port));
  }
  return "a local peer";
}

void ConfigureStream(int fd, int family) {
  if (family == AF_INET || family == AF_INET6) {
    const int on = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    // A peer whose host died leaves no FIN: keepalive probes find it within
    // about two minutes (60 s idle, then 6 probes 10 s apart), so that its
    // connection, thread and buffers are freed.
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
    const int idle = 60, interval = 10, probes = 6;
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes));
  }
}

}  // namespace

std::string NewLocalDataPlaneAddress(int task_port) {
  return absl::StrCat(kUnixAbstract, "psrt-data-", task_port, "-", NewRandomHexId());
}

FrameConnection::FrameConnection(int fd, std::string peer, uint64_t max_data_bytes)
    : fd_(fd), peer_(std::move(peer)), max_data_bytes_(max_data_bytes) {}

FrameConnection::~FrameConnection() { close(fd_); }

absl::StatusOr<std::unique_ptr<FrameConnection>> FrameConnection::Connect(
    const std::string& address, uint64_t max_data_bytes, absl::Time deadline) {
  absl::StatusOr<std::vector<SocketAddress>> to = Resolve(address, /*passive=*/false);
  if (!to.ok()) return to.status();
  Backoff backoff(absl::Milliseconds(20), absl::Milliseconds(500));
  while (true) {
    // Every address the name resolves to, in turn (as gRPC does); with
    // several, none may take more than 2 s of the deadline.
    int error = 0;
    for (const SocketAddress& one : *to) {
      const absl::Time until =
          to->size() > 1 ? std::min(deadline, absl::Now() + absl::Seconds(2)) : deadline;
      const int fd = ConnectOne(one, until, &error);
      if (fd >= 0) {
        ConfigureStream(fd, one.family);
        return std::make_unique<FrameConnection>(fd, address, max_data_bytes);
      }
    }
    const bool retry = error == ECONNREFUSED || error == ENOENT || error == EAGAIN;
    if (!retry || absl::Now() + backoff.Peek() >= deadline) {
      return error == ETIMEDOUT || retry
                 ? absl::DeadlineExceededError(absl::StrCat("data plane: cannot connect to ",
                                                            address, ": ", ErrnoText(error)))
                 : absl::UnavailableError(absl::StrCat("data plane: cannot connect to ", address,
                                                       ": ", ErrnoText(error)));
    }
    absl::SleepFor(backoff.Next());
  }
}

absl::Status FrameConnection::Broken(absl::string_view what, int error) {
  broken_ = true;
  if (shut_down_.load()) {
    return absl::CancelledError(
        absl::StrCat("data plane: connection with ", peer_, " shut down ", what));
  }
  return absl::UnavailableError(absl::StrCat("data plane: connection with ", peer_, " broken ",
                                             what, ": ",
                                             error == 0 ? "closed by the peer" : ErrnoText(error)));
}

absl::Status FrameConnection::Wait(short events, absl::Time deadline, absl::string_view what) {
  while (true) {
    if (shut_down_.load()) {
      broken_ = true;
      return absl::CancelledError(
          absl::StrCat("data plane: connection with ", peer_, " shut down ", what));
    }
    pollfd p{fd_, events, 0};
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      broken_ = true;
      return absl::DeadlineExceededError(
          absl::StrCat("data plane: ", peer_, " made no progress ", what, " by the deadline"));
    }
    const int ms =
        left == absl::InfiniteDuration()
            ? -1
            : static_cast<int>(std::min<int64_t>(INT_MAX, absl::ToInt64Milliseconds(left) + 1));
    const int ready = poll(&p, 1, ms);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return Broken(what, errno);
    if (shut_down_.load()) continue;  // Reported above.
    if (ready == 1) return absl::OkStatus();
  }
}

absl::Status FrameConnection::Send(FrameHeader header, absl::string_view meta,
                                   absl::Span<const absl::Span<const char>> data,
                                   absl::Time deadline) {
  if (meta.size() > kMaxMetaBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data plane: a frame's metadata is ", meta.size(), " bytes, more than the limit of ",
        kMaxMetaBytes, " (a shard of very many variables: use more ps tasks or --ps_stripes)"));
  }
  header.meta_size = static_cast<uint32_t>(meta.size());
  header.data_size = 0;
  for (const absl::Span<const char>& piece : data) header.data_size += piece.size();
  char encoded[kFrameHeaderBytes];
  EncodeFrameHeader(header, encoded);
  std::vector<iovec> pieces;
  pieces.reserve(2 + data.size());
  pieces.push_back({encoded, kFrameHeaderBytes});
  if (!meta.empty()) pieces.push_back({const_cast<char*>(meta.data()), meta.size()});
  for (const absl::Span<const char>& piece : data) {
    if (!piece.empty()) pieces.push_back({const_cast<char*>(piece.data()), piece.size()});
  }
  size_t next = 0;  // The first piece not fully sent.
  while (next < pieces.size()) {
    msghdr message{};
    message.msg_iov = pieces.data() + next;
    message.msg_iovlen = std::min<size_t>(pieces.size() - next, IOV_MAX);
    const ssize_t sent = sendmsg(fd_, &message, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (absl::Status s = Wait(POLLOUT, deadline, "sending a frame"); !s.ok()) return s;
        continue;
      }
      return Broken("sending a frame", errno);
    }
    size_t left = static_cast<size_t>(sent);
    while (left > 0 && left >= pieces[next].iov_len) left -= pieces[next++].iov_len;
    if (left > 0) {
      pieces[next].iov_base = static_cast<char*>(pieces[next].iov_base) + left;
      pieces[next].iov_len -= left;
    }
  }
  return absl::OkStatus();
}

absl::Status FrameConnection::ReadFully(absl::Span<char> into, absl::Time deadline,
                                        absl::string_view what) {
  size_t done = 0;
  while (done < into.size()) {
    const ssize_t n = recv(fd_, into.data() + done, into.size() - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      return Broken(absl::StrCat("after ", done, " of ", into.size(), " bytes of ", what), 0);
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (absl::Status s = Wait(POLLIN, deadline, absl::StrCat("receiving ", what)); !s.ok()) {
        return s;
      }
      continue;
    }
    return Broken(absl::StrCat("after ", done, " of ", into.size(), " bytes of ", what), errno);
  }
  return absl::OkStatus();
}

absl::Status FrameConnection::ReceiveHeader(FrameHeader* header, std::string* meta,
                                            absl::Time deadline) {
  if (data_left_ != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data plane: ", data_left_, " bytes of the last frame from ", peer_, " not read"));
  }
  char encoded[kFrameHeaderBytes];
  if (absl::Status s = ReadFully(absl::MakeSpan(encoded), deadline, "a frame header"); !s.ok()) {
    return s;
  }
  if (absl::Status s = DecodeFrameHeader(encoded, max_data_bytes_, header); !s.ok()) {
    broken_ = true;
    return absl::DataLossError(absl::StrCat(s.message(), " (from ", peer_, ")"));
  }
  if (header->meta_size > max_meta_bytes_) {
    broken_ = true;
    return absl::DataLossError(absl::StrCat("data-plane frame: metadata of ", header->meta_size,
                                            " bytes, more than the limit of ", max_meta_bytes_,
                                            " here (from ", peer_, ")"));
  }
  meta->resize(header->meta_size);
  if (absl::Status s = ReadFully(absl::MakeSpan(*meta), deadline, "a frame's metadata"); !s.ok()) {
    return s;
  }
  data_left_ = header->data_size;
  return absl::OkStatus();
}

absl::Status FrameConnection::WaitForFrame(absl::Time deadline) {
  if (absl::Time now = absl::Now(); deadline <= now) {
    deadline = now;  // Still looks once.
  }
  while (true) {
    if (shut_down_.load()) {
      broken_ = true;
      return absl::CancelledError(
          absl::StrCat("data plane: connection with ", peer_, " shut down waiting for a frame"));
    }
    pollfd p{fd_, POLLIN, 0};
    const int64_t ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
    const int ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(ms, INT_MAX)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return Broken("waiting for a frame", errno);
    if (shut_down_.load()) continue;  // Reported above.
    if (ready == 1) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("data plane: no frame from ", peer_, " by the deadline"));
    }
  }
}

absl::Status FrameConnection::ReceiveData(absl::Span<char> into, absl::Time deadline) {
  if (into.size() > data_left_) {
    return absl::InvalidArgumentError(absl::StrCat("data plane: the frame from ", peer_, " has ",
                                                   data_left_, " bytes of data left, not ",
                                                   into.size()));
  }
  data_left_ -= into.size();
  return ReadFully(into, deadline, "a frame's data");
}

absl::Status FrameConnection::SkipData(uint64_t n, absl::Time deadline) {
  char scratch[64 * 1024];
  while (n > 0) {
    const size_t piece = static_cast<size_t>(std::min<uint64_t>(n, sizeof(scratch)));
    if (absl::Status s = ReceiveData(absl::MakeSpan(scratch, piece), deadline); !s.ok()) {
      return s;
    }
    n -= piece;
  }
  return absl::OkStatus();
}

bool FrameConnection::WaitForCloseOr(int wake_fd) const {
  pollfd p[2] = {{wake_fd, POLLIN, 0}, {fd_, POLLRDHUP, 0}};
  while (true) {
    const int ready = poll(p, 2, -1);  // Shutdown's shutdown() wakes it.
    if (ready < 0 && errno == EINTR) continue;
    if (ready > 0 && p[0].revents != 0) return true;
    if (ready < 0 || (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0) {
      return false;
    }
  }
}

void FrameConnection::Shutdown() {
  shut_down_.store(true);
  shutdown(fd_, SHUT_RDWR);  // Wakes a poll on it.
}

absl::StatusOr<std::unique_ptr<FrameListener>> FrameListener::Listen(const std::string& address) {
  // The first address the host resolves to (its workers try every one).
  absl::StatusOr<std::vector<SocketAddress>> all = Resolve(address, /*passive=*/true);
  if (!all.ok()) return all.status();
  const SocketAddress* at = &all->front();
  const int fd = socket(at->family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("data plane: no socket for ", address, ": ", ErrnoText(errno)));
  }
  const int on = 1;
  if (at->family != AF_UNIX) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  if (bind(fd, reinterpret_cast<const sockaddr*>(&at->storage), at->length) != 0 ||
      listen(fd, 128) != 0) {
    const int error = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("data plane: cannot listen on ", address, ": ", ErrnoText(error)));
  }
  std::string actual = address;
  if (at->family != AF_UNIX) {
    sockaddr_storage bound{};
    socklen_t length = sizeof(bound);
    getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
    const int port =
        ntohs(bound.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&bound)->sin_port
                                         : reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
    actual = absl::StrCat(address.substr(0, address.rfind(':')), ":", port);
  }
  const int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd < 0) {
    const int error = errno;
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("data plane: no eventfd for ", address, ": ", ErrnoText(error)));
  }
  return std::unique_ptr<FrameListener>(new FrameListener(fd, wake_fd, std::move(actual)));
}

FrameListener::~FrameListener() {
  close(fd_);
  close(wake_fd_);
}

absl::StatusOr<std::unique_ptr<FrameConnection>> FrameListener::Accept(uint64_t max_data_bytes) {
  while (true) {
    if (shut_down_.load()) {
      return absl::CancelledError(absl::StrCat("data plane: listener on ", address_, " shut down"));
    }
    sockaddr_storage peer{};
    socklen_t length = sizeof(peer);
    const int fd =
        accept4(fd_, reinterpret_cast<sockaddr*>(&peer), &length, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      ConfigureStream(fd, peer.ss_family);
      return std::make_unique<FrameConnection>(fd, Describe(peer), max_data_bytes);
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) {
      pollfd p[2] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      poll(p, 2, -1);
      continue;
    }
    if (shut_down_.load()) continue;
    // Out of descriptors or memory, or a network error pending on the new
    // connection (accept(2) says to treat those as EAGAIN): log, wait, and
    // go on accepting; the listener itself is fine.
    const int error = errno;
    if (error == EBADF || error == EINVAL || error == ENOTSOCK || error == EOPNOTSUPP) {
      return absl::UnavailableError(
          absl::StrCat("data plane: accept on ", address_, " failed: ", ErrnoText(error)));
    }
    LOG_EVERY_T(WARNING, 10) << "data plane: accept on " << address_ << ": " << ErrnoText(error)
                             << "; retrying";
    pollfd p{wake_fd_, POLLIN, 0};
    poll(&p, 1, 100);
  }
}

void FrameListener::Shutdown() {
  shut_down_.store(true);
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));  // Wakes Accept's poll, now or later.
}

}  // namespace dataplane
}  // namespace psrt
