#include "tests/fault/fault_relay.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace psrt {
namespace {

constexpr size_t kReadBytes = 64 << 10;

std::string ErrnoText(int error) { return std::strerror(error); }

void SetNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Closes `fd` so that the peer gets an RST instead of a FIN.
void CloseWithReset(int fd) {
  linger hard{/*l_onoff=*/1, /*l_linger=*/0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof(hard));
  close(fd);
}

// Sends FIN, discards what the peer had already sent (unread bytes would turn
// the close into an RST), and closes.
void CloseGracefully(int fd) {
  shutdown(fd, SHUT_WR);
  char sink[4096];
  while (read(fd, sink, sizeof(sink)) > 0) {
  }
  close(fd);
}

absl::StatusOr<sockaddr_storage> Resolve(const std::string& what, const std::string& host,
                                         int port, socklen_t* length) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int error = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (error != 0 || found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, " host \"", host,
                                                   "\" does not resolve: ", gai_strerror(error)));
  }
  sockaddr_storage address{};
  std::memcpy(&address, found->ai_addr, found->ai_addrlen);
  *length = found->ai_addrlen;
  freeaddrinfo(found);
  return address;
}

std::string PeerName(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return "?";
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (address.ss_family == AF_INET) {
    auto* v4 = reinterpret_cast<sockaddr_in*>(&address);
    inet_ntop(AF_INET, &v4->sin_addr, host, sizeof(host));
    port = ntohs(v4->sin_port);
  } else if (address.ss_family == AF_INET6) {
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&address);
    inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof(host));
    port = ntohs(v6->sin6_port);
  }
  return absl::StrCat(host, ":", port);
}

}  // namespace

// The poll loop. Everything here runs on the relay's thread only.
class FaultRelay::Loop {
 public:
  Loop(FaultRelay* relay, int listen_fd, int wake_fd[2], sockaddr_storage target,
       socklen_t target_length)
      : relay_(relay),
        options_(relay->options_),
        listen_fd_(listen_fd),
        wake_read_(wake_fd[0]),
        wake_write_(wake_fd[1]),
        target_(target),
        target_length_(target_length),
        random_(options_.seed) {
    const absl::Time now = absl::Now();
    next_reset_ = options_.reset_every > absl::ZeroDuration() ? now + options_.reset_every
                                                              : absl::InfiniteFuture();
    next_stall_ = options_.stall_every > absl::ZeroDuration() ? now + options_.stall_every
                                                              : absl::InfiniteFuture();
  }
  ~Loop() {
    for (auto& c : connections_) {
      if (c->open) EndGracefully(*c);
    }
    close(listen_fd_);
    close(wake_read_);
    close(wake_write_);
  }

  int wake_fd() const { return wake_write_; }
  void Run();

 private:
  struct Chunk {
    absl::Time release;
    std::string bytes;
    size_t written = 0;
  };
  // Bytes travelling from one socket to the other.
  struct Flow {
    std::deque<Chunk> queue;
    int64_t buffered = 0;
    absl::Time last_release = absl::InfinitePast();
    bool eof = false;  // The sender closed its side.
    bool shut = false;  // The FIN was passed on.
  };
  struct Connection {
    int id = 0;
    int client = -1;
    int server = -1;
    bool connected = false;  // To the target.
    bool open = true;
    std::string client_name;
    Flow up;    // client -> server
    Flow down;  // server -> client
    int64_t bytes_up = 0, bytes_down = 0;
  };
  // A fault waiting for the next chunk of at least min_bytes in direction.
  struct ArmedFault {
    Fault fault;
    Direction direction;
    int64_t min_bytes;
    int skip;  // Chunks that qualify and pass before the one that faults.
  };

  bool Stalled(absl::Time now) const { return now < stalled_until_; }
  bool MayInjectFault() const {
    return options_.max_faults < 0 || faults_injected_ < options_.max_faults;
  }
  std::string Describe(const Connection& c) const {
    return absl::StrCat("connection #", c.id, " (client ", c.client_name, "; ", c.bytes_up,
                        " bytes up, ", c.bytes_down, " down)");
  }

