// RequestHandler: what a ps process does with a push or a pull, whichever
// transport brought it (design.md's "One path for tensors"; ps-lite's
// request handle). PsService (gRPC, ps_service.h) and DataPlaneServer (the
// tensor data plane, dataplane_server.h) only move bytes: they read a
// request's frame, call the handler, and send what it answers.
//
// For each request it finds the stripe's ParameterShard (one error text for
// a stripe this process lacks), calls it, and counts what it served into
// PsMetrics (common/metrics.h): a push's outcome, size and latency and the
// version it left; a pull's size and, for one that waited, the wait.
//
// Thread safety: thread-safe; the shards and the metrics are.
#ifndef PSRT_PS_REQUEST_HANDLER_H_
#define PSRT_PS_REQUEST_HANDLER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/byte_source.h"
#include "common/metrics.h"
#include "proto/psrt.pb.h"
#include "ps/parameter_shard.h"

namespace psrt {

class RequestHandler {
 public:
  // Stripe s is shards[s]. REQUIRES: shards is not empty; the shards and
  // `metrics` (null: nothing counted) outlive the handler.
  RequestHandler(std::vector<ParameterShard*> shards, PsMetrics* metrics);

  const std::vector<ParameterShard*>& shards() const { return shards_; }

  // The shard of stripe `stripe` (its number in decimal, as the call names
  // it); InvalidArgument naming it when this process serves no such stripe.
  absl::StatusOr<ParameterShard*> Stripe(absl::string_view stripe) const;

  // Applies a push to `stripe`: `header` and `data` as read from the
  // request, unless `read` (the transport's verdict: the frame did not parse,
  // or its caller may not push as that replica) is an error, which is
  // returned as it is. Counts the push, whatever its outcome; `wire_bytes`:
  // the request's size. `data` may be null when `read` is an error.
  absl::StatusOr<proto::PushResponse> Push(absl::string_view stripe, const absl::Status& read,
                                           const proto::PushHeader& header, ByteSource* data,
                                           int64_t wire_bytes) const;

  // What a pull is answered with: `header` (waited_us set), then `values`
  // and the embedding `rows`, which stay valid and unchanged while
  // `snapshot` and `row_buffer` are held.
  struct PullAnswer {
    proto::PullHeader header;
    absl::Span<const char> values;
    absl::Span<const char> rows;
    std::shared_ptr<const ParameterShard::Snapshot> snapshot;
    std::shared_ptr<const std::vector<float>> row_buffer;
    absl::Duration waited;
    bool did_wait = false;  // It waited for its version (or slower replicas).
  };
  using PullDone = std::function<void(absl::StatusOr<PullAnswer>)>;
  // A pull that waits; Cancel() frees it at once (its caller has gone), and
  // does nothing when it was answered already or never waited.
  struct WaitingPull {
    ParameterShard* shard = nullptr;
    int64_t id = 0;
    void Cancel() const {
      if (id != 0) shard->CancelPull(id);
    }
  };

  // Serves a pull of `stripe` (`read` as for Push), waiting at most until
  // the request's timeout or `latest` (the call's deadline). Calls `done`
  // exactly once: before Pull returns, or, for a pull that waits, on the
  // thread that answers it (a push, a shutdown, the shard's deadline thread,
  // Cancel). Call CountPull for each answer sent.
  WaitingPull Pull(absl::string_view stripe, const absl::Status& read,
                   const proto::PullRequest& request, absl::Time latest, PullDone done) const;
  // Counts an answer sent (`wire_bytes`: its size) and, if it waited, its wait.
  void CountPull(const PullAnswer& answer, int64_t wire_bytes) const;

 private:
  const std::vector<ParameterShard*> shards_;
  PsMetrics* const metrics_;
};

}  // namespace psrt

#endif  // PSRT_PS_REQUEST_HANDLER_H_
