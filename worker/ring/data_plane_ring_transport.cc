#include "worker/ring/data_plane_ring_transport.h"

#include <algorithm>
#include <atomic>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/backoff.h"
#include "common/cluster_spec.h"
#include "common/rpc_util.h"
#include "common/status_macros.h"
#include "common/transport_security.h"
#include "dataplane/frame_connection.h"
#include "dataplane/hello.h"
#include "glog/logging.h"
#include "proto/psrt.pb.h"

namespace psrt {

using dataplane::FrameConnection;
using dataplane::FrameHeader;
using dataplane::FrameKind;
using dataplane::FrameListener;
using dataplane::FrameMethod;

namespace {

// A segment is at most this large (a frame's data; the receiver wants the
// exact size of its own segment anyway).
constexpr uint64_t kMaxSegmentBytes = uint64_t{1} << 40;
// One attempt to connect and say hello; a next worker still starting is
// tried again by the sender's loop.
constexpr absl::Duration kConnectTimeout = absl::Seconds(5);
constexpr absl::Duration kHelloTimeout = absl::Seconds(5);
// How often a waiting receive looks at its other duties (a new incoming
// connection, the sender's failure).
constexpr absl::Duration kLookInterval = absl::Milliseconds(50);

int PortOf(const std::string& address) {
  std::string host;
  int port = 0;
  return SplitHostPort(address, &host, &port).ok() ? port : 0;
}

}  // namespace

struct DataPlaneRingTransport::Outgoing final : RingTransport::Send {
  int64_t op = 0;
  int step = 0;
  absl::Span<const char> bytes;
  absl::Time give_up;  // Of connecting (again); a send under way is watched by FinishSend.
  std::atomic<bool> cancelled{false};
  absl::Status status;  // Set before `done`.
  absl::Notification done;
};

DataPlaneRingTransport::DataPlaneRingTransport(const RingOptions& options, RingControl* control)
    : control_(control),
      security_(options.security ? options.security : std::make_shared<const TransportSecurity>()),
      credential_(security_->DataPlaneCredential()),
      rules_(options, control) {
  std::string host;
  int port = 0;
  listen_error_ = SplitHostPort(options.addresses[options.rank], &host, &port);
  if (listen_error_.ok()) {
    const std::string listen_host =
        options.data_listen_host.empty() ? host : options.data_listen_host;
    absl::StatusOr<std::unique_ptr<FrameListener>> tcp =
        FrameListener::Listen(JoinHostPort(listen_host, options.data_port));
    if (tcp.ok()) {
      data_address_ = JoinHostPort(host, PortOf((*tcp)->address()));
      listeners_.push_back(*std::move(tcp));
    } else {
      listen_error_ = absl::UnavailableError(absl::StrCat(
          "allreduce: worker/", options.rank, " cannot listen for the ring's data plane on ",
          listen_host, ": ", tcp.status().message()));
    }
  }
  if (listen_error_.ok() && options.local_data_plane) {
    // Optional: the previous worker takes TCP without it.
    absl::StatusOr<std::unique_ptr<FrameListener>> local =
        FrameListener::Listen(dataplane::NewLocalDataPlaneAddress(port));
    if (local.ok()) {
      data_local_address_ = (*local)->address();
      listeners_.push_back(*std::move(local));
    } else {
      LOG(WARNING) << "allreduce: the ring's segments over TCP only: " << local.status().message();
    }
  }
  if (listen_error_.ok()) {
    LOG(INFO) << "allreduce: the ring's segments over the data plane, taken on "
              << listeners_[0]->address()
              << (listeners_.size() > 1 ? " and " + listeners_[1]->address() : "");
  }
  for (auto& listener : listeners_) {
    accept_threads_.emplace_back([this, l = listener.get()] { AcceptLoop(l); });
  }
  send_thread_ = std::thread([this] { SendLoop(); });
}

DataPlaneRingTransport::~DataPlaneRingTransport() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    if (out_ != nullptr) out_->Shutdown();
  }
  for (auto& listener : listeners_) listener->Shutdown();
  for (std::thread& t : accept_threads_) t.join();
  send_thread_.join();
}

