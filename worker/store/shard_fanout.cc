#include "worker/store/shard_fanout.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/backoff.h"
#include "common/rpc_util.h"
#include "glog/logging.h"
#include "grpcpp/client_context.h"

namespace psrt {

ShardFanout::ShardFanout(std::function<std::string(int)> shard_name,
                         absl::Duration retry_timeout)
    : shard_name_(std::move(shard_name)), retry_timeout_(retry_timeout) {}

void ShardFanout::AddShard(std::shared_ptr<grpc::Channel> channel, int stripe) {
  stubs_.push_back(std::make_unique<grpc::GenericStub>(std::move(channel)));
  stripes_.push_back(std::to_string(stripe));
}

void ShardFanout::Prepare(int k, grpc::ClientContext* context) const {
  context->AddMetadata(kStripeMetadata, stripes_[k]);
}

absl::Status ShardFanout::CallAll(
    const std::string& method, absl::Duration timeout, RetryOn retry_on,
    std::vector<grpc::ByteBuffer>& requests,
    const std::function<absl::Status(int, const grpc::ByteBuffer&)>& on_response,
    bool independent, const std::vector<int>* order,
    const std::function<absl::Status(int)>& prepare) {
  const int n = num_shards();
  CHECK_EQ(requests.size(), static_cast<size_t>(n));
  struct Attempt {
    grpc::ClientContext context;
    grpc::ByteBuffer response;
  };
  // Every attempt stays alive until the last callback has run.
  std::vector<std::unique_ptr<Attempt>> attempts;
  std::vector<Attempt*> running(n, nullptr);
  absl::Mutex mu;
  std::vector<std::optional<absl::Status>> finished(n);  // Guarded by mu.
  int in_flight = 0;                                      // Guarded by mu.

  auto start = [&](int k) {  // REQUIRES: mu not held; in_flight counted.
    attempts.push_back(std::make_unique<Attempt>());
    Attempt* attempt = attempts.back().get();
    attempt->context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    Prepare(k, &attempt->context);
    running[k] = attempt;
    stubs_[k]->UnaryCall(&attempt->context, method, grpc::StubOptions(), &requests[k],
                         &attempt->response, [&, k, attempt](grpc::Status status) {
                           absl::Status result =
                               !status.ok()   ? FromGrpcStatus(status)
                               : on_response ? on_response(k, attempt->response)
                                             : absl::OkStatus();
                           absl::MutexLock lock(&mu);
                           finished[k] = std::move(result);
                           --in_flight;
                         });
  };
  auto retryable = [retry_on](const absl::Status& status) {
    return (retry_on != RetryOn::kNothing && absl::IsUnavailable(status)) ||
           (retry_on == RetryOn::kUnavailableOrDeadline && absl::IsDeadlineExceeded(status));
  };

  // Each shard may be retried for retry_timeout_ from its first failure.
  std::vector<absl::Time> give_up(n, absl::InfiniteFuture());
  std::vector<absl::Time> retry_at(n, absl::InfiniteFuture());
  std::vector<Backoff> backoff(n, Backoff(absl::Milliseconds(100), absl::Seconds(2)));
  std::vector<bool> done(n, false);
  absl::Status error;
  {
    absl::MutexLock lock(&mu);
    in_flight = n;
  }
  for (int i = 0; i < n; ++i) {
    const int k = order != nullptr ? (*order)[i] : i;
    absl::Status prepared = prepare ? prepare(k) : absl::OkStatus();
    if (!prepared.ok()) {
      absl::MutexLock lock(&mu);
      error = std::move(prepared);
      for (int j = i; j < n; ++j) done[order != nullptr ? (*order)[j] : j] = true;
      in_flight -= n - i;
      break;
    }
    start(k);
  }

  mu.Lock();
  while (true) {
    for (int k = 0; k < n; ++k) {
      if (!finished[k].has_value()) continue;
      absl::Status status = *std::move(finished[k]);
      finished[k].reset();
      running[k] = nullptr;
      if (status.ok()) {
        done[k] = true;
      } else if (error.ok() && retryable(status) &&
                 (give_up[k] == absl::InfiniteFuture() || absl::Now() < give_up[k])) {
        if (give_up[k] == absl::InfiniteFuture()) give_up[k] = absl::Now() + retry_timeout_;
        if (backoff[k].retries() == 0) {  // The first retry.
          LOG(WARNING) << shard_name_(k) << ": " << status.message()
                       << "; retrying for up to " << retry_timeout_;
        }
        retry_at[k] = absl::Now() + backoff[k].Next();
      } else {
        done[k] = true;
        if (error.ok() || (absl::IsCancelled(error) && !absl::IsCancelled(status))) {
          const bool gave_up = retryable(status);
          error = absl::Status(
              status.code(),
              absl::StrCat(shard_name_(k), ": ", status.message(),
                           gave_up ? absl::StrCat(" (still failing after ",
                                                  absl::FormatDuration(retry_timeout_),
                                                  " of retries)")
                                   : "",
                           // gRPC's own refusals name no limit.
                           absl::IsResourceExhausted(status)
                               ? " (a limit of the ps: psrt_ps --max_message_mb, "
                                 "--max_grpc_memory_mb or --max_waiting_pulls)"
                               : ""));
        }
        // Nothing else matters now: stop the other shards' calls.
        for (int j = 0; j < n && !independent; ++j) {
          if (running[j] != nullptr) running[j]->context.TryCancel();
          if (retry_at[j] != absl::InfiniteFuture()) {
            retry_at[j] = absl::InfiniteFuture();
            done[j] = true;
          }
        }
      }
    }
    if (in_flight == 0 && std::all_of(done.begin(), done.end(), [](bool d) { return d; })) {
      break;
    }
    const absl::Time now = absl::Now();
    absl::Time next_retry = absl::InfiniteFuture();
    for (int k = 0; k < n; ++k) {
      if (retry_at[k] <= now) {
        retry_at[k] = absl::InfiniteFuture();
        ++in_flight;
        mu.Unlock();
        start(k);
        mu.Lock();
      }
      next_retry = std::min(next_retry, retry_at[k]);
    }
    mu.AwaitWithDeadline(absl::Condition(
                             +[](std::vector<std::optional<absl::Status>>* f) {
                               return std::any_of(f->begin(), f->end(),
                                                  [](const auto& s) { return s.has_value(); });
                             },
                             &finished),
                         next_retry);
  }
  mu.Unlock();
  return error;
}

grpc::Status ShardFanout::CallOne(int k, const std::string& method, absl::Duration timeout,
                                  const grpc::ByteBuffer& request,
                                  grpc::ByteBuffer* response) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  context.set_wait_for_ready(false);
  Prepare(k, &context);
  absl::Notification done;
  grpc::Status status;
  stubs_[k]->UnaryCall(&context, method, grpc::StubOptions(), &request, response,
                       [&](grpc::Status s) {
                         status = std::move(s);
                         done.Notify();
                       });
  done.WaitForNotification();
  return status;
}

}  // namespace psrt
