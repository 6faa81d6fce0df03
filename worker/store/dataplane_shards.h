// DataPlaneShards: pushes and pulls to every ps shard over the tensor data
// plane (dataplane/), the engine under PsClient (ps_client.h) when tensors do
// not ride gRPC (--tensor_transport=socket). It is to frames what
// ShardFanout is to gRPC calls, with the same contract:
//
// CallAll sends each shard its request (in shard order or in `order`, each
// right after `prepare(k)`) and returns once every shard has answered. Each
// shard has a connection of its own per method (a pull and a push may run
// at once), opened on first use with a hello carrying the auth token, and a
// thread that runs its calls, so the shards' transfers proceed in parallel
// and a reply's data is read straight into the caller's memory by
// `on_reply`. A shard whose connection fails (refused, reset, closed: the ps
// restarted) is reconnected and called again after a backoff of 100 ms
// doubling to 2 s, for up to retry_timeout from its first failure, while the
// other shards go on; so is one past its deadline when the call allows
// (pushes: a repeated push is deduplicated by the ps). The first other error
// cancels the calls still running and is returned, prefixed with the
// shard's name.
//
// Thread safety: CallAll may run on several threads at once for different
// methods; one call per method at a time.
#ifndef PSRT_WORKER_STORE_DATAPLANE_SHARDS_H_
#define PSRT_WORKER_STORE_DATAPLANE_SHARDS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "dataplane/frame.h"
#include "dataplane/frame_connection.h"

namespace psrt {

class DataPlaneShards {
 public:
  struct Options {
    int num_shards = 0;
    // Shard k's data-plane address ("host:port" or "unix-abstract:NAME"),
    // asked again before each connection is opened (a restarted ps may
    // serve on another port); its error is the attempt's.
    std::function<absl::StatusOr<std::string>(int)> address_of;
    std::function<int(int)> stripe_of;  // Shard k's stripe within its ps task.
    std::string credential;             // TransportSecurity::DataPlaneCredential().
    uint64_t max_data_bytes = uint64_t{1} << 31;
    absl::Duration retry_timeout = absl::Seconds(60);
    std::function<std::string(int)> shard_name;  // For errors and logs.
  };
  // A request: its metadata and its data, gathered from the caller's memory
  // (which must stay unchanged until CallAll returns).
  struct Request {
    std::string meta;
    std::vector<absl::Span<const char>> data;
  };

  explicit DataPlaneShards(Options options);
  ~DataPlaneShards();

  // See the header comment. `prepare(k)` fills requests[k] (it may block;
  // its error is the call's: that shard and those after it are not
  // called). `on_reply(k, connection, header, meta)` runs on shard k's
  // thread for a reply with status OK and must read the reply's data
  // (connection->data_left() bytes); its error counts as the shard's.
  // REQUIRES: requests.size() == number of shards.
  absl::Status CallAll(dataplane::FrameMethod method, absl::Duration timeout, bool retry_deadline,
                       std::vector<Request>& requests,
                       const std::function<absl::Status(int, dataplane::FrameConnection*,
                                                        const dataplane::FrameHeader&,
                                                        const std::string&)>& on_reply,
                       const std::vector<int>* order = nullptr,
                       const std::function<absl::Status(int)>& prepare = nullptr);

 private:
  class Link;  // One shard's connection and thread for one method.
  Link& LinkOf(dataplane::FrameMethod method, int k);

  const Options options_;
  std::vector<std::unique_ptr<Link>> push_links_, pull_links_;
};

}  // namespace psrt

#endif  // PSRT_WORKER_STORE_DATAPLANE_SHARDS_H_
