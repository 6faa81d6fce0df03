#include "worker/store/collective.h"

#include <algorithm>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/backoff.h"
#include "common/random_id.h"
#include "common/rpc_util.h"
#include "common/status_macros.h"
#include "common/tensor_frame.h"
#include "common/timeline.h"
#include "common/transport_security.h"
#include "glog/logging.h"
#include "grpcpp/client_context.h"
#include "grpcpp/generic/generic_stub.h"
#include "kernels/elementwise.h"
#include "proto/psrt.grpc.pb.h"

namespace psrt {
namespace {

constexpr char kDeliver[] = "/psrt.proto.Collective/Deliver";

// Received segments are added in blocks of this many floats (64 KiB), read
// from gRPC's buffers into a cache-resident scratch.
constexpr size_t kBlockFloats = 16 * 1024;

// Segment i of W of n elements: [i n / W, (i + 1) n / W).
template <class T>
absl::Span<T> Segment(absl::Span<T> data, int i, int w) {
  const size_t begin = data.size() * i / w;
  const size_t end = data.size() * (i + 1) / w;
  return data.subspan(begin, end - begin);
}

int Mod(int a, int w) { return ((a % w) + w) % w; }

}  // namespace

class Collective::Service final
    : public proto::Collective::WithRawCallbackMethod_Deliver<proto::Collective::Service> {
 public:
  explicit Service(Collective* collective) : collective_(collective) {}
  grpc::ServerUnaryReactor* Deliver(grpc::CallbackServerContext* context,
                                    const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override {
    absl::Status status = collective_->Deliver(*request);
    if (status.ok()) *response = SerializeToByteBuffer(proto::CollectiveAck());
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }

 private:
  Collective* const collective_;
};

struct Collective::Channel {
  std::unique_ptr<grpc::GenericStub> stub;
};

// One message to the next worker, and its attempts.
struct Collective::Call {
  grpc::ByteBuffer request;
  absl::Notification released;  // gRPC dropped the segment's memory.
  absl::Time give_up;
  // The attempt in flight.
  std::unique_ptr<grpc::ClientContext> context;
  grpc::ByteBuffer response;
  std::unique_ptr<absl::Notification> done;
  grpc::Status status;
};

Collective::Collective(Options options)
    : options_(std::move(options)),
      incarnation_(NewIncarnation()),
      service_(std::make_unique<Service>(this)),
      next_(std::make_unique<Channel>()) {
  CHECK(!options_.addresses.empty());
  CHECK(options_.rank >= 0 && options_.rank < size());
  const TransportSecurity plaintext;
  const TransportSecurity& security = options_.security ? *options_.security : plaintext;
  auto stub = [&](int rank) {
    const std::string& address = options_.addresses[Mod(rank, size())];
    return std::make_unique<grpc::GenericStub>(NewPsChannel(
        options_.unix_socket && !security.tls() ? PreferLocalSocket(address) : address,
        security));
  };
  next_->stub = stub(options_.rank + 1);
  previous_ = std::make_unique<Channel>();
  previous_->stub = stub(options_.rank - 1);
}

Collective::~Collective() = default;

grpc::Service* Collective::service() { return service_.get(); }

std::string Collective::PeerName(int rank) const {
  return absl::StrCat("worker/", rank, " (", options_.addresses[rank], ")");
}

absl::Duration Collective::Timeout(int64_t op) const {
  return op <= 1 ? std::max(options_.timeout, options_.startup_timeout) : options_.timeout;
}

absl::Status Collective::Fail(absl::Status status) {
  if (failed_.ok()) failed_ = status;
  return failed_;
}

absl::Status Collective::Deliver(const grpc::ByteBuffer& frame) {
  TensorFrameReader reader;
  proto::CollectiveHeader header;
  RETURN_IF_ERROR(reader.Open(frame, &header));
  const int previous = Mod(options_.rank - 1, size());
  // Op 0 is the next worker asking whether this process still answers.
  if (header.op() == 0 && header.sender() == Mod(options_.rank + 1, size())) {
    return absl::OkStatus();
  }
  if (header.sender() != previous) {
    return absl::InvalidArgumentError(absl::StrCat(
        "allreduce: worker/", options_.rank, " takes messages from worker/", previous,
        " only, not from worker/", header.sender(), " (do all workers have the same "
        "cluster spec?)"));
  }
  absl::MutexLock lock(&mu_);
  if (previous_incarnation_ == 0) {
    // The previous worker's process is the one that joins with this one
    // (op 1, which reaches every worker). Messages of later ops come from a
    // process that ran before this one started (a job restarting after a
    // fault): refused, so that it stops too.
    if (header.op() != 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "allreduce: ", PeerName(options_.rank), " restarted and takes no message of an "
          "earlier run (op ", header.op(), "): every worker must restart"));
    }
    previous_incarnation_ = header.incarnation();
  }
  if (header.incarnation() != previous_incarnation_) {
    const absl::Status restarted = absl::AbortedError(absl::StrCat(
        "allreduce: ", PeerName(previous), " restarted (its process changed during the "
        "job); every worker must restart and resume from the last checkpoint"));
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

std::unique_ptr<Collective::Call> Collective::StartSend(int64_t op, int step,
                                                        absl::Span<const char> bytes) {
  auto call = std::make_unique<Call>();
  proto::CollectiveHeader header;
  header.set_op(op);
  header.set_step(step);
  header.set_sender(options_.rank);
  header.set_incarnation(incarnation_);
  Call* raw = call.get();
  call->request = EncodeTensorFrame(
      header, {bytes},
      [raw] { raw->released.Notify(); });
  call->give_up = absl::Now() + Timeout(op);
  StartAttempt(raw);
  return call;
}

void Collective::StartAttempt(Call* call) {
  call->context = std::make_unique<grpc::ClientContext>();
  call->context->set_deadline(absl::ToChronoTime(call->give_up));
  call->done = std::make_unique<absl::Notification>();
  next_->stub->UnaryCall(call->context.get(), kDeliver, grpc::StubOptions(), &call->request,
                         &call->response, [this, call](grpc::Status status) {
                           if (!status.ok() && status.error_code() != grpc::StatusCode::UNAVAILABLE) {
                             // Not retried: the receiving side need not wait
                             // for its peer any longer.
                             absl::MutexLock lock(&mu_);
                             if (peer_error_.ok()) peer_error_ = SendError(status);
                           }
                           call->status = std::move(status);
                           call->done->Notify();
                         });
}

absl::Status Collective::SendError(const grpc::Status& status) const {
  const int next = Mod(options_.rank + 1, size());
  return absl::Status(
      static_cast<absl::StatusCode>(status.error_code()),
      absl::StrCat("allreduce: sending to ", PeerName(next), " failed: ",
                   status.error_message(),
                   status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                           status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
                       ? " (it is down, hung or unreachable)"
                       : ""));
}

absl::Status Collective::Ping(absl::Duration deadline) {
  proto::CollectiveHeader header;  // Op 0.
  header.set_sender(options_.rank);
  header.set_incarnation(incarnation_);
  grpc::ByteBuffer request = EncodeTensorFrame(header, {});
  grpc::ByteBuffer response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  absl::Notification done;
  grpc::Status status;
  previous_->stub->UnaryCall(&context, kDeliver, grpc::StubOptions(), &request, &response,
                             [&](grpc::Status s) {
                               status = std::move(s);
                               done.Notify();
                             });
  done.WaitForNotification();
  return FromGrpcStatus(status);
}

absl::Status Collective::FinishSend(std::unique_ptr<Call> call) {
  Backoff backoff(absl::Milliseconds(50), absl::Seconds(1));
  while (true) {
    call->done->WaitForNotification();
    if (call->status.error_code() != grpc::StatusCode::UNAVAILABLE ||
        absl::Now() + backoff.Peek() >= call->give_up) {
      break;
    }
    absl::SleepFor(backoff.Next());  // The next worker may still be starting.
    StartAttempt(call.get());
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
    next_->stub.reset();
    if (!call->released.WaitForNotificationWithTimeout(absl::Seconds(5))) {
      LOG(WARNING) << "allreduce: gRPC still holds a failed message; not waiting for it";
      call.release();  // Deliberately leaked: the callback still names it.
    }
  }
  return Fail(SendError(status));
}

absl::Status Collective::Receive(int64_t op, int step, absl::Span<char> bytes, bool add) {
  const int previous = Mod(options_.rank - 1, size());
  const auto key = std::make_pair(op, step);
  std::unique_ptr<grpc::ByteBuffer> frame;
  const absl::Time start = absl::Now();
  while (frame == nullptr) {
    {
      absl::MutexLock lock(&mu_);
      auto arrived = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return inbox_.count(key) > 0 || !peer_error_.ok();
      };
      mu_.AwaitWithTimeout(absl::Condition(&arrived), Timeout(op));
      auto it = inbox_.find(key);
      if (it != inbox_.end()) {
        frame = std::move(it->second);
        inbox_.erase(it);
        last_taken_ = key;
        break;
      }
      if (!peer_error_.ok()) return Fail(peer_error_);
    }
    // Silent for a timeout: a previous worker that still answers is busy
    // (the chief evaluating or saving), and is waited for up to
    // busy_timeout; one that does not answer is dead or hung.
    const absl::Duration silent = absl::Now() - start;
    const absl::Status alive = Ping(std::min(options_.timeout, absl::Seconds(30)));
    if (!alive.ok() || silent >= options_.busy_timeout) {
      return Fail(absl::DeadlineExceededError(absl::StrCat(
          "allreduce: nothing from ", PeerName(previous), " for ",
          absl::FormatDuration(absl::Trunc(silent, absl::Seconds(1))), " (op ", op,
          ", step ", step, "): ",
          alive.ok() ? "it answers but sends nothing (--allreduce_busy_timeout_secs)"
                     : absl::StrCat("it died, hung or cannot reach this worker (",
                                    alive.message(), ")"))));
    }
    LOG(INFO) << "allreduce: " << PeerName(previous) << " is alive but has sent nothing for "
              << absl::Trunc(silent, absl::Seconds(1))
              << "; waiting (it may be evaluating or saving)";
  }
  TensorFrameReader reader;
  proto::CollectiveHeader header;
  RETURN_IF_ERROR(Fail(reader.Open(*frame, &header)));
  if (reader.size() != bytes.size()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "allreduce: ", PeerName(previous), " sent ", reader.size(), " bytes for step ", step,
        " of op ", op, ", this worker expected ", bytes.size(),
        " (do all workers train the same model?)")));
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
    reader.ReadAt(begin * sizeof(float), {reinterpret_cast<char*>(block.data()), n * sizeof(float)});
    kernels::Accumulate({block.data(), n}, segment.subspan(begin, n));
  }
  return absl::OkStatus();
}

