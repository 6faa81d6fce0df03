#include "worker/store/grpc_ring_transport.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/backoff.h"
#include "common/random_id.h"
#include "common/rpc_util.h"
#include "common/status_macros.h"
#include "common/tensor_frame.h"
#include "common/transport_security.h"
#include "glog/logging.h"
#include "grpcpp/client_context.h"
#include "grpcpp/generic/generic_stub.h"
#include "kernels/elementwise.h"
#include "proto/psrt.grpc.pb.h"

namespace psrt {
namespace {

constexpr char kDeliver[] = "/psrt.proto.Collective/Deliver";

// How long a failed op's send in flight is given to land (FinishSend).
constexpr absl::Duration kFailedOpSendGrace = absl::Seconds(2);

// Received segments are added in blocks of this many floats (64 KiB), read
// from gRPC's buffers into a cache-resident scratch.
constexpr size_t kBlockFloats = 16 * 1024;

// The rank `offset` places along the ring from this worker's.
int RankAt(const Collective::Options& options, int offset) {
  const int size = static_cast<int>(options.addresses.size());
  CHECK(options.rank >= 0 && options.rank < size) << options.rank << " of " << size;
  return (options.rank + offset + size) % size;
}

}  // namespace

class GrpcRingTransport::Service final
    : public proto::Collective::WithRawCallbackMethod_Deliver<proto::Collective::Service> {
 public:
  explicit Service(GrpcRingTransport* transport) : transport_(transport) {}
  grpc::ServerUnaryReactor* Deliver(grpc::CallbackServerContext* context,
                                    const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override {
    absl::Status status = transport_->Deliver(*request);
    if (status.ok()) {
      proto::CollectiveAck ack;
      ack.set_data_address(transport_->data_address_);
      *response = SerializeToByteBuffer(ack);
    }
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }

 private:
  GrpcRingTransport* const transport_;
};

// One message to the next worker, and its attempts.
struct GrpcRingTransport::Call final : RingTransport::Send {
  grpc::ByteBuffer request;
  absl::Notification released;  // gRPC dropped the segment's memory.
  absl::Time give_up;
  // The attempt in flight.
  std::unique_ptr<grpc::ClientContext> context;
  grpc::ByteBuffer response;
  std::unique_ptr<absl::Notification> done;
  grpc::Status status;
  // Retries of an attempt that found the next worker Unavailable (still
  // starting): when the next one is due; InfiniteFuture when none is.
  Backoff backoff{absl::Milliseconds(50), absl::Seconds(1)};
  absl::Time retry_at = absl::InfiniteFuture();
};

GrpcRingTransport::GrpcRingTransport(const Collective::Options& options)
    : options_(options),
      next_rank_(RankAt(options_, +1)),
      previous_rank_(RankAt(options_, -1)),
      incarnation_(NewIncarnation()),
      service_(std::make_unique<Service>(this)) {
  const TransportSecurity plaintext;
  const TransportSecurity& security = options_.security ? *options_.security : plaintext;
  auto stub = [&](int rank) {
    const std::string& address = options_.addresses[rank];
    return std::make_unique<grpc::GenericStub>(NewChannel(
        options_.unix_socket && !security.tls() ? PreferLocalSocket(address) : address, security));
  };
  next_ = stub(next_rank_);
  previous_ = stub(previous_rank_);
  // A Deliver this process's servers refuse for its token wakes Receive,
  // which asks whether the previous worker still takes this worker's token
  // (a ping): if not, it is the one refused, and cannot deliver anything
  // (it may even have gone already, failed by the refusal). Any client may
  // be refused, so the refusal alone fails nothing.
  refused_listener_ = AddRefusedCallListener([this](absl::string_view method) {
    if (method != kDeliver) return;
    absl::MutexLock lock(&mu_);
    ++refused_deliveries_;
  });
}

GrpcRingTransport::~GrpcRingTransport() { RemoveRefusedCallListener(refused_listener_); }

grpc::Service* GrpcRingTransport::service() { return service_.get(); }

std::string GrpcRingTransport::PeerName(int rank) const {
  return absl::StrCat("worker/", rank, " (", options_.addresses[rank], ")");
}

absl::Duration GrpcRingTransport::Timeout(int64_t op) const {
  return op <= 1 ? std::max(options_.timeout, options_.startup_timeout) : options_.timeout;
}

absl::Status GrpcRingTransport::Deliver(const grpc::ByteBuffer& frame) {
  TensorFrameReader reader;
  proto::CollectiveHeader header;
  RETURN_IF_ERROR(reader.Open(frame, &header));
  // Op 0 is a neighbour asking whether this process still answers (the
  // next worker), or where it takes segments (the previous one).
  if (header.op() == 0 && (header.sender() == next_rank_ || header.sender() == previous_rank_)) {
    return absl::OkStatus();
  }
  if (header.sender() != previous_rank_) {
    return absl::InvalidArgumentError(absl::StrCat("allreduce: worker/", options_.rank,
                                                   " takes messages from worker/", previous_rank_,
                                                   " only, not from worker/", header.sender(),
                                                   " (do all workers have the same "
                                                   "cluster spec?)"));
  }
  absl::MutexLock lock(&mu_);
  if (previous_incarnation_ == 0) {
    // The previous worker's process is the one that joins with this one
    // (op 1, which reaches every worker). Messages of later ops come from a
    // process that ran before this one started (a job restarting after a
    // fault): refused, so that it stops too.
    if (header.op() != 1) {
      return absl::FailedPreconditionError(absl::StrCat("allreduce: ", PeerName(options_.rank),
                                                        " restarted and takes no message of an "
                                                        "earlier run (op ",
                                                        header.op(),
                                                        "): every worker must restart"));
    }
    previous_incarnation_ = header.incarnation();
  }
  if (header.incarnation() != previous_incarnation_) {
    const absl::Status restarted = absl::AbortedError(
        absl::StrCat("allreduce: ", PeerName(previous_rank_),
                     " restarted (its process changed during "
                     "the job); every worker must restart and resume from the last checkpoint"));
    if (peer_error_.ok()) peer_error_ = restarted;
    // Unavailable: the restarted worker retries, and reaches this worker's
    // successor once it has restarted too.
    return absl::UnavailableError(restarted.message());
  }
  // A retried message that had arrived is taken once.
  if (std::make_pair(header.op(), header.step()) <= last_taken_) return absl::OkStatus();
  inbox_.try_emplace({header.op(), header.step()}, std::make_unique<grpc::ByteBuffer>(frame));
  return absl::OkStatus();
}

std::unique_ptr<RingTransport::Send> GrpcRingTransport::StartSend(int64_t op, int step,
                                                                  absl::Span<const char> bytes) {
  auto call = std::make_unique<Call>();
  proto::CollectiveHeader header;
  header.set_op(op);
  header.set_step(step);
  header.set_sender(options_.rank);
  header.set_incarnation(incarnation_);
  Call* raw = call.get();
  call->request = EncodeTensorFrame(header, {bytes}, [raw] { raw->released.Notify(); });
  call->give_up = absl::Now() + Timeout(op);
  StartAttempt(raw);
  sending_ = raw;
  return call;
}

void GrpcRingTransport::RetryWhenDue(Call* call) {
  if (!call->done->HasBeenNotified()) return;
  call->done->WaitForNotification();  // After which it may be replaced.
  if (call->status.error_code() != grpc::StatusCode::UNAVAILABLE) return;
  const absl::Time now = absl::Now();
  if (call->retry_at == absl::InfiniteFuture()) {
    if (now + call->backoff.Peek() >= call->give_up) return;  // Failed for good.
    call->retry_at = now + call->backoff.Next();
  }
  if (now < call->retry_at) return;
  call->retry_at = absl::InfiniteFuture();
  StartAttempt(call);  // The next worker may still be starting.
}

void GrpcRingTransport::StartAttempt(Call* call) {
  call->context = std::make_unique<grpc::ClientContext>();
  call->context->set_deadline(absl::ToChronoTime(call->give_up));
  call->done = std::make_unique<absl::Notification>();
  next_->UnaryCall(call->context.get(), kDeliver, grpc::StubOptions(), &call->request,
                   &call->response, [this, call](grpc::Status status) {
                     if (!status.ok() && status.error_code() != grpc::StatusCode::UNAVAILABLE) {
                       // Not retried: the receiving side need not wait for
                       // its peer any longer.
                       absl::MutexLock lock(&mu_);
                       if (peer_error_.ok()) peer_error_ = SendError(status);
                     }
                     call->status = std::move(status);
                     call->done->Notify();
                   });
}

absl::Status GrpcRingTransport::SendError(const grpc::Status& status) const {
  return absl::Status(
      static_cast<absl::StatusCode>(status.error_code()),
      absl::StrCat("allreduce: sending to ", PeerName(next_rank_),
                   " failed: ", status.error_message(),
                   status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                           status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
                       ? " (it is down, hung or unreachable)"
                       : ""));
}

absl::Status GrpcRingTransport::CheckRefusal() {
  const absl::Status alive = Ping(std::min(options_.timeout, absl::Seconds(5)));
  if (alive.ok()) {
    LOG_FIRST_N(WARNING, 1) << "allreduce: this worker refused a message without its auth "
                               "token, not from "
                            << PeerName(previous_rank_) << ", which takes it; going on";
    return absl::OkStatus();
  }
  const absl::Status refused = absl::UnauthenticatedError(absl::StrCat(
      "allreduce: unauthenticated: this worker refused a message without its auth token, "
      "and ",
      PeerName(previous_rank_), " does not answer this worker (", alive.message(),
      "): do the workers share --auth_token_file or PSRT_AUTH_TOKEN?"));
  absl::MutexLock lock(&mu_);
  if (peer_error_.ok()) peer_error_ = refused;
  return peer_error_;
}

absl::StatusOr<proto::CollectiveAck> GrpcRingTransport::PingOver(grpc::GenericStub* stub,
                                                                 absl::Duration deadline) {
  proto::CollectiveHeader header;  // Op 0.
  header.set_sender(options_.rank);
  header.set_incarnation(incarnation_);
  grpc::ByteBuffer request = EncodeTensorFrame(header, {});
  grpc::ByteBuffer response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  absl::Notification done;
  grpc::Status status;
  stub->UnaryCall(&context, kDeliver, grpc::StubOptions(), &request, &response,
                  [&](grpc::Status s) {
                    status = std::move(s);
                    done.Notify();
                  });
  done.WaitForNotification();
  RETURN_IF_ERROR(FromGrpcStatus(status));
  proto::CollectiveAck ack;
  RETURN_IF_ERROR(ParseFromByteBuffer(response, &ack));
  return ack;
}

absl::Status GrpcRingTransport::Ping(absl::Duration deadline) {
  return PingOver(previous_.get(), deadline).status();
}

absl::StatusOr<std::string> GrpcRingTransport::NextDataAddress(absl::Duration deadline) {
  absl::StatusOr<proto::CollectiveAck> ack = PingOver(next_.get(), deadline);
  if (!ack.ok()) {
    return absl::Status(ack.status().code(),
                        absl::StrCat("allreduce: ", PeerName(next_rank_),
                                     " does not answer: ", ack.status().message()));
  }
  if (ack->data_address().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("allreduce: ", PeerName(next_rank_),
                     " takes the ring's segments over gRPC only, this "
                     "worker over the data plane: give every worker the same --tensor_transport"));
  }
  return ack->data_address();
}

absl::Status GrpcRingTransport::FinishSend(std::unique_ptr<Send> send, bool op_failed) {
  std::unique_ptr<Call> call(static_cast<Call*>(send.release()));
  sending_ = nullptr;
  while (true) {
    {
      // A failed op (here or at a peer) retries nothing and waits for nothing.
      absl::MutexLock lock(&mu_);
      op_failed |= !peer_error_.ok();
    }
    // An attempt already on its way is let land, briefly: a live next
    // worker then learns of this op from the message itself (a segment of
    // another size fails it, naming the cause) instead of waiting, alive
    // and silent, for its busy timeout. A dead or hung one costs the grace.
    if (op_failed && !call->done->HasBeenNotified() &&
        !call->done->WaitForNotificationWithTimeout(kFailedOpSendGrace)) {
      call->context->TryCancel();
    }
    call->done->WaitForNotification();
    if (call->status.error_code() != grpc::StatusCode::UNAVAILABLE || op_failed) break;
    RetryWhenDue(call.get());
    if (call->done->HasBeenNotified()) {                    // Not sent again:
      if (call->retry_at == absl::InfiniteFuture()) break;  // given up,
      absl::SleepFor(call->retry_at - absl::Now());         // or not yet due.
    }
  }
  const grpc::Status status = call->status;
  // gRPC may hold the segment past the call's end: wait until it lets go.
  call->request.Clear();
  call->context.reset();
  call->response.Clear();
  if (status.ok()) {
    call->released.WaitForNotification();
    return absl::OkStatus();
  }
  // A failed call's bytes can stay queued on a connection whose peer reads
  // nothing (it hangs); they are released only when the connection closes.
  // The Collective has failed for good: close the channel (its last
  // reference), so that the transport drops them before the caller frees
  // the buffer they point into.
  if (!call->released.WaitForNotificationWithTimeout(absl::Seconds(1))) {
    next_.reset();
    if (!call->released.WaitForNotificationWithTimeout(absl::Seconds(5))) {
      LOG(WARNING) << "allreduce: gRPC still holds a failed message; not waiting for it";
      call.release();  // Deliberately leaked: the callback still names it.
    }
  }
  return SendError(status);
}

absl::Status GrpcRingTransport::Receive(int64_t op, int step, absl::Span<char> bytes, bool add) {
  const auto key = std::make_pair(op, step);
  std::unique_ptr<grpc::ByteBuffer> frame;
  const absl::Time start = absl::Now();
  while (frame == nullptr) {
    // Meanwhile this worker's own send of the step is retried while the
    // next worker is still starting: it may never send to this one before
    // it has heard from it.
    const absl::Time silent_until = absl::Now() + Timeout(op);
    bool timed_out = false;
    while (frame == nullptr && !timed_out) {
      if (sending_ != nullptr) RetryWhenDue(sending_);
      bool refused = false;  // A Deliver refused for its token, since the last look.
      {
        absl::MutexLock lock(&mu_);
        auto arrived = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return inbox_.count(key) > 0 || !peer_error_.ok() ||
                 refused_deliveries_ != refusals_checked_;
        };
        // Looked at every 50 ms until the send has gone through.
        const bool sent =
            sending_ == nullptr || (sending_->done->HasBeenNotified() && sending_->status.ok());
        const absl::Duration left = silent_until - absl::Now();
        mu_.AwaitWithTimeout(absl::Condition(&arrived),
                             sent ? left : std::min(left, absl::Milliseconds(50)));
        auto it = inbox_.find(key);
        if (it != inbox_.end()) {
          frame = std::move(it->second);
          inbox_.erase(it);
          last_taken_ = key;
          break;
        }
        if (!peer_error_.ok()) return peer_error_;
        refused = refused_deliveries_ != refusals_checked_;
        refusals_checked_ = refused_deliveries_;
      }
      if (refused) RETURN_IF_ERROR(CheckRefusal());
      timed_out = absl::Now() >= silent_until;
    }
    if (frame != nullptr) break;
    // Silent for a timeout: a previous worker that still answers is busy
    // (the chief evaluating or saving), and is waited for up to
    // busy_timeout; one that does not answer is dead or hung.
    const absl::Duration silent = absl::Now() - start;
    const absl::Status alive = Ping(std::min(options_.timeout, absl::Seconds(30)));
    if (!alive.ok() || silent >= options_.busy_timeout) {
      return absl::DeadlineExceededError(absl::StrCat(
          "allreduce: nothing from ", PeerName(previous_rank_), " for ",
          absl::FormatDuration(absl::Trunc(silent, absl::Seconds(1))), " (op ", op, ", step ", step,
          "): ",
          alive.ok()
              ? "it answers but sends nothing (--allreduce_busy_timeout_secs)"
              : absl::StrCat("it died, hung or cannot reach this worker (", alive.message(), ")")));
    }
    LOG(INFO) << "allreduce: " << PeerName(previous_rank_) << " is alive but has sent nothing for "
              << absl::Trunc(silent, absl::Seconds(1))
              << "; waiting (it may be evaluating or saving)";
  }
  TensorFrameReader reader;
  proto::CollectiveHeader header;
  RETURN_IF_ERROR(reader.Open(*frame, &header));
  if (reader.size() != bytes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("allreduce: ", PeerName(previous_rank_), " sent ", reader.size(),
                     " bytes for step ", step, " of op ", op, ", this worker expected ",
                     bytes.size(), " (do all workers train the same model?)"));
  }
  if (!add) {
    reader.ReadAt(0, bytes);
    return absl::OkStatus();
  }
  const absl::Span<float> segment(reinterpret_cast<float*>(bytes.data()),
                                  bytes.size() / sizeof(float));
  thread_local std::vector<float> block(kBlockFloats);
  for (size_t begin = 0; begin < segment.size(); begin += kBlockFloats) {
    const size_t n = std::min(kBlockFloats, segment.size() - begin);
    reader.ReadAt(begin * sizeof(float),
                  {reinterpret_cast<char*>(block.data()), n * sizeof(float)});
    kernels::Accumulate({block.data(), n}, segment.subspan(begin, n));
  }
  return absl::OkStatus();
}

}  // namespace psrt