  void Accept();
  void Read(Connection& c, bool from_client);
  void Write(Connection& c, bool to_client, absl::Time now);
  void HandleRequestsAndTimers(absl::Time now);
  void Inject(Connection& c, Fault fault, absl::string_view why);
  void EndWithReset(Connection& c);
  void EndGracefully(Connection& c);

  FaultRelay* const relay_;
  const Options& options_;
  const int listen_fd_;
  const int wake_read_;
  const int wake_write_;
  const sockaddr_storage target_;
  const socklen_t target_length_;
  std::mt19937_64 random_;
  std::vector<std::unique_ptr<Connection>> connections_;
  int next_id_ = 0;
  int faults_injected_ = 0;
  absl::Time next_reset_, next_stall_;
  absl::Time stalled_until_ = absl::InfinitePast();
  std::optional<ArmedFault> armed_;
};

void FaultRelay::Loop::Accept() {
  while (true) {
    const int client = accept(listen_fd_, nullptr, nullptr);
    if (client < 0) return;  // EAGAIN: none left.
    SetNonBlocking(client);
    auto c = std::make_unique<Connection>();
    c->id = ++next_id_;
    c->client = client;
    c->client_name = PeerName(client);
    c->server = socket(target_.ss_family, SOCK_STREAM, 0);
    SetNonBlocking(c->server);
    if (connect(c->server, reinterpret_cast<const sockaddr*>(&target_), target_length_) == 0) {
      c->connected = true;
    } else if (errno != EINPROGRESS) {
      LOG(WARNING) << "connection #" << c->id << ": target refused: " << ErrnoText(errno);
      EndWithReset(*c);
    }
    VLOG(1) << "accepted connection #" << c->id << " from " << c->client_name;
    {
      absl::MutexLock lock(&relay_->mu_);
      ++relay_->stats_.connections;
    }
    connections_.push_back(std::move(c));
  }
}

void FaultRelay::Loop::Read(Connection& c, bool from_client) {
  Flow& d = from_client ? c.up : c.down;
  const int fd = from_client ? c.client : c.server;
  std::string bytes(kReadBytes, '\0');
  const ssize_t n = read(fd, bytes.data(), bytes.size());
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n < 0) {
    // The peer reset: pass the reset on to the other side.
    LOG(INFO) << Describe(c) << ": " << (from_client ? "client" : "target") << " read failed ("
              << ErrnoText(errno) << "); resetting the other side";
    EndWithReset(c);
    return;
  }
  if (n == 0) {
    d.eof = true;
    return;
  }
  const Direction direction =
      from_client ? Direction::kClientToTarget : Direction::kTargetToClient;
  auto chunk_fault = [&](absl::string_view cause) {
    return absl::StrCat(cause, ", on a ", n, "-byte chunk from the ",
                        from_client ? "client" : "target");
  };
  if (armed_ && armed_->direction == direction && n >= armed_->min_bytes &&
      armed_->skip-- == 0) {
    const Fault fault = armed_->fault;
    armed_.reset();
    Inject(c, fault, chunk_fault("requested"));
    return;
  }
  if (MayInjectFault()) {
    std::uniform_real_distribution<double> uniform(0, 1);
    const bool reset = uniform(random_) < options_.reset_probability;
    if (reset || uniform(random_) < options_.close_probability) {
      ++faults_injected_;
      Inject(c, reset ? Fault::kReset : Fault::kClose, chunk_fault("random"));
      return;
    }
  }
  bytes.resize(n);
  absl::Duration wait = options_.delay;
  if (options_.jitter > absl::ZeroDuration()) {
    const double j = absl::ToDoubleMicroseconds(options_.jitter);
    wait += absl::Microseconds(std::uniform_real_distribution<double>(-j, j)(random_));
  }
  d.last_release = std::max(d.last_release, absl::Now() + wait);
  d.buffered += n;
  d.queue.push_back(Chunk{d.last_release, std::move(bytes)});
}

