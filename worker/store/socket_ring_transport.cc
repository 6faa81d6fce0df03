#include "worker/store/socket_ring_transport.h"

#include <algorithm>
#include <atomic>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "common/backoff.h"
#include "common/cluster_spec.h"
#include "common/random_id.h"
#include "common/rpc_util.h"
#include "common/status_macros.h"
#include "common/transport_security.h"
#include "dataplane/frame_connection.h"
#include "dataplane/hello.h"
#include "glog/logging.h"
#include "kernels/elementwise.h"
#include "proto/psrt.pb.h"
#include "worker/store/grpc_ring_transport.h"

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
// How long a failed op's send in flight is given to land (FinishSend).
constexpr absl::Duration kFailedOpSendGrace = absl::Seconds(2);
// How often a waiting receive looks at its other duties (a new incoming
// connection, the sender's failure).
constexpr absl::Duration kLookInterval = absl::Milliseconds(50);
// Received segments are added in blocks of this many floats (64 KiB).
constexpr size_t kBlockFloats = 16 * 1024;

// Where a worker whose gRPC port is `port` takes segments from a worker on
// its host.
std::string RingLocalAddress(int port) { return absl::StrCat("unix-abstract:psrt-ring-", port); }

int PortOf(const std::string& address) {
  std::string host;
  int port = 0;
  return SplitHostPort(address, &host, &port).ok() ? port : 0;
}

}  // namespace

struct SocketRingTransport::Outgoing final : RingTransport::Send {
  int64_t op = 0;
  int step = 0;
  absl::Span<const char> bytes;
  absl::Time give_up;  // Of connecting (again); a send under way is watched by FinishSend.
  std::atomic<bool> cancelled{false};
  absl::Status status;  // Set before `done`.
  absl::Notification done;
};

