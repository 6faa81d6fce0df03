#include "worker/store/shard_calls.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/backoff.h"
#include "glog/logging.h"

namespace psrt {
namespace {

absl::Status IgnoreReply(int, ShardReply&) { return absl::OkStatus(); }

}  // namespace

ShardCalls::ShardCalls(int num_shards, std::function<std::string(int)> shard_name,
                       absl::Duration retry_timeout, int copies)
    : num_shards_(num_shards),
      shard_name_(std::move(shard_name)),
      retry_timeout_(retry_timeout),
      copies_(copies),
      routes_(std::make_unique<std::atomic<int>[]>(num_shards)) {
  CHECK(copies == 1 || copies == 2) << copies;
  for (int k = 0; k < num_shards; ++k) routes_[k].store(0);
}

void ShardCalls::SwitchCopy(int shard) const {
  if (copies_ > 1) routes_[shard].fetch_xor(1, std::memory_order_relaxed);
}

absl::Status ShardCalls::NameError(int k, const absl::Status& status, bool gave_up) const {
  return absl::Status(
      status.code(),
      absl::StrCat(shard_name_(k), ": ", status.message(),
                   gave_up ? absl::StrCat(" (still failing after ",
                                          absl::FormatDuration(retry_timeout_), " of retries)")
                           : "",
                   // A refusal for size or load names no limit by itself.
                   absl::IsResourceExhausted(status)
                       ? " (a limit of the ps: psrt_ps --max_message_mb, --max_waiting_pulls, "
                         "or --max_grpc_memory_mb for gRPC)"
                       : ""));
}

absl::Status ShardCalls::CallAll(ShardTransport& transport, PsMethod method,
                                 absl::Duration timeout, std::vector<ShardRequest>& requests,
                                 const ShardTransport::OnReply& on_reply,
                                 const CallOptions& options) const {
  const int n = num_shards_;
  CHECK_EQ(requests.size(), static_cast<size_t>(n));
  CHECK(transport.Supports(method));
  const ShardTransport::OnReply& given = on_reply ? on_reply : IgnoreReply;
  // The transport names the endpoint; the caller's callback, the shard.
  const ShardTransport::OnReply reply_to = [&given, n](int endpoint, ShardReply& reply) {
    return given(endpoint % n, reply);
  };
  const auto retryable = [&options](const absl::Status& status) {
    return (options.retry_on != RetryOn::kNothing && absl::IsUnavailable(status)) ||
           (options.retry_on == RetryOn::kUnavailableOrDeadline &&
            absl::IsDeadlineExceeded(status));
  };

  absl::Mutex mu;
  std::vector<std::optional<absl::Status>> finished(n);  // Guarded by mu.
  int in_flight = 0;                                      // Guarded by mu.
  // Every attempt lives until CallAll returns (after its `done`); running[k]
  // is shard k's while its end has not been seen by the loop below.
  std::vector<std::unique_ptr<ShardAttempt>> attempts;
  std::vector<ShardAttempt*> running(n, nullptr);
  auto start = [&](int k) {  // REQUIRES: mu not held.
    {
      absl::MutexLock lock(&mu);
      ++in_flight;
    }
    attempts.push_back(transport.Start(endpoint(k), method, requests[k], absl::Now() + timeout,
                                       reply_to,
                                       [&mu, &finished, &in_flight, k](absl::Status status) {
                                         absl::MutexLock lock(&mu);
                                         finished[k] = std::move(status);
                                         --in_flight;
                                       }));
    running[k] = attempts.back().get();
  };

  // Per shard: retried until give_up (from its first failure), next at retry_at.
  std::vector<absl::Time> give_up(n, absl::InfiniteFuture());
  std::vector<absl::Time> retry_at(n, absl::InfiniteFuture());
  std::vector<Backoff> backoff(n, Backoff(absl::Milliseconds(100), absl::Seconds(2)));
  std::vector<bool> done(n, false);
  absl::Status error;
  for (int i = 0; i < n; ++i) {
    const int k = options.order != nullptr ? (*options.order)[i] : i;
    absl::Status prepared = options.prepare ? options.prepare(k) : absl::OkStatus();
    if (!prepared.ok()) {
      error = std::move(prepared);
      for (int j = i; j < n; ++j) done[options.order != nullptr ? (*options.order)[j] : j] = true;
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
        if (give_up[k] == absl::InfiniteFuture()) {
          give_up[k] = absl::Now() + retry_timeout_;
          LOG(WARNING) << shard_name_(k) << ": " << status.message() << "; retrying for up to "
                       << retry_timeout_;
        }
        retry_at[k] = absl::Now() + backoff[k].Next();
        SwitchCopy(k);  // A replicated shard's primary may be the other copy now.
      } else {
        done[k] = true;
        if (error.ok() || (absl::IsCancelled(error) && !absl::IsCancelled(status))) {
          error = NameError(k, status, retryable(status));
        }
        // Nothing else matters now: stop the other shards' calls.
        for (int j = 0; j < n && !options.independent; ++j) {
          if (running[j] != nullptr) running[j]->Cancel();
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
        mu.Unlock();
        absl::Status ready = options.before_retry ? options.before_retry(k) : absl::OkStatus();
        if (ready.ok()) start(k);
        mu.Lock();
        if (!ready.ok()) finished[k] = std::move(ready);  // Taken as the attempt's failure.
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
  attempts.clear();  // Once gRPC has let go of the requests' memory.
  return error;
}

absl::Status ShardCalls::CallOne(ShardTransport& transport, int endpoint, PsMethod method,
                                 absl::Duration timeout, const ShardRequest& request,
                                 const ShardTransport::OnReply& on_reply) const {
  CHECK(transport.Supports(method));
  const ShardTransport::OnReply reply_to = on_reply ? on_reply : IgnoreReply;
  absl::Notification ended;
  absl::Status result;
  std::unique_ptr<ShardAttempt> attempt =
      transport.Start(endpoint, method, request, absl::Now() + timeout, reply_to,
                      [&](absl::Status status) {
                        result = std::move(status);
                        ended.Notify();
                      });
  ended.WaitForNotification();
  return result;
}

}  // namespace psrt
