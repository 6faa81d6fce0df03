#include "ps/dataplane_server.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <optional>
#include <system_error>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/byte_source.h"
#include "common/status_macros.h"
#include "dataplane/hello.h"
#include "glog/logging.h"

namespace psrt {
namespace {

using dataplane::FrameConnection;
using dataplane::FrameHeader;
using dataplane::FrameKind;
using dataplane::FrameMethod;

// How long a frame may take to arrive or leave once begun, and a hello.
constexpr absl::Duration kTransferTimeout = absl::Minutes(5);
constexpr absl::Duration kHelloTimeout = absl::Seconds(10);
// Connections served at once (a thread each); more are closed at once, so
// that a flood of connections, authenticated or not, cannot exhaust threads.
constexpr size_t kMaxSessions = 4096;

FrameHeader ReplyTo(const FrameHeader& request) {
  FrameHeader reply;
  reply.kind = FrameKind::kReply;
  reply.method = request.method;
  reply.stripe = request.stripe;
  reply.request_id = request.request_id;
  return reply;
}

// Reads an eventfd's count, retrying when a signal interrupts; false on
// another error.
bool ReadCount(int fd, uint64_t* count) {
  while (true) {
    if (read(fd, count, sizeof(*count)) == ssize_t(sizeof(*count))) return true;
    if (errno != EINTR) return false;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataPlaneServer>> DataPlaneServer::Start(
    std::vector<ParameterShard*> shards, Options options) {
  CHECK(options.security != nullptr);
  CHECK(!shards.empty());
  absl::StatusOr<std::unique_ptr<dataplane::FrameListener>> listener =
      dataplane::FrameListener::Listen(options.listen_address);
  if (!listener.ok()) return listener.status();
  return std::unique_ptr<DataPlaneServer>(
      new DataPlaneServer(std::move(shards), std::move(options), *std::move(listener)));
}

DataPlaneServer::DataPlaneServer(std::vector<ParameterShard*> shards, Options options,
                                 std::unique_ptr<dataplane::FrameListener> listener)
    : handler_(std::move(shards), options.metrics),
      options_(std::move(options)),
      listener_(std::move(listener)) {
  accepting_ = std::thread([this] { AcceptLoop(); });
}

DataPlaneServer::~DataPlaneServer() {
  stopping_.store(true);
  listener_->Shutdown();
  accepting_.join();
  std::vector<Session> sessions;
  {
    absl::MutexLock lock(&mu_);
    for (Session& session : sessions_) session.connection->Shutdown();
    sessions.swap(sessions_);
  }
  for (Session& session : sessions) session.thread.join();
}

int DataPlaneServer::port() const {
  const std::string& address = listener_->address();
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port)) return 0;
  return port;
}

void DataPlaneServer::AcceptLoop() {
  while (true) {
    absl::StatusOr<std::unique_ptr<FrameConnection>> accepted =
        listener_->Accept(options_.max_data_bytes);
    if (!accepted.ok()) {
      if (!absl::IsCancelled(accepted.status())) {
        LOG(ERROR) << accepted.status().message();
      }
      return;
    }
    absl::MutexLock lock(&mu_);
    // Sessions whose connection has ended go first.
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      if (it->done->load()) {
        it->thread.join();
        it = sessions_.erase(it);
      } else {
        ++it;
      }
    }
    if (sessions_.size() >= kMaxSessions) {
      LOG_EVERY_T(WARNING, 10) << "data plane: " << kMaxSessions
                               << " connections already; closing the one from "
                               << (*accepted)->peer();
      continue;
    }
    Session session;
    session.connection = *std::move(accepted);
    session.done = std::make_shared<std::atomic<bool>>(false);
    FrameConnection* connection = session.connection.get();
    try {
      session.thread = std::thread([this, connection, done = session.done] {
        Serve(connection);
        connection->Shutdown();  // The peer sees the end now, not at the next accept.
        done->store(true);
      });
    } catch (const std::system_error& e) {  // Out of threads: this connection goes.
      LOG_EVERY_T(WARNING, 10) << "data plane: no thread for the connection from "
                               << connection->peer() << ": " << e.what();
      continue;
    }
    sessions_.push_back(std::move(session));
  }
}

DataPlaneServer::ConnectionState::~ConnectionState() {
  if (wake_fd >= 0) close(wake_fd);
}

void DataPlaneServer::Serve(FrameConnection* connection) {
  if (absl::Status greeted = Greet(connection); !greeted.ok()) {
    VLOG(1) << "data plane: " << connection->peer() << ": " << greeted.message();
    return;
  }
  ConnectionState state;
  FrameHeader header;
  std::string meta;
  while (!stopping_.load()) {
    absl::Status status = connection->ReceiveHeader(&header, &meta, absl::InfiniteFuture());
    if (status.ok()) status = Handle(connection, header, meta, &state);
    if (!status.ok()) {
      // A closed connection is how workers leave; anything else is worth a line.
      if (!absl::IsUnavailable(status) && !absl::IsCancelled(status)) {
        LOG(WARNING) << "data plane: closing the connection with " << connection->peer() << ": "
                     << status.message();
      }
      return;
    }
  }
}

absl::Status DataPlaneServer::Greet(FrameConnection* connection) {
  bool chief = false;
  const absl::Status accepted = dataplane::AnswerHello(
      connection,
      [&](absl::string_view credential) {
        return options_.security->CheckDataPlaneCredential(credential, &chief);
      },
      absl::Now() + kHelloTimeout);
  LOG_IF(WARNING, !accepted.ok()) << "data plane: refused the connection from "
                                  << connection->peer() << ": " << accepted.message();
  return accepted;
}

absl::Status DataPlaneServer::Handle(FrameConnection* connection, const FrameHeader& header,
                                     const std::string& meta, ConnectionState* state) {
  if (header.kind != FrameKind::kRequest ||
      (header.method != FrameMethod::kPush && header.method != FrameMethod::kPull)) {
    return absl::InvalidArgumentError("a data-plane request must be a push or a pull");
  }
  return header.method == FrameMethod::kPush
             ? HandlePush(connection, header, meta, &state->buffer)
             : HandlePull(connection, header, meta, state);
}

absl::Status DataPlaneServer::Reply(FrameConnection* connection, const FrameHeader& header,
                                    const absl::Status& error, absl::string_view meta,
                                    absl::Span<const absl::Span<const char>> data) {
  FrameHeader reply = ReplyTo(header);
  reply.status = static_cast<uint32_t>(error.code());
  return connection->Send(reply, error.ok() ? meta : error.message(),
                          error.ok() ? data : absl::Span<const absl::Span<const char>>(),
                          absl::Now() + kTransferTimeout);
}

absl::Status DataPlaneServer::HandlePush(FrameConnection* connection, const FrameHeader& header,
                                         const std::string& meta, std::vector<char>* buffer) {
  const absl::AlphaNum stripe(header.stripe);
  const int64_t wire_bytes = dataplane::kFrameHeaderBytes + meta.size() + header.data_size;
  proto::PushHeader push;
  absl::StatusOr<ParameterShard*> shard = handler_.Stripe(stripe.Piece());
  absl::Status read = shard.status();
  if (read.ok() && !push.ParseFromString(meta)) {
    read = absl::InvalidArgumentError("push: the metadata is not a PushHeader");
  }
  if (!read.ok()) {
    RETURN_IF_ERROR(connection->SkipData(header.data_size, absl::Now() + kTransferTimeout));
    return Reply(connection, header,
                 handler_.Push(stripe.Piece(), read, push, nullptr, wire_bytes).status());
  }
  // The whole frame first: a connection cut mid-push applies nothing. The
  // buffer grows only to a size the stripe's values allow, checked (under
  // the shard's lock) only when it must grow: never in steady state. A push
  // too large ends the connection before any memory is taken for it.
  const size_t size = static_cast<size_t>(header.data_size);
  if (buffer->size() < size) {
    const std::optional<size_t> limit = (*shard)->max_push_bytes();
    if (!limit.has_value()) {
      return absl::UnavailableError(
          absl::StrCat("push to stripe ", header.stripe, ", which holds no model yet"));
    }
    if (size > *limit) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push to stripe ", header.stripe, " of ", size, " bytes, more than the stripe's ",
          *limit, " bytes of values and embedding rows"));
    }
    buffer->resize(size);
  }
  RETURN_IF_ERROR(connection->ReceiveData(absl::MakeSpan(buffer->data(), size),
                                          absl::Now() + kTransferTimeout));
  SpanByteSource data(absl::MakeConstSpan(buffer->data(), size));
  const absl::StatusOr<proto::PushResponse> reply =
      handler_.Push(stripe.Piece(), absl::OkStatus(), push, &data, wire_bytes);
  return Reply(connection, header, reply.status(), reply.ok() ? reply->SerializeAsString() : "");
}

