// ShardTransport: the seam under the ps client (ps_client.h). One attempt of
// one method to one ps shard: metadata (a small protobuf) and data pieces
// out, a reply whose data is read straight into place back, and a cancel.
// ShardCalls (shard_calls.h) runs the attempts to every shard in parallel,
// with retries and errors that name the shard; PsClient writes each method
// once over it. Two implementations:
//   GrpcShardTransport (grpc_shard_transport.h): every method, over one gRPC
//     channel per shard (the control plane, and tensors with
//     --tensor_transport=grpc or TLS);
//   DataPlaneShardTransport (dataplane_shard_transport.h): pushes and pulls
//     over the ps tasks' data plane (dataplane/), the default for tensors.
// A new transport is one more implementation of this header.
//
// Thread safety: Start may run on several threads at once; an attempt's
// callbacks run on the transport's threads.
#ifndef PSRT_WORKER_STORE_SHARD_TRANSPORT_H_
#define PSRT_WORKER_STORE_SHARD_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/byte_source.h"
#include "google/protobuf/message_lite.h"

namespace psrt {

// The methods of proto/psrt.proto's ParameterServer that a worker calls.
enum class PsMethod { kInit, kPull, kPush, kGetStatus, kShutdown, kSave, kRestore, kSetMembers };

// A request: its metadata (the method's request or header message) and its
// data, gathered from the caller's memory, which must stay unchanged until
// the attempt has been destroyed.
struct ShardRequest {
  const google::protobuf::MessageLite* meta = nullptr;
  std::vector<absl::Span<const char>> data;
};

// The reply to an attempt, as the shard sent it with status OK. Read its
// metadata first (ParseMeta, once), then its data_size() bytes of data: in
// order with ReadData, or, where in_memory() is not null, from there in any
// order and on several threads.
class ShardReply {
 public:
  virtual ~ShardReply() = default;
  // Parses the reply's metadata (the method's reply or header message).
  // Internal when it is not one.
  virtual absl::Status ParseMeta(google::protobuf::MessageLite* meta) = 0;
  virtual uint64_t data_size() const = 0;
  // The data when the whole reply is in memory already; null when it must
  // be read in order from the connection.
  virtual const ByteSource* in_memory() const = 0;
  // Reads the next dst.size() bytes of the data into dst.
  // REQUIRES: no more than data_size() bytes in all.
  virtual absl::Status ReadData(absl::Span<char> dst) = 0;
  // The bytes the reply took on the wire (for the traffic metrics).
  virtual uint64_t wire_bytes() const = 0;
};

// One attempt, as Start made it. Its destructor returns once no thread
// reads the request's memory any more.
class ShardAttempt {
 public:
  virtual ~ShardAttempt() = default;
  // Ends the attempt soon (its `done` gets an error) if it still runs.
  virtual void Cancel() = 0;
};

class ShardTransport {
 public:
  // Runs on a transport thread for a reply with status OK; its status is
  // the attempt's. It must read the reply's data (or fail).
  using OnReply = std::function<absl::Status(int shard, ShardReply& reply)>;
  // Runs once per attempt, on a transport thread, with the attempt's status.
  using Done = std::function<void(absl::Status)>;

  virtual ~ShardTransport() = default;
  // Starts one attempt of `method` to `shard`, to end by `deadline`.
  // Errors: Unavailable when the shard could not be reached or the
  // connection broke (worth a retry), DeadlineExceeded, Cancelled, or the
  // shard's own. REQUIRES: Supports(method); `request` and `on_reply` stay
  // valid until the attempt is destroyed, which is not before `done` has run.
  virtual std::unique_ptr<ShardAttempt> Start(int shard, PsMethod method,
                                              const ShardRequest& request, absl::Time deadline,
                                              const OnReply& on_reply, Done done) = 0;
  virtual bool Supports(PsMethod method) const = 0;
  // The bytes `request` takes on the wire (for the traffic metrics).
  virtual uint64_t WireBytes(const ShardRequest& request) const = 0;
};

}  // namespace psrt

#endif  // PSRT_WORKER_STORE_SHARD_TRANSPORT_H_