SocketRingTransport::SocketRingTransport(const Collective::Options& options,
                                         GrpcRingTransport* control)
    : options_(options),
      control_(control),
      next_rank_((options.rank + 1) % static_cast<int>(options.addresses.size())),
      previous_rank_((options.rank + static_cast<int>(options.addresses.size()) - 1) %
                     static_cast<int>(options.addresses.size())),
      incarnation_(NewIncarnation()),
      security_(options.security ? options.security : std::make_shared<const TransportSecurity>()),
      credential_(security_->DataPlaneCredential()) {
  std::string host;
  int port = 0;
  listen_error_ = SplitHostPort(options_.addresses[options_.rank], &host, &port);
  if (listen_error_.ok()) {
    const std::string listen_host =
        options_.data_listen_host.empty() ? host : options_.data_listen_host;
    absl::StatusOr<std::unique_ptr<FrameListener>> tcp =
        FrameListener::Listen(JoinHostPort(listen_host, options_.data_port));
    if (tcp.ok()) {
      control_->set_data_address(JoinHostPort(host, PortOf((*tcp)->address())));
      listeners_.push_back(*std::move(tcp));
    } else {
      listen_error_ =
          absl::UnavailableError(absl::StrCat("allreduce: worker/", options_.rank,
                                              " cannot listen for the ring's data "
                                              "plane on ",
                                              listen_host, ": ", tcp.status().message()));
    }
  }
  if (listen_error_.ok() && options_.unix_socket) {
    absl::StatusOr<std::unique_ptr<FrameListener>> local =
        FrameListener::Listen(RingLocalAddress(port));
    // Required: a previous worker on this host connects there only.
    if (local.ok()) {
      listeners_.push_back(*std::move(local));
    } else {
      listen_error_ = absl::UnavailableError(
          absl::StrCat("allreduce: worker/", options_.rank, " cannot listen for the ring on ",
                       RingLocalAddress(port), ": ", local.status().message()));
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

SocketRingTransport::~SocketRingTransport() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    if (out_ != nullptr) out_->Shutdown();
  }
  for (auto& listener : listeners_) listener->Shutdown();
  for (std::thread& t : accept_threads_) t.join();
  send_thread_.join();
}

void SocketRingTransport::AcceptLoop(FrameListener* listener) {
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
      taken = absl::StrCat(taken_.first, " ", taken_.second);
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
        ++refused_hellos_;
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

std::unique_ptr<RingTransport::Send> SocketRingTransport::StartSend(int64_t op, int step,
                                                                    absl::Span<const char> bytes) {
  auto out = std::make_unique<Outgoing>();
  out->op = op;
  out->step = step;
  out->bytes = bytes;
  out->give_up = absl::Now() + control_->Timeout(op);
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

void SocketRingTransport::SendLoop() {
  while (true) {
    Outgoing* out = nullptr;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](SocketRingTransport* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->mu_) {
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

absl::Status SocketRingTransport::SendSegment(Outgoing* out) {
  Backoff backoff(absl::Milliseconds(50), absl::Seconds(1));
  while (true) {
    const absl::Status status = TrySend(out);
    if (status.ok()) return status;
    {
      absl::MutexLock lock(&mu_);
      out_.reset();  // Whatever failed, the next attempt connects anew.
    }
    if (out->cancelled.load()) {
      return absl::CancelledError(absl::StrCat("allreduce: the send to ",
                                               control_->PeerName(next_rank_),
                                               " was cancelled: the op failed"));
    }
    // Unavailable: the next worker is not (yet) there, or its connection
    // broke; anything else is its verdict or a fault that a retry repeats.
    if (!absl::IsUnavailable(status)) return status;
    if (absl::Now() + backoff.Peek() >= out->give_up) {
      return absl::UnavailableError(
          absl::StrCat("allreduce: sending to ", control_->PeerName(next_rank_),
                       " failed: ", status.message(), " (it is down, hung or unreachable)"));
    }
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(
                             +[](Outgoing* o) { return o->cancelled.load(); }, out),
                         backoff.Next());
  }
}

absl::StatusOr<std::string> SocketRingTransport::NextAddress() {
  const std::string& next = options_.addresses[next_rank_];
  if (options_.unix_socket && PreferLocalSocket(next) != next) {
    return RingLocalAddress(PortOf(next));
  }
  return control_->NextDataAddress(kConnectTimeout);
}

absl::Status SocketRingTransport::TrySend(Outgoing* out) {
  FrameConnection* connection = nullptr;
  {
    absl::MutexLock lock(&mu_);
    connection = out_.get();
  }
  if (connection == nullptr) {
    // One attempt's timeouts (a ping, a hello) are tried again until the
    // op's, as an unreachable next worker is.
    absl::StatusOr<std::string> address = NextAddress();
    if (absl::IsDeadlineExceeded(address.status())) {
      return absl::UnavailableError(address.status().message());
    }
    RETURN_IF_ERROR(address.status());
    std::string taken;
    absl::StatusOr<std::unique_ptr<FrameConnection>> opened =
        dataplane::ConnectWithHello(*address, credential_, kMaxSegmentBytes,
                                    std::min(out->give_up, absl::Now() + kConnectTimeout), &taken);
    if (absl::IsUnauthenticated(opened.status()) || absl::IsPermissionDenied(opened.status())) {
      return absl::UnauthenticatedError(
          absl::StrCat("allreduce: unauthenticated: ", control_->PeerName(next_rank_),
                       " refused this worker's token (", opened.status().message(),
                       "): do the workers share --auth_token_file or PSRT_AUTH_TOKEN?"));
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
    // Sent again after a lost answer, and taken already: delivered.
    int64_t taken_op = 0;
    int taken_step = 0;
    const std::vector<std::string> parts = absl::StrSplit(taken, ' ');
    if (parts.size() == 2 && absl::SimpleAtoi(parts[0], &taken_op) &&
        absl::SimpleAtoi(parts[1], &taken_step) &&
        std::make_pair(out->op, out->step) <= std::make_pair(taken_op, taken_step)) {
      return absl::OkStatus();
    }
  }
  proto::CollectiveHeader meta;
  meta.set_op(out->op);
  meta.set_step(out->step);
  meta.set_sender(options_.rank);
  meta.set_incarnation(incarnation_);
  FrameHeader header;
  header.kind = FrameKind::kRequest;
  header.method = FrameMethod::kRingSegment;
  header.request_id = ++request_id_;
  // No deadline: FinishSend watches whether the next worker still answers,
  // and cancels the send (Shutdown) when it does not.
  RETURN_IF_ERROR(
      connection->Send(header, meta.SerializeAsString(), {out->bytes}, absl::InfiniteFuture()));
  FrameHeader reply;
  std::string text;
  RETURN_IF_ERROR(connection->ReceiveHeader(&reply, &text, absl::InfiniteFuture()));
  if (reply.kind != FrameKind::kReply || reply.request_id != header.request_id ||
      reply.data_size != 0) {
    return absl::DataLossError(absl::StrCat("allreduce: ", control_->PeerName(next_rank_),
                                            " answered a segment out of step"));
  }
  if (reply.status != 0) {
    // Its verdict, in its words; Unavailable (it saw this worker restart)
    // is tried again, as over gRPC.
    return absl::Status(static_cast<absl::StatusCode>(reply.status),
                        absl::StrCat(control_->PeerName(next_rank_), " refused step ", out->step,
                                     " of op ", out->op, ": ", text));
  }
  return absl::OkStatus();
}

absl::Status SocketRingTransport::FinishSend(std::unique_ptr<Send> send, bool op_failed) {
  std::unique_ptr<Outgoing> out(static_cast<Outgoing*>(send.release()));
  auto cancel = [&] {
    absl::MutexLock lock(&mu_);
    if (out->done.HasBeenNotified()) return;  // Landed (or failed) already.
    out->cancelled.store(true);
    if (out_ != nullptr) out_->Shutdown();
  };
  if (op_failed) {
    // A send already on its way is let land, briefly (as over gRPC).
    if (!out->done.WaitForNotificationWithTimeout(kFailedOpSendGrace)) cancel();
    out->done.WaitForNotification();
    return out->status;
  }
  const absl::Time start = absl::Now();
  while (!out->done.WaitForNotificationWithTimeout(control_->Timeout(out->op))) {
    // Not taken within the op's timeout: a next worker that still answers
    // is busy (the chief evaluating or saving); one that does not is dead
    // or hung.
    const absl::Duration waited = absl::Now() - start;
    absl::StatusOr<std::string> alive =
        control_->NextDataAddress(std::min(options_.timeout, absl::Seconds(30)));
    if (!alive.ok() || waited >= options_.busy_timeout) {
      cancel();
      out->done.WaitForNotification();
      if (out->status.ok()) return out->status;  // It landed meanwhile.
      return absl::DeadlineExceededError(
          absl::StrCat("allreduce: ", control_->PeerName(next_rank_), " has not taken step ",
                       out->step, " of op ", out->op, " in ",
                       absl::FormatDuration(absl::Trunc(waited, absl::Seconds(1))), ": ",
                       alive.ok() ? "it answers but reads nothing (--allreduce_busy_timeout_secs)"
                                  : absl::StrCat("it died, hung or cannot be reached (",
                                                 alive.status().message(), ")")));
    }
    LOG(INFO) << "allreduce: " << control_->PeerName(next_rank_)
              << " is alive but has not taken a segment for "
              << absl::Trunc(waited, absl::Seconds(1)) << "; waiting (it may be evaluating or "
              << "saving)";
  }
  return out->status;
}

std::unique_ptr<FrameConnection> SocketRingTransport::TakeIncoming() {
  absl::MutexLock lock(&mu_);
  return std::move(incoming_);
}

absl::Status SocketRingTransport::CheckSilentPrevious(int64_t op, int step, absl::Duration silent) {
  const absl::Status alive = control_->Ping(std::min(options_.timeout, absl::Seconds(30)));
  if (!alive.ok() || silent >= options_.busy_timeout) {
    return absl::DeadlineExceededError(absl::StrCat(
        "allreduce: nothing from ", control_->PeerName(previous_rank_), " for ",
        absl::FormatDuration(absl::Trunc(silent, absl::Seconds(1))), " (op ", op, ", step ", step,
        "): ",
        alive.ok()
            ? "it answers but sends nothing (--allreduce_busy_timeout_secs)"
            : absl::StrCat("it died, hung or cannot reach this worker (", alive.message(), ")")));
  }
  LOG(INFO) << "allreduce: " << control_->PeerName(previous_rank_)
            << " is alive but has sent nothing for " << absl::Trunc(silent, absl::Seconds(1))
            << "; waiting (it may be evaluating or saving)";
  return absl::OkStatus();
}

absl::Status SocketRingTransport::Receive(int64_t op, int step, absl::Span<char> bytes, bool add) {
  if (!listen_error_.ok()) return listen_error_;
  const absl::Time start = absl::Now();
  absl::Time silent_until = start + control_->Timeout(op);
  while (true) {
    bool refused = false;  // A hello refused for its token since the last look.
    {
      absl::MutexLock lock(&mu_);
      if (!send_error_.ok()) return send_error_;
      refused = refused_hellos_ != refusals_checked_;
      refusals_checked_ = refused_hellos_;
    }
    if (refused) {
      // Any client may be refused; the previous worker is the one when it
      // does not take this worker's token either (a ping).
      const absl::Status alive = control_->Ping(std::min(options_.timeout, absl::Seconds(5)));
      if (!alive.ok()) {
        return absl::UnauthenticatedError(absl::StrCat(
            "allreduce: unauthenticated: this worker refused a ring connection without its "
            "auth token, and ",
            control_->PeerName(previous_rank_), " does not answer this worker (", alive.message(),
            "): do the workers share --auth_token_file or PSRT_AUTH_TOKEN?"));
      }
    }
    if (std::unique_ptr<FrameConnection> fresh = TakeIncoming()) in_ = std::move(fresh);
    if (in_ != nullptr && in_->broken()) in_.reset();
    if (in_ == nullptr) {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(
                               +[](SocketRingTransport* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->mu_) {
                                 return t->incoming_ != nullptr || !t->send_error_.ok() ||
                                        t->refused_hellos_ != t->refusals_checked_;
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
                       << control_->PeerName(previous_rank_) << " to send it again";
          in_.reset();
        }
        silent_until = absl::Now() + control_->Timeout(op);
        continue;
      }
      if (!absl::IsDeadlineExceeded(ready)) in_.reset();
    }
    if (absl::Now() >= silent_until) {
      RETURN_IF_ERROR(CheckSilentPrevious(op, step, absl::Now() - start));
      silent_until = absl::Now() + control_->Timeout(op);
    }
  }
}

absl::Status SocketRingTransport::ReadSegment(FrameConnection* in, int64_t op, int step,
                                              absl::Span<char> bytes, bool add, bool* refused) {
  *refused = false;
  const absl::Time deadline = absl::Now() + control_->Timeout(op);
  FrameHeader header;
  std::string meta;
  RETURN_IF_ERROR(in->ReceiveHeader(&header, &meta, deadline));
  // Tells the sender `verdict` (as `code`) after dropping the frame's data.
  auto answer = [&](absl::StatusCode code, absl::string_view text) {
    if (in->data_left() > 0) {
      if (absl::Status s = in->SkipData(in->data_left(), deadline); !s.ok()) return s;
    }
    FrameHeader reply;
    reply.kind = FrameKind::kReply;
    reply.method = FrameMethod::kRingSegment;
    reply.request_id = header.request_id;
    reply.status = static_cast<uint32_t>(code);
    return in->Send(reply, text, {}, deadline);
  };
  auto refuse = [&](absl::Status verdict) {
    *refused = true;
    answer(verdict.code(), verdict.message()).IgnoreError();
    return verdict;
  };
  proto::CollectiveHeader segment;
  if (header.kind != FrameKind::kRequest || header.method != FrameMethod::kRingSegment ||
      !segment.ParseFromString(meta)) {
    return refuse(
        absl::InvalidArgumentError(absl::StrCat("allreduce: ", in->peer(),
                                                " sent this worker's ring a frame that is no "
                                                "ring segment")));
  }
  if (segment.sender() != previous_rank_) {
    return refuse(absl::InvalidArgumentError(
        absl::StrCat("allreduce: worker/", options_.rank, " takes messages from worker/",
                     previous_rank_, " only, not from worker/", segment.sender(),
                     " (do all workers have the same "
                     "cluster spec?)")));
  }
  if (previous_incarnation_ == 0) {
    // As over gRPC: the previous worker's process is the one that joins
    // (op 1); a later op comes from a process of the run before this one
    // started, which is refused (so that it stops too) and fails nothing
    // here.
    if (segment.op() != 1) {
      RETURN_IF_ERROR(answer(absl::StatusCode::kFailedPrecondition,
                             absl::StrCat("allreduce: ", control_->PeerName(options_.rank),
                                          " restarted and takes "
                                          "no message of an earlier run (op ",
                                          segment.op(),
                                          "): every worker "
                                          "must restart")));
      return absl::NotFoundError("a message of an earlier run, refused");
    }
    previous_incarnation_ = segment.incarnation();
  }
  if (segment.incarnation() != previous_incarnation_) {
    const absl::Status restarted = absl::AbortedError(absl::StrCat(
        "allreduce: ", control_->PeerName(previous_rank_),
        " restarted (its process changed "
        "during the job); every worker must restart and resume from the last checkpoint"));
    *refused = true;
    // Unavailable: the restarted worker retries, and reaches this worker's
    // successor once it has restarted too.
    answer(absl::StatusCode::kUnavailable, restarted.message()).IgnoreError();
    return restarted;
  }
  const std::pair<int64_t, int> key(segment.op(), segment.step());
  if (key <= last_taken_) {  // Sent again after its answer was lost.
    RETURN_IF_ERROR(answer(absl::StatusCode::kOk, ""));
    return absl::NotFoundError("a segment taken already");
  }
  if (key != std::make_pair(op, step)) {
    return refuse(absl::FailedPreconditionError(absl::StrCat(
        "allreduce: ", control_->PeerName(previous_rank_), " sent step ", segment.step(), " of op ",
        segment.op(), " while this worker waits for step ", step, " of op ", op)));
  }
  if (header.data_size != bytes.size()) {
    return refuse(absl::InvalidArgumentError(
        absl::StrCat("allreduce: ", control_->PeerName(previous_rank_), " sent ", header.data_size,
                     " bytes for step ", step, " of op ", op, ", this worker expected ",
                     bytes.size(), " (do all workers train the same model?)")));
  }
  // A segment sent again after its connection broke: what was added of it
  // is not added twice.
  uint64_t done = partial_ == key ? partial_bytes_ : 0;
  RETURN_IF_ERROR(in->SkipData(done, deadline));
  if (!add) {
    RETURN_IF_ERROR(in->ReceiveData(bytes.subspan(done), deadline));
  } else {
    add_block_.resize(kBlockFloats);
    partial_ = key;
    while (done < bytes.size()) {
      const size_t n = std::min<size_t>(kBlockFloats * sizeof(float), bytes.size() - done);
      RETURN_IF_ERROR(in->ReceiveData({reinterpret_cast<char*>(add_block_.data()), n}, deadline));
      kernels::Accumulate({add_block_.data(), n / sizeof(float)},
                          {reinterpret_cast<float*>(bytes.data() + done), n / sizeof(float)});
      done += n;
      partial_bytes_ = done;
    }
  }
  last_taken_ = key;
  {
    absl::MutexLock lock(&mu_);
    taken_ = key;
  }
  partial_ = {0, 0};
  partial_bytes_ = 0;
  // A lost answer is no loss: the sender sends the segment again, and it
  // is answered and dropped above.
  answer(absl::StatusCode::kOk, "").IgnoreError();
  return absl::OkStatus();
}

}  // namespace psrt