void FaultRelay::Loop::Write(Connection& c, bool to_client, absl::Time now) {
  Flow& d = to_client ? c.down : c.up;
  const int fd = to_client ? c.client : c.server;
  while (!d.queue.empty() && d.queue.front().release <= now) {
    Chunk& chunk = d.queue.front();
    const ssize_t n = send(fd, chunk.bytes.data() + chunk.written,
                           chunk.bytes.size() - chunk.written, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n < 0) {
      LOG(INFO) << Describe(c) << ": " << (to_client ? "client" : "target") << " write failed ("
                << ErrnoText(errno) << "); resetting the other side";
      EndWithReset(c);
      return;
    }
    chunk.written += n;
    d.buffered -= n;
    (to_client ? c.bytes_down : c.bytes_up) += n;
    {
      absl::MutexLock lock(&relay_->mu_);
      relay_->stats_.bytes_forwarded += n;
    }
    if (chunk.written < chunk.bytes.size()) return;
    d.queue.pop_front();
  }
  if (d.queue.empty() && d.eof && !d.shut) {
    shutdown(fd, SHUT_WR);
    d.shut = true;
  }
}

void FaultRelay::Loop::Inject(Connection& c, Fault fault, absl::string_view why) {
  LOG(WARNING) << "fault: " << (fault == Fault::kReset ? "reset (RST) " : "closed (FIN) ")
               << Describe(c) << " [" << why << "]";
  {
    absl::MutexLock lock(&relay_->mu_);
    ++(fault == Fault::kReset ? relay_->stats_.resets : relay_->stats_.closes);
  }
  if (fault == Fault::kReset) {
    EndWithReset(c);
  } else {
    EndGracefully(c);
  }
}

void FaultRelay::Loop::EndWithReset(Connection& c) {
  CloseWithReset(c.client);
  CloseWithReset(c.server);
  c.open = false;
}

void FaultRelay::Loop::EndGracefully(Connection& c) {
  CloseGracefully(c.client);
  CloseGracefully(c.server);
  c.open = false;
}

void FaultRelay::Loop::HandleRequestsAndTimers(absl::Time now) {
  Requests requests;
  {
    absl::MutexLock lock(&relay_->mu_);
    requests = std::exchange(relay_->requests_, Requests());
  }
  if (requests.next_chunk) {
    armed_ = ArmedFault{*requests.next_chunk, requests.next_chunk_direction,
                        requests.next_chunk_min_bytes, requests.next_chunk_skip};
  }
  std::string why = "requested";
  if (!requests.all && now >= next_reset_) {
    next_reset_ = now + options_.reset_every;
    if (!connections_.empty() && MayInjectFault()) {
      ++faults_injected_;
      requests.all = Fault::kReset;
      why = "every " + absl::FormatDuration(options_.reset_every);
    }
  }
  if (requests.all) {
    for (auto& c : connections_) {
      if (c->open) Inject(*c, *requests.all, why);
    }
  }
  absl::Time stall_until = requests.stall_until;
  if (now >= next_stall_) {
    next_stall_ = now + options_.stall_every;
    if (MayInjectFault()) {
      ++faults_injected_;
      stall_until = std::max(stall_until, now + options_.stall_for);
    }
  }
  if (stall_until > now && stall_until > stalled_until_) {
    LOG(WARNING) << "fault: stalling every connection for "
                 << absl::FormatDuration(stall_until - now);
    stalled_until_ = stall_until;
    absl::MutexLock lock(&relay_->mu_);
    ++relay_->stats_.stalls;
  }
}

