#include "ps/dataplane_server.h"

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
// How often a waiting pull looks whether its caller is still there.
constexpr absl::Duration kPeerCheckInterval = absl::Milliseconds(200);
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
    : shards_(std::move(shards)), options_(std::move(options)), listener_(std::move(listener)) {
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

void DataPlaneServer::Serve(FrameConnection* connection) {
  if (absl::Status greeted = Greet(connection); !greeted.ok()) {
    VLOG(1) << "data plane: " << connection->peer() << ": " << greeted.message();
    return;
  }
  std::vector<char> buffer;  // Pushes' data, reused from step to step.
  FrameHeader header;
  std::string meta;
  while (!stopping_.load()) {
    absl::Status status = connection->ReceiveHeader(&header, &meta, absl::InfiniteFuture());
    if (status.ok()) status = Handle(connection, header, meta, &buffer);
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
                                     const std::string& meta, std::vector<char>* buffer) {
  if (header.kind != FrameKind::kRequest ||
      (header.method != FrameMethod::kPush && header.method != FrameMethod::kPull)) {
    return absl::InvalidArgumentError("a data-plane request must be a push or a pull");
  }
  if (header.stripe >= shards_.size()) {
    RETURN_IF_ERROR(connection->SkipData(header.data_size, absl::Now() + kTransferTimeout));
    return Refuse(
        connection, header,
        absl::InvalidArgumentError(absl::StrCat(
            "the call names stripe \"", header.stripe, "\", but this ps serves ", shards_.size(),
            " (psrt_ps --ps_stripes): give every task of the job the same "
            "--ps_stripes")));
  }
  return header.method == FrameMethod::kPush ? HandlePush(connection, header, meta, buffer)
                                             : HandlePull(connection, header, meta);
}

absl::Status DataPlaneServer::Refuse(FrameConnection* connection, const FrameHeader& header,
                                     const absl::Status& error) {
  FrameHeader reply = ReplyTo(header);
  reply.status = static_cast<uint32_t>(error.code());
  return connection->Send(reply, error.message(), {}, absl::Now() + kTransferTimeout);
}

absl::Status DataPlaneServer::HandlePush(FrameConnection* connection, const FrameHeader& header,
                                         const std::string& meta, std::vector<char>* buffer) {
  const absl::Time start = absl::Now();
  proto::PushHeader push;
  if (!push.ParseFromString(meta)) {
    RETURN_IF_ERROR(connection->SkipData(header.data_size, start + kTransferTimeout));
    return Refuse(connection, header,
                  absl::InvalidArgumentError("push: the metadata is not a PushHeader"));
  }
  // The whole frame first: a connection cut mid-push applies nothing. The
  // buffer grows only to a size the stripe's values allow, checked (under
  // the shard's lock) only when it must grow: never in steady state. A push
  // too large ends the connection before any memory is taken for it.
  const size_t size = static_cast<size_t>(header.data_size);
  if (buffer->size() < size) {
    const size_t limit = shards_[header.stripe]->value_bytes();
    if (size > limit) {
      return limit == 0 ? absl::UnavailableError(absl::StrCat("push to stripe ", header.stripe,
                                                              ", which holds no model yet"))
                        : absl::InvalidArgumentError(absl::StrCat(
                              "push to stripe ", header.stripe, " of ", size,
                              " bytes, more than the stripe's ", limit, " bytes of values"));
    }
    buffer->resize(size);
  }
  RETURN_IF_ERROR(
      connection->ReceiveData(absl::MakeSpan(buffer->data(), size), start + kTransferTimeout));
  SpanByteSource data(absl::MakeConstSpan(buffer->data(), size));
  absl::StatusOr<proto::PushResponse> reply = shards_[header.stripe]->Push(push, &data);
  if (options_.metrics != nullptr) {
    options_.metrics->transfers().RecordPush(OutcomeOf(reply.ok(), reply.ok() && reply->accepted(),
                                                       reply.ok() && reply->training_done()),
                                             dataplane::kFrameHeaderBytes + meta.size() + size,
                                             absl::Now() - start);
    if (reply.ok()) options_.metrics->SetVersion(reply->version());
  }
  if (!reply.ok()) return Refuse(connection, header, reply.status());
  return connection->Send(ReplyTo(header), reply->SerializeAsString(), {},
                          absl::Now() + kTransferTimeout);
}

absl::Status DataPlaneServer::HandlePull(FrameConnection* connection, const FrameHeader& header,
                                         const std::string& meta) {
  RETURN_IF_ERROR(connection->SkipData(header.data_size, absl::Now() + kTransferTimeout));
  proto::PullRequest request;
  if (!request.ParseFromString(meta)) {
    return Refuse(connection, header,
                  absl::InvalidArgumentError("pull: the metadata is not a PullRequest"));
  }
  ParameterShard* shard = shards_[header.stripe];
  absl::StatusOr<ParameterShard::PullOptions> options = shard->PullOptionsFor(request);
  if (!options.ok()) return Refuse(connection, header, options.status());
  const absl::Time start = absl::Now();
  struct Answer {
    absl::Mutex mu;
    std::optional<absl::StatusOr<ParameterShard::PullReply>> reply ABSL_GUARDED_BY(mu);
  };
  auto answer = std::make_shared<Answer>();
  const int64_t waiting =
      shard->Pull(*options, [answer](absl::StatusOr<ParameterShard::PullReply> reply) {
        absl::MutexLock lock(&answer->mu);
        answer->reply = std::move(reply);
      });
  absl::StatusOr<ParameterShard::PullReply> reply = absl::UnknownError("unanswered");
  {
    absl::MutexLock lock(&answer->mu);
    auto answered = [&answer]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(answer->mu) {
      return answer->reply.has_value();
    };
    while (!answer->mu.AwaitWithTimeout(absl::Condition(&answered), kPeerCheckInterval)) {
      // The caller went away (or the server stops): free the waiting pull now.
      if (connection->PeerClosed() || stopping_.load()) {
        answer->mu.Unlock();
        shard->CancelPull(waiting);
        answer->mu.Lock();
      }
    }
    reply = *std::move(answer->reply);
  }
  if (!reply.ok()) return Refuse(connection, header, reply.status());
  const absl::Duration waited = absl::Now() - start;
  reply->header.set_waited_us(absl::ToInt64Microseconds(waited));
  const std::shared_ptr<const ParameterShard::Snapshot> snapshot = std::move(reply->snapshot);
  const absl::Span<const char> values(reinterpret_cast<const char*>(snapshot->values.data()),
                                      reply->num_bytes);
  const std::string header_bytes = reply->header.SerializeAsString();
  RETURN_IF_ERROR(
      connection->Send(ReplyTo(header), header_bytes, {values}, absl::Now() + kTransferTimeout));
  if (options_.metrics != nullptr) {
    options_.metrics->transfers().RecordPull(dataplane::kFrameHeaderBytes + header_bytes.size() +
                                             values.size());
    if (waiting != 0) options_.metrics->transfers().RecordPullWait(waited);
  }
  return absl::OkStatus();
}

}  // namespace psrt