void DataPlaneRingTransport::AcceptLoop(FrameListener* listener) {
  while (true) {
    absl::StatusOr<std::unique_ptr<FrameConnection>> accepted = listener->Accept(kMaxSegmentBytes);
    {
      absl::MutexLock lock(&mu_);
      if (closing_) return;
    }
    if (!accepted.ok()) {
      if (absl::IsCancelled(accepted.status())) return;
      LOG_EVERY_N(WARNING, 100) << "allreduce: accepting a ring connection: "
                                << accepted.status().message();
      absl::SleepFor(absl::Milliseconds(10));
      continue;
    }
    std::string taken;
    {
      absl::MutexLock lock(&mu_);
      taken = rules_.LastTakenText();
    }
    // The accepted hello tells the last segment taken: a sender whose
    // answer was lost learns that it need not send it again.
    const absl::Status hello = dataplane::AnswerHello(
        accepted->get(),
        [this](absl::string_view credential) {
          bool chief = false;
          return security_->CheckDataPlaneCredential(credential, &chief);
        },
        absl::Now() + kHelloTimeout, taken);
    if (!hello.ok()) {
      LOG(WARNING) << "allreduce: refused a ring connection from " << (*accepted)->peer() << ": "
                   << hello.message();
      if (absl::IsUnauthenticated(hello) || absl::IsPermissionDenied(hello)) {
        absl::MutexLock lock(&mu_);
        rules_.CountRefusal();
      }
      continue;
    }
    absl::MutexLock lock(&mu_);
    if (closing_) return;
    // The previous worker connects again only once its last connection
    // failed: the newest one is the one to read.
    incoming_ = *std::move(accepted);
  }
}

std::unique_ptr<RingTransport::Send> DataPlaneRingTransport::StartSend(
    int64_t op, int step, absl::Span<const char> bytes) {
  auto out = std::make_unique<Outgoing>();
  out->op = op;
  out->step = step;
  out->bytes = bytes;
  out->give_up = absl::Now() + rules_.Timeout(op);
  if (!listen_error_.ok()) {
    out->status = listen_error_;
    out->done.Notify();
    return out;
  }
  absl::MutexLock lock(&mu_);
  CHECK(queued_ == nullptr) << "a send is queued already";
  queued_ = out.get();
  return out;
}

void DataPlaneRingTransport::SendLoop() {
  while (true) {
    Outgoing* out = nullptr;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](DataPlaneRingTransport* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->mu_) {
            return t->queued_ != nullptr || t->closing_;
          },
          this));
      if (queued_ == nullptr) return;
      out = queued_;
      queued_ = nullptr;
    }
    absl::Status status = SendSegment(out);
    // Completion and cancellation exclude each other (FinishSend cancels
    // only under mu_, before `done`): a cancelled send may have shut the
    // connection down after its segment landed, so it is not reused.
    absl::MutexLock lock(&mu_);
    if (out->cancelled.load()) {
      out_.reset();
    } else if (!status.ok() && send_error_.ok()) {
      // Not retried any further: the receiving side need not wait for its
      // peer any longer.
      send_error_ = status;
    }
    out->status = std::move(status);
    out->done.Notify();
  }
}

absl::Status DataPlaneRingTransport::SendSegment(Outgoing* out) {
  Backoff backoff = RingPeerRules::SendBackoff();
  while (true) {
    const absl::Status status = TrySend(out);
    if (status.ok()) return status;
    {
      absl::MutexLock lock(&mu_);
      out_.reset();  // Whatever failed, the next attempt connects anew.
    }
    if (out->cancelled.load()) {
      return absl::CancelledError(absl::StrCat("allreduce: the send to ",
                                               rules_.PeerName(rules_.next_rank()),
                                               " was cancelled: the op failed"));
    }
    // Unavailable: the next worker is not (yet) there, or its connection
    // broke; anything else is its verdict or a fault that a retry repeats.
    if (!absl::IsUnavailable(status)) return status;
    if (absl::Now() + backoff.Peek() >= out->give_up) return rules_.SendError(status);
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(
                             +[](Outgoing* o) { return o->cancelled.load(); }, out),
                         backoff.Next());
  }
}

