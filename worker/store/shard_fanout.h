// ShardFanout: calls one gRPC method on every ps shard in parallel, the
// generic engine under the ps client (ps_client.h).
//
// It holds one generic stub per shard (shard k: a channel of its own, and
// the stripe it names in its calls' metadata, kStripeMetadata of
// common/rpc_util.h). CallAll sends each shard its request and returns once
// every shard has answered. A shard whose call fails in a way the caller
// says is retryable (RetryOn) is called again, alone, after a backoff of
// 100 ms doubling to 2 s, for up to retry_timeout from its first failure,
// while the other shards' calls go on; the first other error cancels the
// calls still running (unless the call is `independent`) and is returned,
// prefixed with the shard's name.
//
// Thread safety: AddShard before any call; then CallAll and CallOne (which
// block until their calls end) may run on several threads at once, each
// keeping its own state.
#ifndef PSRT_WORKER_STORE_SHARD_FANOUT_H_
#define PSRT_WORKER_STORE_SHARD_FANOUT_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"

namespace psrt {

// Which failures CallAll retries, with backoff, until the retry timeout.
enum class RetryOn {
  kNothing,
  kUnavailable,             // Safe when the call may be repeated.
  kUnavailableOrDeadline,   // Pushes: a repeated one is deduplicated.
};

class ShardFanout {
 public:
  // `shard_name(k)` names shard k in errors and logs.
  ShardFanout(std::function<std::string(int)> shard_name, absl::Duration retry_timeout);

  // Adds the next shard: its channel and the stripe it serves on it.
  void AddShard(std::shared_ptr<grpc::Channel> channel, int stripe);
  int num_shards() const { return static_cast<int>(stubs_.size()); }

  // Calls `method` on every shard: in shard order or in `order`, each right
  // after `prepare(k)` (if any; it may block) has filled requests[k]. A
  // failed prepare is the call's error: neither that shard nor any after it
  // is prepared or called (those already called run to their ends).
  // `on_response` (if any; none ignores the replies) runs on gRPC's thread
  // for each reply; its error counts as the shard's. Retries as `retry_on`
  // allows; the first other error cancels the calls still running (unless
  // `independent`: each call then runs to its end, as a goodbye that must
  // reach every shard does).
  // REQUIRES: requests.size() == num_shards().
  absl::Status CallAll(
      const std::string& method, absl::Duration timeout, RetryOn retry_on,
      std::vector<grpc::ByteBuffer>& requests,
      const std::function<absl::Status(int, const grpc::ByteBuffer&)>& on_response =
          nullptr,
      bool independent = false, const std::vector<int>* order = nullptr,
      const std::function<absl::Status(int)>& prepare = nullptr);

  // One call of `method` to shard k, not retried, failing at once if the
  // shard is unreachable (no wait for ready).
  grpc::Status CallOne(int k, const std::string& method, absl::Duration timeout,
                       const grpc::ByteBuffer& request, grpc::ByteBuffer* response);

 private:
  // A context for a call to shard k, with its stripe named.
  void Prepare(int k, grpc::ClientContext* context) const;

  const std::function<std::string(int)> shard_name_;
  const absl::Duration retry_timeout_;
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs_;  // One per shard.
  std::vector<std::string> stripes_;  // Per shard: its stripe, as metadata.
};

}  // namespace psrt

#endif  // PSRT_WORKER_STORE_SHARD_FANOUT_H_
