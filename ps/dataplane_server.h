// DataPlaneServer: a ps process's pushes and pulls over the tensor data plane
// (dataplane/), beside its gRPC service (ps_service.h), which keeps the
// control plane (Init, Save, Restore, status, health, shutdown) and serves
// pushes and pulls too, for workers that use gRPC for tensors. Both feed
// the ps's RequestHandler (request_handler.h): this adapter only reads
// frames and sends the handler's answers.
//
// A worker opens connections of its own to the data port (a pull and a push
// connection per stripe), each starting with a hello that carries the
// cluster's auth token (TransportSecurity::CheckDataPlaneCredential; a wrong
// one is refused and the connection closed). Then each request frame is
// answered in order on its connection:
//   Push: metadata a PushHeader, data the gradients; received into the
//     connection's buffer (reused from step to step: no fresh pages in
//     steady state) and applied by the stripe's ParameterShard only once
//     the whole frame has arrived, so that a connection cut mid-push applies
//     nothing. Reply: a PushResponse.
//   Pull: metadata a PullRequest; the reply (a PullHeader, then the values)
//     is sent straight from the shard's snapshot when the shard answers.
//     While a pull waits for a version its thread sleeps in one poll() on
//     the connection and an eventfd that the answer writes (no timer); a
//     pull whose connection closes, or whose server stops, is cancelled.
// Errors are replies with the status and its text; bytes that are not
// frames end the connection.
//
// There is no TLS on the data plane: psrt_ps does not start one when TLS is
// on (the workers then use gRPC for tensors).
//
// Thread safety: a thread per connection (at most 4096 connections; more are
// closed as they come) and one accepting; the shards and the metrics are
// thread-safe. The destructor stops them all.
#ifndef PSRT_PS_DATAPLANE_SERVER_H_
#define PSRT_PS_DATAPLANE_SERVER_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "common/transport_security.h"
#include "dataplane/frame_connection.h"
#include "ps/parameter_shard.h"
#include "ps/request_handler.h"

namespace psrt {

class DataPlaneServer {
 public:
  struct Options {
    // "host:port" (port 0: any) or "unix-abstract:NAME".
    std::string listen_address;
    // Frames whose data exceed it are refused (psrt_ps --max_message_mb).
    uint64_t max_data_bytes = uint64_t{1} << 30;
    std::shared_ptr<const TransportSecurity> security;  // Required.
    PsMetrics* metrics = nullptr;                       // Optional.
  };

  // Listens and starts accepting. Stripe s is shards[s]. REQUIRES: the
  // shards (and the metrics) outlive the server.
  static absl::StatusOr<std::unique_ptr<DataPlaneServer>> Start(std::vector<ParameterShard*> shards,
                                                                Options options);
  ~DataPlaneServer();

  // Where it listens, with the port chosen.
  const std::string& address() const { return listener_->address(); }
  // The port of address() (0 for a Unix socket).
  int port() const;

 private:
  DataPlaneServer(std::vector<ParameterShard*> shards, Options options,
                  std::unique_ptr<dataplane::FrameListener> listener);
  void AcceptLoop();
  void Serve(dataplane::FrameConnection* connection);
  // Reads the hello; OK when its credential passes.
  absl::Status Greet(dataplane::FrameConnection* connection);
  // What a connection's thread keeps from request to request.
  struct ConnectionState {
    std::vector<char> buffer;  // Pushes' data, reused from step to step.
    int wake_fd = -1;          // An eventfd a waiting pull's answer writes.
    ~ConnectionState();        // Closes wake_fd.
  };
  // Handles one request frame whose header and metadata have arrived; an
  // error that leaves the stream unusable ends the connection.
  absl::Status Handle(dataplane::FrameConnection* connection, const dataplane::FrameHeader& header,
                      const std::string& meta, ConnectionState* state);
  absl::Status HandlePush(dataplane::FrameConnection* connection,
                          const dataplane::FrameHeader& header, const std::string& meta,
                          std::vector<char>* buffer);
  absl::Status HandlePull(dataplane::FrameConnection* connection,
                          const dataplane::FrameHeader& header, const std::string& meta,
                          ConnectionState* state);
  // Sends the reply to request `header`: `meta` and the concatenation of
  // `data`, or `error`'s code and text when it is not OK.
  absl::Status Reply(dataplane::FrameConnection* connection, const dataplane::FrameHeader& header,
                     const absl::Status& error, absl::string_view meta = {},
                     absl::Span<const absl::Span<const char>> data = {});

  // A connection and the thread that serves it.
  struct Session {
    std::unique_ptr<dataplane::FrameConnection> connection;
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;  // The thread has ended.
  };

  const RequestHandler handler_;
  const Options options_;
  const std::unique_ptr<dataplane::FrameListener> listener_;
  std::atomic<bool> stopping_{false};
  absl::Mutex mu_;
  std::vector<Session> sessions_ ABSL_GUARDED_BY(mu_);
  std::thread accepting_;
};

}  // namespace psrt

#endif  // PSRT_PS_DATAPLANE_SERVER_H_