void FaultRelay::Loop::Run() {
  // Which socket each pollfd (after the first two) belongs to.
  struct Slot {
    Connection* connection;
    bool client;
  };
  std::vector<pollfd> fds;
  std::vector<Slot> slots;
  while (!relay_->stopping_.load()) {
    absl::Time now = absl::Now();
    HandleRequestsAndTimers(now);
    connections_.erase(std::remove_if(connections_.begin(), connections_.end(),
                                      [](const auto& c) { return !c->open; }),
                       connections_.end());

    const bool stalled = Stalled(now);
    absl::Time wake_at = std::min({next_reset_, next_stall_,
                                   stalled ? stalled_until_ : absl::InfiniteFuture()});
    fds.assign({{wake_read_, POLLIN, 0}, {listen_fd_, POLLIN, 0}});
    slots.clear();
    auto watch = [&](Connection& c, bool client, const Flow& in, const Flow& out) {
      short events = 0;
      if (!in.eof && in.buffered < options_.max_buffered_bytes) events |= POLLIN;
      if (!stalled && !out.queue.empty()) {
        if (out.queue.front().release <= now) {
          events |= POLLOUT;
        } else {
          wake_at = std::min(wake_at, out.queue.front().release);
        }
      }
      if (events == 0) return;
      fds.push_back({client ? c.client : c.server, events, 0});
      slots.push_back({&c, client});
    };
    for (auto& c : connections_) {
      watch(*c, /*client=*/true, c->up, c->down);
      if (c->connected) {
        watch(*c, /*client=*/false, c->down, c->up);
      } else {
        fds.push_back({c->server, POLLOUT, 0});
        slots.push_back({c.get(), false});
      }
    }
    int timeout_ms = -1;
    if (wake_at != absl::InfiniteFuture()) {
      const absl::Duration wait = absl::Ceil(wake_at - now, absl::Milliseconds(1));
      timeout_ms = static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(wait)));
    }
    if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      LOG(ERROR) << "poll: " << ErrnoText(errno);
      return;
    }
    if (fds[0].revents != 0) {
      char sink[64];
      while (read(wake_read_, sink, sizeof(sink)) > 0) {
      }
    }
    if (fds[1].revents != 0) Accept();
    now = absl::Now();
    for (size_t i = 2; i < fds.size(); ++i) {
      Connection& c = *slots[i - 2].connection;
      const bool client = slots[i - 2].client;
      const short revents = fds[i].revents;
      if (!c.open || revents == 0) continue;
      if (!client && !c.connected) {
        int error = 0;
        socklen_t length = sizeof(error);
        getsockopt(c.server, SOL_SOCKET, SO_ERROR, &error, &length);
        if (error != 0) {
          LOG(WARNING) << "connection #" << c.id << ": target refused: " << ErrnoText(error);
          EndWithReset(c);
        } else {
          c.connected = true;
        }
        continue;
      }
      if (revents & (POLLIN | POLLHUP | POLLERR)) {
        if (fds[i].events & POLLIN) {
          Read(c, client);
        } else if (revents & POLLERR) {
          LOG(INFO) << Describe(c) << ": socket error; resetting the other side";
          EndWithReset(c);
        }
      }
      if (c.open && (revents & POLLOUT)) Write(c, /*to_client=*/client, now);
    }
    // Pass on FINs whose queues have drained; close connections shut both ways.
    for (auto& c : connections_) {
      if (!c->open || !c->connected) continue;
      for (bool to_client : {true, false}) {
        Flow& d = to_client ? c->down : c->up;
        if (d.eof && d.queue.empty() && !d.shut) Write(*c, to_client, now);
      }
      if (c->up.shut && c->down.shut) {
        VLOG(1) << Describe(*c) << " closed by its peers";
        close(c->client);
        close(c->server);
        c->open = false;
      }
    }
  }
}

