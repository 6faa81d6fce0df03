#include "worker/ring/grpc_ring_transport.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/backoff.h"
#include "common/rpc_util.h"
#include "common/status_macros.h"
#include "common/tensor_frame.h"
#include "common/transport_security.h"
#include "glog/logging.h"
#include "grpcpp/client_context.h"
#include "grpcpp/generic/generic_stub.h"
#include "proto/psrt.grpc.pb.h"

namespace psrt {
namespace {

constexpr char kDeliver[] = "/psrt.proto.Collective/Deliver";

}  // namespace

class GrpcRingTransport::Service final
    : public proto::Collective::WithRawCallbackMethod_Deliver<proto::Collective::Service> {
 public:
  explicit Service(GrpcRingTransport* transport) : transport_(transport) {}
  grpc::ServerUnaryReactor* Deliver(grpc::CallbackServerContext* context,
                                    const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override {
    proto::CollectiveAck ack;
    absl::Status status = transport_->Deliver(*request, &ack);
    if (status.ok()) *response = SerializeToByteBuffer(ack);
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
  Backoff backoff = RingPeerRules::SendBackoff();
  absl::Time retry_at = absl::InfiniteFuture();
};

GrpcRingTransport::GrpcRingTransport(const RingOptions& options)
    : rules_(options, this), service_(std::make_unique<Service>(this)) {
  const TransportSecurity plaintext;
  const TransportSecurity& security = options.security ? *options.security : plaintext;
  auto stub = [&](int rank) {
    const std::string& address = options.addresses[rank];
    return std::make_unique<grpc::GenericStub>(NewChannel(
        options.unix_socket && !security.tls() ? PreferLocalSocket(address) : address, security));
  };
  next_ = stub(rules_.next_rank());
  previous_ = stub(rules_.previous_rank());
  // A Deliver this process's servers refuse for its token wakes Receive,
  // which asks whether the previous worker still takes this worker's token
  // (a ping): if not, it is the one refused, and cannot deliver anything
  // (it may even have gone already, failed by the refusal). Any client may
  // be refused, so the refusal alone fails nothing.
  refused_listener_ = AddRefusedCallListener([this](absl::string_view method) {
    if (method != kDeliver) return;
    absl::MutexLock lock(&mu_);
    rules_.CountRefusal();
  });
}

GrpcRingTransport::~GrpcRingTransport() { RemoveRefusedCallListener(refused_listener_); }

grpc::Service* GrpcRingTransport::service() { return service_.get(); }

void GrpcRingTransport::Abort(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  if (peer_error_.ok()) peer_error_ = why;
}

void GrpcRingTransport::Failed(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  if (failed_.ok()) failed_ = why;
}

absl::Status GrpcRingTransport::Deliver(const grpc::ByteBuffer& frame,
                                        proto::CollectiveAck* ack) {
  ack->set_data_address(data_address_);
  ack->set_data_local_address(data_local_address_);
  TensorFrameReader reader;
  proto::CollectiveHeader header;
  RETURN_IF_ERROR(reader.Open(frame, &header));
  // Op 0 is a neighbour asking whether this process still answers (the
  // next worker), or where it takes segments (the previous one); in an
  // elastic job, maybe a neighbour of another generation's ring.
  if (header.op() == 0 &&
      (header.sender() == rules_.next_rank() || header.sender() == rules_.previous_rank() ||
       header.generation() != rules_.options().generation)) {
    absl::MutexLock lock(&mu_);
    if (failed_.ok() || header.generation() != rules_.options().generation) {
      return absl::OkStatus();
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "allreduce: ", rules_.PeerName(rules_.options().rank), " left the ring: its op failed (",
        failed_.message(), ")"));
  }
  if (absl::Status sender = rules_.CheckSender(header); !sender.ok()) {
    // A neighbour in a newer list's ring: this ring's members changed, and
    // an op of it would wait for a neighbour that has moved on.
    if (header.generation() > rules_.options().generation) {
      Abort(absl::AbortedError(absl::StrCat(
          "allreduce: a neighbour is in a newer list's ring (the chief's list ",
          ListNumber(header.generation()), "; this worker is in list ",
          ListNumber(rules_.options().generation), "'s): the members changed")));
    }
    return sender;
  }
  absl::MutexLock lock(&mu_);
  RingPeerRules::Verdict verdict = rules_.Judge(header);
  if (!verdict.failure.ok() && peer_error_.ok()) peer_error_ = std::move(verdict.failure);
  if (verdict.take) {
    inbox_.try_emplace({header.op(), header.step()}, std::make_unique<grpc::ByteBuffer>(frame));
  }
  return verdict.answer;
}

std::unique_ptr<RingTransport::Send> GrpcRingTransport::StartSend(int64_t op, int step,
                                                                  absl::Span<const char> bytes) {
  auto call = std::make_unique<Call>();
  Call* raw = call.get();
  call->request =
      EncodeTensorFrame(rules_.Header(op, step), {bytes}, [raw] { raw->released.Notify(); });
  call->give_up = absl::Now() + rules_.Timeout(op);
  StartAttempt(raw);
  sending_ = raw;
  return call;
}

bool GrpcRingTransport::RetryWhenDue(Call* call) {
  if (!call->done->HasBeenNotified()) return false;
  call->done->WaitForNotification();  // After which it may be replaced.
  if (call->status.error_code() != grpc::StatusCode::UNAVAILABLE) return false;
  const absl::Time now = absl::Now();
  if (call->retry_at == absl::InfiniteFuture()) {
    if (now + call->backoff.Peek() >= call->give_up) return true;
    call->retry_at = now + call->backoff.Next();
  }
  if (now < call->retry_at) return false;
  call->retry_at = absl::InfiniteFuture();
  StartAttempt(call);  // The next worker may still be starting.
  return false;
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
                       if (peer_error_.ok()) peer_error_ = rules_.SendError(FromGrpcStatus(status));
                     }
                     call->status = std::move(status);
                     call->done->Notify();
                   });
}

