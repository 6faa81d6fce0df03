// DataPlaneShardTransport: the ShardTransport (shard_transport.h) over the
// ps tasks' tensor data plane (dataplane/): pushes and pulls only (the rest
// stays on gRPC). Each shard has a connection of its own per method (a pull
// and a push may run at once), opened on first use with a hello carrying
// the auth token, and a thread that runs its attempts one at a time, so the
// shards' transfers proceed in parallel and a reply's data is read straight
// from the socket into the caller's memory. A connection that fails
// (refused, reset, closed: the ps restarted), or that a reply leaves out of
// step, is dropped and opened anew by the next attempt; a cancelled attempt
// shuts its connection down.
//
// Thread safety: Start may run on several threads at once, with at most
// one attempt per shard and method at a time (ShardCalls starts a retry
// only after the last attempt's `done`).
#ifndef PSRT_WORKER_STORE_DATAPLANE_SHARD_TRANSPORT_H_
#define PSRT_WORKER_STORE_DATAPLANE_SHARD_TRANSPORT_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/store/shard_transport.h"

namespace psrt {

class DataPlaneShardTransport final : public ShardTransport {
 public:
  struct Options {
    int num_shards = 0;
    // Shard k's data-plane addresses ("host:port" or "unix-abstract:NAME"),
    // the preferred first (dataplane::ConnectWithHello tries each but the
    // last once), asked again before each connection is opened (a
    // restarted ps may serve on another port); its error is the attempt's.
    std::function<absl::StatusOr<std::vector<std::string>>(int)> addresses_of;
    std::function<int(int)> stripe_of;  // Shard k's stripe within its ps task.
    std::string credential;             // TransportSecurity::DataPlaneCredential().
    uint64_t max_data_bytes = uint64_t{1} << 31;
    // How long a reply's data may take to arrive once its header has (the
    // attempt's deadline may be spent waiting for a version).
    absl::Duration transfer_timeout = absl::Seconds(60);
    std::function<std::string(int)> shard_name;  // For logs.
  };

  explicit DataPlaneShardTransport(Options options);
  ~DataPlaneShardTransport() override;

  std::unique_ptr<ShardAttempt> Start(int shard, PsMethod method, const ShardRequest& request,
                                      absl::Time deadline, const OnReply& on_reply,
                                      Done done) override;
  bool Supports(PsMethod method) const override {
    return method == PsMethod::kPush || method == PsMethod::kPull;
  }
  uint64_t WireBytes(const ShardRequest& request) const override;

 private:
  class Link;  // One shard's connection and thread for one method.

  const Options options_;
  std::vector<std::unique_ptr<Link>> push_links_, pull_links_;
};

}  // namespace psrt

#endif  // PSRT_WORKER_STORE_DATAPLANE_SHARD_TRANSPORT_H_
