#include "worker/store/dataplane_shards.h"

#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/backoff.h"
#include "common/status_macros.h"
#include "dataplane/hello.h"
#include "glog/logging.h"

namespace psrt {

using dataplane::FrameConnection;
using dataplane::FrameHeader;
using dataplane::FrameKind;
using dataplane::FrameMethod;

namespace {

// How long opening a connection (and its hello) may take in one attempt;
// a ps that is down is retried by the caller's loop, not here.
constexpr absl::Duration kConnectTimeout = absl::Seconds(5);

// An attempt's outcome: `transport` when the connection failed (it is then
// dropped), not when the ps answered with an error.
struct Outcome {
  absl::Status status;
  bool transport = false;
};

}  // namespace

// One shard's connection for one method, and the thread that runs its calls
// one at a time.
class DataPlaneShards::Link {
 public:
  Link(const DataPlaneShards::Options& options, int k, FrameMethod method)
      : options_(options), k_(k), method_(method), thread_([this] { Loop(); }) {}
  ~Link() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  // Runs `job` on this link's thread; `done` gets its status there.
  void Run(std::function<absl::Status()> job, std::function<void(absl::Status)> done) {
    absl::MutexLock lock(&mu_);
    // The last call's thread may still be leaving its `done`.
    mu_.Await(absl::Condition(
        +[](Link* link)
             ABSL_EXCLUSIVE_LOCKS_REQUIRED(link->mu_) { return !link->busy_ && !link->job_; },
        this));
    // A cancelled call shut its connection down: the next one opens anew.
    if (cancelled_) connection_.reset();
    cancelled_ = false;
    job_ = [job = std::move(job), done = std::move(done)] { done(job()); };
  }

  // Ends the running call: its connection is shut down, its retries stop.
  void Cancel() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (connection_ != nullptr) connection_->Shutdown();
  }