namespace {
absl::Span<char> AsBytes(absl::Span<float> floats) {
  return {reinterpret_cast<char*>(floats.data()), floats.size() * sizeof(float)};
}
}  // namespace

absl::Status Collective::Join() {
  if (op_ > 0) return failed_;
  float one = 1;
  return Reduce(absl::MakeSpan(&one, 1));
}

absl::Status Collective::AllreduceSum(absl::Span<float> data) {
  RETURN_IF_ERROR(Join());
  return Reduce(data);
}

absl::Status Collective::Reduce(absl::Span<float> data) {
  RETURN_IF_ERROR(failed_);
  const int w = size();
  const int r = options_.rank;
  if (w == 1) return absl::OkStatus();
  const int64_t op = ++op_;
  // Reduce-scatter: afterwards this worker holds the sum of segment r + 1;
  // then all-gather passes the reduced segments around.
  absl::Time phase_start = absl::Now();
  for (int s = 0; s < 2 * (w - 1); ++s) {
    const bool reducing = s < w - 1;
    if (s == w - 1 && options_.timeline != nullptr) {
      options_.timeline->Record("reduce_scatter", "allreduce", phase_start, absl::Now(), op);
      phase_start = absl::Now();
    }
    const int send = reducing ? r - s : r + 1 - (s - (w - 1));
    std::unique_ptr<Call> sending = StartSend(op, s, AsBytes(Segment(data, Mod(send, w), w)));
    absl::Status received =
        Receive(op, s, AsBytes(Segment(data, Mod(send - 1, w), w)), /*add=*/reducing);
    absl::Status sent = FinishSend(std::move(sending));
    RETURN_IF_ERROR(received);
    RETURN_IF_ERROR(sent);
  }
  if (options_.timeline != nullptr) {
    options_.timeline->Record("all_gather", "allreduce", phase_start, absl::Now(), op);
  }
  return absl::OkStatus();
}

absl::Status Collective::Broadcast(absl::Span<char> data, int root) {
  RETURN_IF_ERROR(Join());
  CHECK(root >= 0 && root < size());
  const int64_t op = ++op_;
  if (size() == 1) return absl::OkStatus();
  if (options_.rank != root) RETURN_IF_ERROR(Receive(op, 0, data, /*add=*/false));
  if (Mod(options_.rank + 1, size()) == root) return absl::OkStatus();
  return FinishSend(StartSend(op, 0, data));
}

}  // namespace psrt