absl::Status DataPlaneRingTransport::TrySend(Outgoing* out) {
  FrameConnection* connection = nullptr;
  {
    absl::MutexLock lock(&mu_);
    connection = out_.get();
  }
  if (connection == nullptr) {
    // One attempt's timeouts (a ping, a hello) are tried again until the
    // op's, as an unreachable next worker is.
    absl::StatusOr<std::vector<std::string>> addresses =
        control_->NextDataAddresses(kConnectTimeout);
    if (absl::IsDeadlineExceeded(addresses.status())) {
      return absl::UnavailableError(addresses.status().message());
    }
    RETURN_IF_ERROR(addresses.status());
    std::string taken;
    absl::StatusOr<std::unique_ptr<FrameConnection>> opened =
        dataplane::ConnectWithHello(*addresses, credential_, kMaxSegmentBytes,
                                    std::min(out->give_up, absl::Now() + kConnectTimeout), &taken);
    if (absl::IsUnauthenticated(opened.status()) || absl::IsPermissionDenied(opened.status())) {
      return absl::UnauthenticatedError(
          absl::StrCat("allreduce: unauthenticated: ", rules_.PeerName(rules_.next_rank()),
                       " refused this worker's token (", opened.status().message(),
                       "): ", RingPeerRules::kTokenHint));
    }
    if (absl::IsDeadlineExceeded(opened.status())) {
      return absl::UnavailableError(opened.status().message());
    }
    RETURN_IF_ERROR(opened.status());
    {
      absl::MutexLock lock(&mu_);
      if (out->cancelled.load() || closing_) (*opened)->Shutdown();
      out_ = *std::move(opened);
      connection = out_.get();
    }
    if (++connects_ == 1) {
      LOG(INFO) << "allreduce: segments to " << rules_.PeerName(rules_.next_rank()) << " over "
                << connection->peer();
    }
    // Sent again after a lost answer, and taken already: delivered.
    if (rules_.TakenAlready(taken, out->op, out->step)) return absl::OkStatus();
  }
  FrameHeader header;
  header.kind = FrameKind::kRequest;
  header.method = FrameMethod::kRingSegment;
  header.request_id = ++request_id_;
  // No deadline: FinishSend watches whether the next worker still answers,
  // and cancels the send (Shutdown) when it does not.
  RETURN_IF_ERROR(connection->Send(header, rules_.Header(out->op, out->step).SerializeAsString(),
                                   {out->bytes}, absl::InfiniteFuture()));
  FrameHeader reply;
  std::string text;
  RETURN_IF_ERROR(connection->ReceiveHeader(&reply, &text, absl::InfiniteFuture()));
  if (reply.kind != FrameKind::kReply || reply.request_id != header.request_id ||
      reply.data_size != 0) {
    return absl::DataLossError(absl::StrCat("allreduce: ", rules_.PeerName(rules_.next_rank()),
                                            " answered a segment out of step"));
  }
  if (reply.status != 0) {
    // Its verdict, in its words; Unavailable (it saw this worker restart)
    // is tried again, as over gRPC.
    return absl::Status(static_cast<absl::StatusCode>(reply.status),
                        absl::StrCat(rules_.PeerName(rules_.next_rank()), " refused step ",
                                     out->step, " of op ", out->op, ": ", text));
  }
  return absl::OkStatus();
}

absl::Status DataPlaneRingTransport::FinishSend(std::unique_ptr<Send> send, bool op_failed) {
  std::unique_ptr<Outgoing> out(static_cast<Outgoing*>(send.release()));
  auto cancel = [&] {
    absl::MutexLock lock(&mu_);
    if (out->done.HasBeenNotified()) return;  // Landed (or failed) already.
    out->cancelled.store(true);
    if (out_ != nullptr) out_->Shutdown();
  };
  if (op_failed) {
    // A send already on its way is let land, briefly.
    if (!out->done.WaitForNotificationWithTimeout(RingPeerRules::kFailedOpSendGrace)) cancel();
    out->done.WaitForNotification();
    return out->status;
  }
  const absl::Time start = absl::Now();
  while (!out->done.WaitForNotificationWithTimeout(rules_.Timeout(out->op))) {
    // Not taken within the op's timeout: a next worker that still answers
    // is busy (the chief evaluating or saving); one that does not is dead
    // or hung.
    const absl::Status silent = rules_.CheckSilent(RingPeerRules::Neighbour::kNext, out->op,
                                                   out->step, absl::Now() - start);
    if (!silent.ok()) {
      cancel();
      out->done.WaitForNotification();
      return out->status.ok() ? out->status : silent;  // It may have landed meanwhile.
    }
  }
  return out->status;
}

std::unique_ptr<FrameConnection> DataPlaneRingTransport::TakeIncoming() {
  absl::MutexLock lock(&mu_);
  return std::move(incoming_);
}