  // The call, with retries (see the header comment).
  absl::Status Call(absl::Duration timeout, bool retry_deadline, const Request& request,
                    const std::function<absl::Status(int, FrameConnection*, const FrameHeader&,
                                                     const std::string&)>& on_reply) {
    absl::Time give_up = absl::InfiniteFuture();
    Backoff backoff(absl::Milliseconds(100), absl::Seconds(2));
    while (true) {
      Outcome outcome = Attempt(timeout, request, on_reply);
      if (outcome.status.ok()) return outcome.status;
      if (outcome.transport) Drop();
      const bool retryable = absl::IsUnavailable(outcome.status) ||
                             (retry_deadline && absl::IsDeadlineExceeded(outcome.status));
      if (!retryable || cancelled()) return outcome.status;
      if (give_up == absl::InfiniteFuture()) {
        give_up = absl::Now() + options_.retry_timeout;
        LOG(WARNING) << options_.shard_name(k_) << ": " << outcome.status.message()
                     << "; retrying for up to " << options_.retry_timeout;
      }
      if (absl::Now() + backoff.Peek() >= give_up) {
        return absl::Status(
            outcome.status.code(),
            absl::StrCat(outcome.status.message(), " (still failing after ",
                         absl::FormatDuration(options_.retry_timeout), " of retries)"));
      }
      // The backoff, cut short by Cancel.
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&cancelled_), backoff.Next());
    }
  }

 private:
  bool cancelled() {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }

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
        busy_ = true;
      }
      job();
      absl::MutexLock lock(&mu_);
      busy_ = false;
    }
  }

  // The connection, opened with its hello when there is none.
  absl::StatusOr<FrameConnection*> Connection() {
    if (absl::MutexLock lock(&mu_); connection_ != nullptr) return connection_.get();
    ASSIGN_OR_RETURN(const std::string address, options_.address_of(k_));
    const absl::Time deadline = absl::Now() + kConnectTimeout;
    absl::StatusOr<std::unique_ptr<FrameConnection>> opened = dataplane::ConnectWithHello(
        address, options_.credential, options_.max_data_bytes, deadline);
    if (!opened.ok()) return opened.status();
    // Once per shard: its push link's first connection.
    if (method_ == FrameMethod::kPush && ++connects_ == 1) {
      LOG(INFO) << options_.shard_name(k_) << ": data plane over " << address;
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

  Outcome Attempt(absl::Duration timeout, const Request& request,
                  const std::function<absl::Status(int, FrameConnection*, const FrameHeader&,
                                                   const std::string&)>& on_reply) {
    if (cancelled()) return {absl::CancelledError("cancelled: another shard failed"), false};
    absl::StatusOr<FrameConnection*> connection = Connection();
    if (!connection.ok()) {
      return {connection.status(), !absl::IsUnauthenticated(connection.status())};
    }
    const absl::Time deadline = absl::Now() + timeout;
    FrameHeader header;
    header.kind = FrameKind::kRequest;
    header.method = method_;
    header.stripe = static_cast<uint32_t>(options_.stripe_of(k_));
    header.request_id = ++request_id_;
    if (absl::Status s = (*connection)->Send(header, request.meta, request.data, deadline);
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
    if (reply.status != 0) {
      if (absl::Status s = (*connection)->SkipData(reply.data_size, deadline); !s.ok()) {
        return {s, true};
      }
      return {absl::Status(static_cast<absl::StatusCode>(reply.status), meta), false};
    }
    absl::Status delivered = on_reply(k_, *connection, reply, meta);
    // Unread data, or a failed read, leaves the stream out of step: the
    // connection goes.
    return {delivered,
            !delivered.ok() && ((*connection)->data_left() > 0 || (*connection)->broken())};
  }

  const DataPlaneShards::Options& options_;
  const int k_;
  const FrameMethod method_;
  uint64_t request_id_ = 0;  // On the link's thread only.
  int connects_ = 0;         // Connections opened; on the link's thread only.
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // A job runs.
  std::function<void()> job_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<FrameConnection> connection_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // Last: it starts once the rest is built.
};

DataPlaneShards::DataPlaneShards(Options options) : options_(std::move(options)) {
  for (int k = 0; k < options_.num_shards; ++k) {
    push_links_.push_back(std::make_unique<Link>(options_, k, FrameMethod::kPush));
    pull_links_.push_back(std::make_unique<Link>(options_, k, FrameMethod::kPull));
  }
}

DataPlaneShards::~DataPlaneShards() = default;

DataPlaneShards::Link& DataPlaneShards::LinkOf(FrameMethod method, int k) {
  return method == FrameMethod::kPush ? *push_links_[k] : *pull_links_[k];
}

absl::Status DataPlaneShards::CallAll(
    FrameMethod method, absl::Duration timeout, bool retry_deadline, std::vector<Request>& requests,
    const std::function<absl::Status(int, FrameConnection*, const FrameHeader&,
                                     const std::string&)>& on_reply,
    const std::vector<int>* order, const std::function<absl::Status(int)>& prepare) {
  const int n = options_.num_shards;
  CHECK_EQ(static_cast<int>(requests.size()), n);
  absl::Mutex mu;
  std::vector<std::optional<absl::Status>> finished(n);  // Guarded by mu.
  std::vector<bool> started(n, false);
  absl::Status error;
  for (int i = 0; i < n && error.ok(); ++i) {
    const int k = order != nullptr ? (*order)[i] : i;
    if (prepare) error = prepare(k);
    if (!error.ok()) break;
    started[k] = true;
    LinkOf(method, k).Run(
        [this, method, k, timeout, retry_deadline, &requests, &on_reply] {
          return LinkOf(method, k).Call(timeout, retry_deadline, requests[k], on_reply);
        },
        [&mu, &finished, k](absl::Status status) {
          absl::MutexLock lock(&mu);
          finished[k] = std::move(status);
        });
  }
  // Every started call ends before the caller's memory may change.
  absl::MutexLock lock(&mu);
  std::vector<bool> seen(n, false);
  // Some call has ended that this loop has not seen.
  auto news = [&finished, &seen]() {
    for (size_t k = 0; k < finished.size(); ++k) {
      if (finished[k].has_value() && !seen[k]) return true;
    }
    return false;
  };
  while (true) {
    bool all = true;
    for (int k = 0; k < n; ++k) {
      if (!started[k] || seen[k]) continue;
      if (!finished[k].has_value()) {
        all = false;
        continue;
      }
      seen[k] = true;
      const absl::Status& status = *finished[k];
      if (status.ok()) continue;
      if (error.ok() || (absl::IsCancelled(error) && !absl::IsCancelled(status))) {
        error = absl::Status(status.code(),
                             absl::StrCat(options_.shard_name(k), ": ", status.message(),
                                          absl::IsResourceExhausted(status)
                                              ? " (a limit of the ps: psrt_ps --max_message_mb or "
                                                "--max_waiting_pulls)"
                                              : ""));
      }
      for (int j = 0; j < n; ++j) {
        if (started[j] && !finished[j].has_value()) LinkOf(method, j).Cancel();
      }
    }
    if (all) break;
    mu.Await(absl::Condition(&news));
  }
  return error;
}

}  // namespace psrt
