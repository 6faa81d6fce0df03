// ShardCalls: runs one method on every ps shard in parallel over a
// ShardTransport (shard_transport.h), the one loop under the ps client
// (ps_client.h), whatever the transport.
//
// CallAll starts each shard's attempt (in shard order or in `order`, each
// right after `prepare(k)`, which may block) and returns once every shard
// has answered. A shard whose attempt fails in a way `retry_on` allows is
// tried again, alone, after a backoff of 100 ms doubling to 2 s, for up to
// retry_timeout from its first failure, while the other shards' calls go
// on. The first other error cancels the attempts still running and the
// retries still due (unless the call is `independent`: each shard's call
// then runs to its end, as a goodbye that must reach every shard does), and
// is returned, prefixed with the shard's name. When CallAll returns, no
// attempt reads the requests' memory any more.
//
// Replicated shards (psrt_ps --ps_replicas=1): shard k then has two copies,
// the transport's endpoints k (on the shard's own ps task) and k + n (the
// backup, on the next one), and CallAll sends shard k's attempts to the one
// it routes k to (endpoint(k)). A retryable failure routes k to the other
// copy for the retry, so a call follows the primary wherever it is: a dead
// primary fails, and its backup takes over when asked; a backup whose
// primary is alive answers Unavailable, and the call goes back.
//
// Thread safety: the routes are atomic; CallAll and CallOne may run on
// several threads at once.
#ifndef PSRT_WORKER_STORE_SHARD_CALLS_H_
#define PSRT_WORKER_STORE_SHARD_CALLS_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/store/shard_transport.h"

namespace psrt {

// Which failures CallAll retries, with backoff, until the retry timeout.
enum class RetryOn {
  kNothing,
  kUnavailable,            // Safe when the call may be repeated.
  kUnavailableOrDeadline,  // Pushes: a repeated one is deduplicated.
};

class ShardCalls {
 public:
  struct CallOptions {
    RetryOn retry_on = RetryOn::kUnavailable;
    bool independent = false;
    // The order in which the shards are prepared and started; null: 0..n-1.
    const std::vector<int>* order = nullptr;
    // Fills requests[k] just before shard k's first attempt; null: they are
    // filled already. Its error is the call's: neither that shard nor any
    // after it is started (those started run to their ends).
    std::function<absl::Status(int)> prepare;
    // Runs before each retry of shard k (not its first attempt); its error
    // counts as the attempt's. Null: none.
    std::function<absl::Status(int)> before_retry;
  };

  // `shard_name(k)` names shard k in errors and logs.
  // `copies`: 1, or 2 for replicated shards.
  ShardCalls(int num_shards, std::function<std::string(int)> shard_name,
             absl::Duration retry_timeout, int copies = 1);

  int num_shards() const { return num_shards_; }
  // The transport endpoint shard k's calls go to now (k, or k + n).
  int endpoint(int shard) const {
    return shard + routes_[shard].load(std::memory_order_relaxed) * num_shards_;
  }
  // Routes shard k to its other copy (nothing with one copy).
  void SwitchCopy(int shard) const;

  // See the header comment. Each attempt may take `timeout`. `on_reply`
  // (null: the replies are ignored) runs on the transport's threads.
  // REQUIRES: requests.size() == num_shards(); transport.Supports(method).
  absl::Status CallAll(ShardTransport& transport, PsMethod method, absl::Duration timeout,
                       std::vector<ShardRequest>& requests,
                       const ShardTransport::OnReply& on_reply, const CallOptions& options) const;

  // One attempt to transport endpoint `endpoint` (see endpoint()), not
  // retried; its error is not prefixed.
  absl::Status CallOne(ShardTransport& transport, int endpoint, PsMethod method,
                       absl::Duration timeout, const ShardRequest& request,
                       const ShardTransport::OnReply& on_reply) const;

 private:
  // The error CallAll returns for shard k's `status`.
  absl::Status NameError(int k, const absl::Status& status, bool gave_up) const;

  const int num_shards_;
  const std::function<std::string(int)> shard_name_;
  const absl::Duration retry_timeout_;
  const int copies_;
  // Per shard: 0 (its own task's copy) or 1 (the backup's).
  const std::unique_ptr<std::atomic<int>[]> routes_;
};

}  // namespace psrt

#endif  // PSRT_WORKER_STORE_SHARD_CALLS_H_