absl::Status DataPlaneRingTransport::Receive(int64_t op, int step, absl::Span<char> bytes,
                                             bool add) {
  if (!listen_error_.ok()) return listen_error_;
  const absl::Time start = absl::Now();
  absl::Time silent_until = start + rules_.Timeout(op);
  while (true) {
    bool refused = false;  // A hello refused for its token since the last look.
    {
      absl::MutexLock lock(&mu_);
      if (!send_error_.ok()) return send_error_;
      refused = rules_.TakeRefusal();
    }
    if (refused) RETURN_IF_ERROR(rules_.CheckRefusal("ring connection"));
    if (std::unique_ptr<FrameConnection> fresh = TakeIncoming()) in_ = std::move(fresh);
    if (in_ != nullptr && in_->broken()) in_.reset();
    if (in_ == nullptr) {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(
          absl::Condition(
              +[](DataPlaneRingTransport* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->mu_) {
                return t->incoming_ != nullptr || !t->send_error_.ok() ||
                       t->rules_.refusal_pending();
              },
              this),
          std::min(kLookInterval, silent_until - absl::Now()));
    } else {
      const absl::Status ready =
          in_->WaitForFrame(std::min(silent_until, absl::Now() + kLookInterval));
      if (ready.ok()) {
        bool refused = false;
        const absl::Status read = ReadSegment(in_.get(), op, step, bytes, add, &refused);
        if (read.ok() || refused) return read;
        if (!absl::IsNotFound(read)) {
          // The connection failed: the previous worker sends the segment
          // again on a new one.
          LOG(WARNING) << "allreduce: " << read.message() << "; waiting for "
                       << rules_.PeerName(rules_.previous_rank()) << " to send it again";
          in_.reset();
        }
        silent_until = absl::Now() + rules_.Timeout(op);
        continue;
      }
      if (!absl::IsDeadlineExceeded(ready)) in_.reset();
    }
    if (absl::Now() >= silent_until) {
      RETURN_IF_ERROR(
          rules_.CheckSilent(RingPeerRules::Neighbour::kPrevious, op, step, absl::Now() - start));
      silent_until = absl::Now() + rules_.Timeout(op);
    }
  }
}

absl::Status DataPlaneRingTransport::ReadSegment(FrameConnection* in, int64_t op, int step,
                                                 absl::Span<char> bytes, bool add, bool* refused) {
  *refused = false;
  const absl::Time deadline = absl::Now() + rules_.Timeout(op);
  FrameHeader header;
  std::string meta;
  RETURN_IF_ERROR(in->ReceiveHeader(&header, &meta, deadline));
  // Tells the sender `verdict` after dropping the frame's data.
  auto answer = [&](const absl::Status& verdict) {
    if (in->data_left() > 0) {
      if (absl::Status s = in->SkipData(in->data_left(), deadline); !s.ok()) return s;
    }
    FrameHeader reply;
    reply.kind = FrameKind::kReply;
    reply.method = FrameMethod::kRingSegment;
    reply.request_id = header.request_id;
    reply.status = static_cast<uint32_t>(verdict.code());
    return in->Send(reply, verdict.message(), {}, deadline);
  };
  // Fails the op with `verdict`, and tells the sender.
  auto refuse = [&](const absl::Status& verdict) {
    *refused = true;
    answer(verdict).IgnoreError();
    return verdict;
  };
  proto::CollectiveHeader segment;
  if (header.kind != FrameKind::kRequest || header.method != FrameMethod::kRingSegment ||
      !segment.ParseFromString(meta)) {
    return refuse(absl::InvalidArgumentError(absl::StrCat(
        "allreduce: ", in->peer(), " sent this worker's ring a frame that is no ring segment")));
  }
  if (absl::Status sender = rules_.CheckSender(segment); !sender.ok()) {
    return refuse(sender);
  }
  RingPeerRules::Verdict verdict;
  {
    absl::MutexLock lock(&mu_);
    verdict = rules_.Judge(segment);
  }
  if (!verdict.failure.ok()) {  // Its process restarted; told as its answer says.
    refuse(verdict.answer).IgnoreError();
    return verdict.failure;
  }
  if (!verdict.take) {
    // Of an earlier run (refused), or sent again after its answer was lost
    // (answered): dropped, and this worker waits on.
    RETURN_IF_ERROR(answer(verdict.answer));
    return absl::NotFoundError("a segment dropped");
  }
  if (segment.op() != op || segment.step() != step) {
    return refuse(absl::FailedPreconditionError(absl::StrCat(
        "allreduce: ", rules_.PeerName(rules_.previous_rank()), " sent step ", segment.step(),
        " of op ", segment.op(), " while this worker waits for step ", step, " of op ", op)));
  }
  if (absl::Status size = rules_.CheckSize(op, step, header.data_size, bytes.size()); !size.ok()) {
    return refuse(size);
  }
  // A segment sent again after its connection broke: what was taken of it
  // is skipped (not added twice).
  if (partial_ != std::make_pair(op, step)) {
    partial_ = {op, step};
    partial_bytes_ = 0;
  }
  RETURN_IF_ERROR(in->SkipData(partial_bytes_, deadline));
  RETURN_IF_ERROR(RingPeerRules::TakeSegment(
      bytes, add, &partial_bytes_,
      [&](uint64_t, absl::Span<char> into) { return in->ReceiveData(into, deadline); }));
  {
    absl::MutexLock lock(&mu_);
    rules_.Took(op, step);
  }
  partial_ = {0, 0};
  partial_bytes_ = 0;
  // A lost answer is no loss: the sender sends the segment again, and it
  // is answered and dropped above.
  answer(absl::OkStatus()).IgnoreError();
  return absl::OkStatus();
}

}  // namespace psrt
