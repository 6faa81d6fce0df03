#include "worker/store/dataplane_shard_transport.h"

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "dataplane/frame.h"
#include "dataplane/frame_connection.h"
#include "dataplane/hello.h"
#include "glog/logging.h"

namespace psrt {

using dataplane::FrameConnection;
using dataplane::FrameHeader;
using dataplane::FrameKind;
using dataplane::FrameMethod;

namespace {

// How long opening a connection (and its hello) may take in one attempt;
// a ps that is down is retried by ShardCalls, not here.
constexpr absl::Duration kConnectTimeout = absl::Seconds(5);

// An attempt's outcome: `broken` when the connection cannot carry the next
// attempt (it is then dropped), not when the ps answered with an error.
struct Outcome {
  absl::Status status;
  bool broken = false;
};

// A reply frame whose header and metadata have arrived; its data is read
// from the connection.
class DataPlaneReply final : public ShardReply {
 public:
  DataPlaneReply(FrameConnection* connection, const FrameHeader& header, const std::string& meta,
                 absl::Time data_deadline)
      : connection_(connection), header_(header), meta_(meta), deadline_(data_deadline) {}

  absl::Status ParseMeta(google::protobuf::MessageLite* meta) override {
    if (meta->ParseFromString(meta_)) return absl::OkStatus();
    return absl::InternalError(
        absl::StrCat("the reply's metadata is not a ", meta->GetTypeName()));
  }
  uint64_t data_size() const override { return header_.data_size; }
  const ByteSource* in_memory() const override { return nullptr; }
  absl::Status ReadData(absl::Span<char> dst) override {
    return connection_->ReceiveData(dst, deadline_);
  }
  uint64_t wire_bytes() const override {
    return dataplane::kFrameHeaderBytes + meta_.size() + header_.data_size;
  }

 private:
  FrameConnection* const connection_;
  const FrameHeader& header_;
  const std::string& meta_;
  const absl::Time deadline_;
};

}  // namespace

// One shard's connection for one method, and the thread that runs its
// attempts one at a time.
class DataPlaneShardTransport::Link {
 public:
  Link(const DataPlaneShardTransport::Options& options, int k, FrameMethod method)
      : options_(options), k_(k), method_(method), thread_([this] { Loop(); }) {}
  ~Link() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  // Runs an attempt on this link's thread; returns its id for Cancel.
  uint64_t Post(const ShardRequest& request, absl::Time deadline, const OnReply& on_reply,
                Done done) {
    absl::MutexLock lock(&mu_);
    // The last attempt's thread may still be leaving its `done`.
    mu_.Await(absl::Condition(
        +[](Link* link) ABSL_EXCLUSIVE_LOCKS_REQUIRED(link->mu_) { return link->attempt_ == 0; },
        this));
    // A cancelled attempt shut its connection down: the next one opens anew.
    if (cancelled_) connection_.reset();
    cancelled_ = false;
    attempt_ = ++attempts_;
    job_ = [this, &request, deadline, &on_reply, done = std::move(done)] {
      Outcome outcome = Attempt(request, deadline, on_reply);
      if (outcome.broken) Drop();
      {
        absl::MutexLock lock(&mu_);
        attempt_ = 0;
      }
      done(std::move(outcome.status));
    };
    return attempt_;
  }

  // Ends attempt `id` if it still runs: its connection is shut down.
  void Cancel(uint64_t id) {
    absl::MutexLock lock(&mu_);
    if (attempt_ != id) return;
    cancelled_ = true;
    if (connection_ != nullptr) connection_->Shutdown();
  }