absl::StatusOr<proto::CollectiveAck> GrpcRingTransport::PingOver(grpc::GenericStub* stub,
                                                                 absl::Duration deadline) {
  grpc::ByteBuffer request = EncodeTensorFrame(rules_.Header(0, 0), {});
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

absl::Status GrpcRingTransport::PingPrevious(absl::Duration deadline) {
  return PingOver(previous_.get(), deadline).status();
}

absl::StatusOr<std::vector<std::string>> GrpcRingTransport::NextDataAddresses(
    absl::Duration deadline) {
  absl::StatusOr<proto::CollectiveAck> ack = PingOver(next_.get(), deadline);
  if (!ack.ok()) {
    return absl::Status(ack.status().code(),
                        absl::StrCat("allreduce: ", rules_.PeerName(rules_.next_rank()),
                                     " does not answer: ", ack.status().message()));
  }
  if (ack->data_address().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("allreduce: ", rules_.PeerName(rules_.next_rank()),
                     " takes the ring's segments over gRPC only, this "
                     "worker over the data plane: give every worker the same --tensor_transport"));
  }
  std::vector<std::string> addresses;
  if (!ack->data_local_address().empty()) addresses.push_back(ack->data_local_address());
  addresses.push_back(ack->data_address());
  return addresses;
}

absl::Status GrpcRingTransport::FinishSend(std::unique_ptr<Send> send, bool op_failed) {
  std::unique_ptr<Call> call(static_cast<Call*>(send.release()));
  sending_ = nullptr;
  absl::Status cause;  // Why the op failed, when not by this send.
  while (true) {
    {
      // A failed op (here or at a peer) retries nothing and waits for nothing.
      absl::MutexLock lock(&mu_);
      cause = peer_error_;
      op_failed |= !cause.ok();
    }
    // An attempt already on its way is let land, briefly: a live next
    // worker then learns of this op from the message itself (a segment of
    // another size fails it, naming the cause) instead of waiting, alive
    // and silent, for its busy timeout. A dead or hung one costs the grace.
    if (op_failed && !call->done->HasBeenNotified() &&
        !call->done->WaitForNotificationWithTimeout(RingPeerRules::kFailedOpSendGrace)) {
      call->context->TryCancel();
    }
    call->done->WaitForNotification();
    if (call->status.error_code() != grpc::StatusCode::UNAVAILABLE || op_failed) break;
    if (RetryWhenDue(call.get())) break;  // Given up.
    // Not yet due; else sent again (that attempt may have failed already:
    // the next round looks at it).
    if (call->retry_at != absl::InfiniteFuture()) absl::SleepFor(call->retry_at - absl::Now());
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
  // An op failed by something else (a peer's error, the members changing)
  // reports that: the send's own error then only says it was not taken.
  // (A send refused with anything but Unavailable set peer_error_ itself.)
  if (!cause.ok()) return cause;
  return rules_.SendError(FromGrpcStatus(status));
}

absl::Status GrpcRingTransport::Receive(int64_t op, int step, absl::Span<char> bytes, bool add) {
  const auto key = std::make_pair(op, step);
  std::unique_ptr<grpc::ByteBuffer> frame;
  const absl::Time start = absl::Now();
  while (frame == nullptr) {
    // Meanwhile this worker's own send of the step is retried while the
    // next worker is still starting: it may never send to this one before
    // it has heard from it.
    const absl::Time silent_until = absl::Now() + rules_.Timeout(op);
    bool timed_out = false;
    while (frame == nullptr && !timed_out) {
      if (sending_ != nullptr) RetryWhenDue(sending_);
      bool refused = false;  // A Deliver refused for its token, since the last look.
      {
        absl::MutexLock lock(&mu_);
        auto arrived = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return inbox_.count(key) > 0 || !peer_error_.ok() || rules_.refusal_pending();
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
          rules_.Took(op, step);
          break;
        }
        if (!peer_error_.ok()) return peer_error_;
        refused = rules_.TakeRefusal();
      }
      if (refused) {
        if (absl::Status checked = rules_.CheckRefusal("message"); !checked.ok()) {
          absl::MutexLock lock(&mu_);  // Sticky: it cannot deliver anything.
          if (peer_error_.ok()) peer_error_ = std::move(checked);
          return peer_error_;
        }
      }
      timed_out = absl::Now() >= silent_until;
    }
    if (frame != nullptr) break;
    // Silent for a timeout: a previous worker that still answers is busy
    // (the chief evaluating or saving); one that does not is dead or hung.
    RETURN_IF_ERROR(
        rules_.CheckSilent(RingPeerRules::Neighbour::kPrevious, op, step, absl::Now() - start));
  }
  TensorFrameReader reader;
  proto::CollectiveHeader header;
  RETURN_IF_ERROR(reader.Open(*frame, &header));
  RETURN_IF_ERROR(rules_.CheckSize(op, step, reader.size(), bytes.size()));
  uint64_t taken = 0;
  return RingPeerRules::TakeSegment(bytes, add, &taken,
                                    [&](uint64_t offset, absl::Span<char> into) {
                                      reader.ReadAt(offset, into);
                                      return absl::OkStatus();
                                    });
}

}  // namespace psrt