absl::Status DataPlaneServer::HandlePull(FrameConnection* connection, const FrameHeader& header,
                                         const std::string& meta, ConnectionState* state) {
  RETURN_IF_ERROR(connection->SkipData(header.data_size, absl::Now() + kTransferTimeout));
  proto::PullRequest request;
  const absl::Status read =
      request.ParseFromString(meta)
          ? absl::OkStatus()
          : absl::InvalidArgumentError("pull: the metadata is not a PullRequest");
  if (state->wake_fd < 0) {
    state->wake_fd = eventfd(0, EFD_CLOEXEC);
    if (state->wake_fd < 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("data plane: no eventfd for a pull: ", std::strerror(errno)));
    }
  }
  // The answer comes on this thread, or on the one that answers a waiting
  // pull, which then writes wake_fd if this thread sleeps (kParked) by then.
  // Either way this thread reads `reply` only once `answered` is kAnswered,
  // and leaves only after the answer has come.
  enum : int { kPending, kParked, kAnswered };
  struct {
    absl::StatusOr<RequestHandler::PullAnswer> reply;
    std::atomic<int> answered{kPending};
  } answer;
  const int wake_fd = state->wake_fd;
  const RequestHandler::WaitingPull waiting = handler_.Pull(
      absl::AlphaNum(header.stripe).Piece(), read, request, absl::InfiniteFuture(),
      [&answer, wake_fd](absl::StatusOr<RequestHandler::PullAnswer> reply) {
        answer.reply = std::move(reply);
        if (answer.answered.exchange(kAnswered) == kParked) {
          const uint64_t one = 1;
          CHECK_EQ(write(wake_fd, &one, sizeof(one)), ssize_t(sizeof(one)));
        }
      });
  if (answer.answered.exchange(kParked) != kAnswered) {
    // The caller going away (or the server stopping) frees the pull now.
    if (!connection->WaitForCloseOr(wake_fd)) waiting.Cancel();
    uint64_t count = 0;  // Blocks until the answer (or the cancel's) has come.
    CHECK(ReadCount(wake_fd, &count)) << std::strerror(errno);
    CHECK_EQ(answer.answered.load(), kAnswered);
  }
  if (!answer.reply.ok()) return Reply(connection, header, answer.reply.status());
  const RequestHandler::PullAnswer& pulled = *answer.reply;
  const std::string header_bytes = pulled.header.SerializeAsString();
  const absl::Span<const char> data[] = {pulled.values, pulled.rows};
  RETURN_IF_ERROR(Reply(connection, header, absl::OkStatus(), header_bytes, data));
  handler_.CountPull(pulled, dataplane::kFrameHeaderBytes + header_bytes.size() +
                                 pulled.values.size() + pulled.rows.size());
  return absl::OkStatus();
}

}  // namespace psrt