absl::StatusOr<std::unique_ptr<FaultRelay>> FaultRelay::Start(Options options) {
  auto bad = [](absl::string_view what) { return absl::InvalidArgumentError(what); };
  if (options.target_port <= 0 || options.target_port > 65535) {
    return bad(absl::StrCat("target port ", options.target_port, " is not in 1..65535"));
  }
  if (options.listen_port < 0 || options.listen_port > 65535) {
    return bad(absl::StrCat("listen port ", options.listen_port, " is not in 0..65535"));
  }
  if (options.delay < absl::ZeroDuration() || options.jitter < absl::ZeroDuration() ||
      options.jitter > options.delay) {
    return bad(absl::StrCat("delay ", absl::FormatDuration(options.delay), " and jitter ",
                            absl::FormatDuration(options.jitter),
                            ": need 0 <= jitter <= delay"));
  }
  for (auto [name, p] : {std::pair<const char*, double>{"close", options.close_probability},
                         {"reset", options.reset_probability}}) {
    if (!(p >= 0 && p <= 1)) {
      return bad(absl::StrCat(name, " probability ", p, " is not in [0, 1]"));
    }
  }
  if (options.reset_every < absl::ZeroDuration() || options.stall_every < absl::ZeroDuration() ||
      options.stall_for <= absl::ZeroDuration()) {
    return bad("reset_every and stall_every must be >= 0 and stall_for > 0");
  }
  if (options.max_buffered_bytes <= 0) {
    return bad(absl::StrCat("max_buffered_bytes ", options.max_buffered_bytes, " must be > 0"));
  }
  socklen_t target_length = 0, listen_length = 0;
  absl::StatusOr<sockaddr_storage> target =
      Resolve("target", options.target_host, options.target_port, &target_length);
  if (!target.ok()) return target.status();
  absl::StatusOr<sockaddr_storage> listen_address =
      Resolve("listen", options.listen_host, options.listen_port, &listen_length);
  if (!listen_address.ok()) return listen_address.status();

  const std::string listen_name = absl::StrCat(options.listen_host, ":", options.listen_port);
  const int fd = socket(listen_address->ss_family, SOCK_STREAM, 0);
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<const sockaddr*>(&*listen_address), listen_length) != 0 ||
      listen(fd, 128) != 0) {
    const int error = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen_name, ": ", ErrnoText(error)));
  }
  SetNonBlocking(fd);
  sockaddr_storage bound{};
  socklen_t bound_length = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &bound_length);
  const int port = ntohs(bound.ss_family == AF_INET6
                             ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                             : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  int wake[2];
  if (pipe2(wake, O_NONBLOCK | O_CLOEXEC) != 0) {
    close(fd);
    return absl::InternalError(absl::StrCat("pipe: ", ErrnoText(errno)));
  }
  std::unique_ptr<FaultRelay> relay(new FaultRelay(std::move(options), port));
  relay->loop_ = std::make_unique<Loop>(relay.get(), fd, wake, *target, target_length);
  relay->thread_ = std::thread([r = relay.get()] { r->loop_->Run(); });
  return relay;
}

FaultRelay::FaultRelay(Options options, int port)
    : options_(std::move(options)), port_(port) {}

FaultRelay::~FaultRelay() {
  stopping_.store(true);
  Wake();
  thread_.join();
  loop_.reset();
}

void FaultRelay::Wake() {
  const char byte = 1;
  (void)!write(loop_->wake_fd(), &byte, 1);
}

void FaultRelay::InjectAll(Fault fault) {
  {
    absl::MutexLock lock(&mu_);
    requests_.all = fault;
  }
  Wake();
}

void FaultRelay::InjectOnNextChunk(Fault fault, Direction direction, int64_t min_bytes,
                                   int skip) {
  {
    absl::MutexLock lock(&mu_);
    requests_.next_chunk = fault;
    requests_.next_chunk_direction = direction;
    requests_.next_chunk_min_bytes = min_bytes;
    requests_.next_chunk_skip = skip;
  }
  Wake();
}

void FaultRelay::StallAll(absl::Duration duration) {
  {
    absl::MutexLock lock(&mu_);
    requests_.stall_until = std::max(requests_.stall_until, absl::Now() + duration);
  }
  Wake();
}

FaultRelay::Stats FaultRelay::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace psrt