 private:
  void Loop() {
    while (true) {
      std::function<void()> job;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](Link* link) ABSL_EXCLUSIVE_LOCKS_REQUIRED(link->mu_) {
              return link->stop_ || static_cast<bool>(link->job_);
            },
            this));
        if (stop_) return;
        job = std::move(job_);
        job_ = nullptr;
      }
      job();
    }
  }

  // The connection, opened with its hello when there is none.
  absl::StatusOr<FrameConnection*> Connection() {
    if (absl::MutexLock lock(&mu_); connection_ != nullptr) return connection_.get();
    ASSIGN_OR_RETURN(const std::vector<std::string> addresses, options_.addresses_of(k_));
    absl::StatusOr<std::unique_ptr<FrameConnection>> opened = dataplane::ConnectWithHello(
        addresses, options_.credential, options_.max_data_bytes, absl::Now() + kConnectTimeout);
    if (!opened.ok()) return opened.status();
    // Once per shard: its push link's first connection.
    if (method_ == FrameMethod::kPush && ++connects_ == 1) {
      LOG(INFO) << options_.shard_name(k_) << ": data plane over " << (*opened)->peer();
    }
    absl::MutexLock lock(&mu_);
    if (cancelled_) (*opened)->Shutdown();
    connection_ = *std::move(opened);
    return connection_.get();
  }

  void Drop() {
    absl::MutexLock lock(&mu_);
    connection_.reset();
  }

  Outcome Attempt(const ShardRequest& request, absl::Time deadline, const OnReply& on_reply) {
    if (absl::MutexLock lock(&mu_); cancelled_) {
      return {absl::CancelledError("cancelled: another shard failed"), false};
    }
    absl::StatusOr<FrameConnection*> connection = Connection();
    if (!connection.ok()) {
      return {connection.status(), !absl::IsUnauthenticated(connection.status())};
    }
    FrameHeader header;
    header.kind = FrameKind::kRequest;
    header.method = method_;
    header.stripe = static_cast<uint32_t>(options_.stripe_of(k_));
    header.request_id = ++request_id_;
    if (absl::Status s = (*connection)->Send(header, request.meta->SerializeAsString(),
                                             request.data, deadline);
        !s.ok()) {
      return {s, true};
    }
    FrameHeader reply;
    std::string meta;
    if (absl::Status s = (*connection)->ReceiveHeader(&reply, &meta, deadline); !s.ok()) {
      return {s, true};
    }
    if (reply.kind != FrameKind::kReply || reply.method != method_ ||
        reply.request_id != header.request_id) {
      return {absl::DataLossError(absl::StrCat("data plane: ", (*connection)->peer(),
                                               " answered out of step (request ", header.request_id,
                                               ", reply ", reply.request_id, ")")),
              true};
    }
    const absl::Time data_deadline = absl::Now() + options_.transfer_timeout;
    if (reply.status != 0) {
      if (absl::Status s = (*connection)->SkipData(reply.data_size, data_deadline); !s.ok()) {
        return {s, true};
      }
      return {absl::Status(static_cast<absl::StatusCode>(reply.status), meta), false};
    }
    DataPlaneReply answer(*connection, reply, meta, data_deadline);
    absl::Status delivered = on_reply(k_, answer);
    // Unread data, or a failed read, leaves the stream out of step.
    return {delivered,
            (*connection)->data_left() > 0 || (*connection)->broken()};
  }

  const DataPlaneShardTransport::Options& options_;
  const int k_;
  const FrameMethod method_;
  uint64_t request_id_ = 0;  // On the link's thread only.
  int connects_ = 0;         // Connections opened; on the link's thread only.
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t attempts_ ABSL_GUARDED_BY(mu_) = 0;  // Posted so far.
  uint64_t attempt_ ABSL_GUARDED_BY(mu_) = 0;   // The one posted or running; 0: none.
  std::function<void()> job_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<FrameConnection> connection_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // Last: it starts once the rest is built.
};

namespace {

class DataPlaneAttempt final : public ShardAttempt {
 public:
  explicit DataPlaneAttempt(std::function<void()> cancel) : cancel_(std::move(cancel)) {}
  void Cancel() override { cancel_(); }

 private:
  const std::function<void()> cancel_;
};

}  // namespace

DataPlaneShardTransport::DataPlaneShardTransport(Options options) : options_(std::move(options)) {
  for (int k = 0; k < options_.num_shards; ++k) {
    push_links_.push_back(std::make_unique<Link>(options_, k, FrameMethod::kPush));
    pull_links_.push_back(std::make_unique<Link>(options_, k, FrameMethod::kPull));
  }
}

DataPlaneShardTransport::~DataPlaneShardTransport() = default;

std::unique_ptr<ShardAttempt> DataPlaneShardTransport::Start(int shard, PsMethod method,
                                                             const ShardRequest& request,
                                                             absl::Time deadline,
                                                             const OnReply& on_reply, Done done) {
  CHECK(Supports(method));
  Link* link = method == PsMethod::kPush ? push_links_[shard].get() : pull_links_[shard].get();
  const uint64_t id = link->Post(request, deadline, on_reply, std::move(done));
  return std::make_unique<DataPlaneAttempt>([link, id] { link->Cancel(id); });
}

uint64_t DataPlaneShardTransport::WireBytes(const ShardRequest& request) const {
  uint64_t bytes = dataplane::kFrameHeaderBytes + request.meta->ByteSizeLong();
  for (const absl::Span<const char>& piece : request.data) bytes += piece.size();
  return bytes;
}

}  // namespace psrt
