// PsClient: a worker's view of the parameter servers: Init (chief), Pull,
// Push, and little else.
//
// The client holds the placement that maps the model's variables onto ps
// shards (common/placement.h). A ps process may serve several shards
// (stripes, proto/psrt.proto): shard k is stripe k % S of ps task k / S, on
// connections of its own. Every method is written once over the transport
// seam (shard_transport.h): ShardCalls (shard_calls.h) calls all shards in
// parallel and returns when all have answered; SliceCodec (slice_codec.h)
// maps the variables' slices to and from the wire. The control plane (Init,
// status, Save, Restore, Shutdown) goes over gRPC; pushes and pulls over the
// ps tasks' data plane or gRPC (Options::tensor_transport). Push sends
// gradient bytes straight from the caller's tensors; Pull reads parameter
// bytes straight into the caller's tensors: no per-step allocation of tensor
// size on either path.
//
// Embedding tables (Options::tables): every shard holds the rows whose ids
// TableShardOf gives it. With SetSparseFeatures, a pull asks each shard for
// its share of the batch's distinct ids and scatters the rows it gets back
// into place; a push sends each shard its ids' gradient rows after the
// dense gradients, so that the shard takes or drops both together.
//
// Versions are tracked per shard: Pull records each shard's version, and the
// next Push tags each shard's gradients with it. In sync mode the shards
// move in lockstep, so all of them are equal.
//
// Faults: a shard that is unreachable (UNAVAILABLE) is called again with
// backoff for up to Options::retry_timeout, alone, while the other shards'
// calls go on; the first other error cancels the calls still running. A
// push is retried with the same (worker incarnation, step), so the shard
// never applies it twice. Pulls and pushes name the incarnation each shard
// last answered with, and return Aborted when the shard has another one (it
// restarted and restored a checkpoint, or was rolled back) or says its state
// is not confirmed: the caller then waits for the model to be ready again,
// calls ForgetIncarnations, and pulls.
//
// Replicated shards (Options::ps_replicas): when a shard's primary dies
// between a sync push and the version it completes, the pushes it summed
// die with it. A pull that finds the shard's other copy serving first sends
// that copy the step's push again (the same (worker, step): taken once), so
// the caller's gradients must stay unchanged from a Push until the next
// Pull has returned.
//
// Thread safety: not thread-safe; one thread at a time drives it.
#ifndef PSRT_WORKER_STORE_PS_CLIENT_H_
#define PSRT_WORKER_STORE_PS_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "common/placement.h"
#include "common/tensor.h"
#include "common/tensor_transport.h"
#include "kernels/cpu_context.h"
#include "proto/psrt.pb.h"
#include "worker/store/parameter_store.h"
#include "worker/store/shard_transport.h"

namespace psrt {

class DataPlaneShardTransport;  // worker/store/dataplane_shard_transport.h
class GrpcShardTransport;       // worker/store/grpc_shard_transport.h
class ShardCalls;               // worker/store/shard_calls.h
class SliceCodec;               // worker/store/slice_codec.h
class Timeline;                 // common/timeline.h
class TransportSecurity;        // common/transport_security.h

class PsClient final : public ParameterStore {
 public:
  struct Options {
    std::vector<std::string> ps_addresses;  // ps task t listens on [t].
    // Shards each ps task serves (psrt_ps --ps_stripes); WaitForServers
    // fails when a ps task serves another number. The worker's flags leave
    // 0 when --ps_stripes is not given: MakeStore (worker_task.cc) asks the
    // ps tasks before making the client.
    int ps_stripes = 1;
    // Backup copies of each shard (psrt_ps --ps_replicas, which must be the
    // same): 0 or 1. With 1, shard k's calls follow its primary to whichever
    // copy serves (shard_calls.h), and WaitForServers fails on a ps task
    // started with another value.
    int ps_replicas = 0;
    int replica = 0;                        // This worker's replica index.
    absl::Duration rpc_timeout = absl::Seconds(60);
    // How long a pull may wait for the next version (sync mode waits for
    // the slowest replica).
    absl::Duration pull_timeout = absl::Seconds(300);
    // Threads that copy pulled values into the parameters; 0: one per core.
    int copy_threads = 0;
    // How long an unreachable shard is retried before the call fails (a
    // supervised parameter server restarts within this).
    absl::Duration retry_timeout = absl::Seconds(60);
    // TLS and the auth token of every channel; null: plaintext, no token.
    std::shared_ptr<const TransportSecurity> security;
    // Reach shards on this host (a loopback address) over their gRPC Unix
    // socket (psrt_ps --unix_socket; rpc_util.h's PreferLocalSocket). Not
    // with TLS, whose certificates name the TCP host: those stay on TCP.
    // (The data plane takes a ps task's Unix socket whenever it can.)
    bool unix_socket = false;
    // How gradients and parameters travel (common/wire_dtype.h): DT_FLOAT,
    // or DT_BFLOAT16 / DT_HALF (half the bytes; the shards keep float32).
    proto::DataType wire_dtype = proto::DT_FLOAT;
    // Counts pushes and pulls (common/metrics.h); null: not counted.
    // REQUIRES: outlives the client.
    TransferMetrics* metrics = nullptr;
    // How pushes and pulls travel: kDataPlane: over the ps tasks' data
    // plane (dataplane_shard_transport.h; over a ps task's Unix socket
    // from its host, else TCP), WaitForServers failing on a ps task that
    // serves none;
    // kAuto: over the data plane when every ps task serves one, else gRPC;
    // kGrpc: gRPC. REQUIRES: kGrpc with TLS.
    TensorTransport tensor_transport = TensorTransport::kGrpc;
    // The model's embedding tables (the chief's Init creates them on every
    // shard); empty for a dense model.
    std::vector<proto::TableMeta> tables;
    // Where each shard's push (encoding, then the call to its reply) and
    // pull (the call to its values decoded) show, one lane a shard; null:
    // nowhere. REQUIRES: outlives the client.
    Timeline* timeline = nullptr;
    // The whole model and what the placement was computed with: the
    // chief's Init hands it to every shard (InitHeader.layout), for their
    // checkpoints.
    proto::ModelLayout layout;
  };
  // REQUIRES: placement.num_shards ==
  //           options.ps_addresses.size() * options.ps_stripes.
  PsClient(Options options, Placement placement,
           std::vector<VariableDef> variables);
  ~PsClient();

  // ParameterStore (worker/parameter_store.h), over gRPC. WaitForServers
  // retries with backoff, logging the shards it still waits for, and also
  // fails (FailedPrecondition) on a ps task that serves another number of
  // stripes than Options::ps_stripes (unless the client has no variables:
  // an operator's, whose Shutdown reaches every stripe of a task anyway).
  // Shutdown ignores unreachable shards: they may have exited already. An
  // operator's (replica -1) ends training in two rounds of calls, so that
  // sync shards end at one version (proto ShutdownRequest).
  absl::Status WaitForServers(absl::Duration timeout) override;
  absl::Status Init(const proto::TrainingConfig& config,
                    const std::vector<Tensor>& params, int64_t recovery_epoch = 0) override;
  absl::StatusOr<proto::TrainingConfig> WaitForModelReady(
      absl::Duration timeout) override;
  absl::StatusOr<PullResult> Pull(int64_t min_version, std::vector<Tensor>* params,
                                  bool moving_average = false, int64_t min_clock = 0,
                                  Precision precision = Precision::kWire,
                                  const ShardHooks* hooks = nullptr) override;
  absl::StatusOr<PushResult> Push(const std::vector<Tensor>& grads,
                                  const ShardHooks* hooks = nullptr) override;
  absl::Status Shutdown() override;
  absl::StatusOr<std::vector<proto::StatusResponse>> GetStatus() override;
  absl::Status Save(int64_t step, int64_t version, int keep, int64_t keep_step = -1) override;
  absl::Status Restore(int64_t step, int64_t recovery_epoch) override;
  void ForgetIncarnations() override;
  void SetSparseFeatures(SparseFeatures* features) override { sparse_ = features; }
  absl::Status LookupRows(SparseFeatures* features) override;
  absl::StatusOr<int64_t> SetMembers(const proto::MembersRequest& request) override;

  const Placement& placement() const override { return placement_; }
  proto::DataType wire_dtype() const override { return options_.wire_dtype; }
  // "ps/T (host:port)", or "ps/T stripe S (host:port)" with several stripes,
  // as errors and logs name shard `shard`.
  std::string ShardName(int shard) const override;
  const std::vector<int64_t>& shard_versions() const { return versions_; }
  // Pushes and pulls go over the data plane (known once WaitForServers has
  // succeeded, with TensorTransport::kAuto).
  bool uses_data_plane() const { return data_plane_ != nullptr; }

 private:
  // Records the incarnation each shard answered with; Aborted if one
  // changed.
  absl::Status CheckIncarnations(const std::vector<int64_t>& answered);
  // Transport endpoint e's data-plane addresses, from its ps task's status:
  // its Unix socket (when it serves one), then TCP.
  absl::StatusOr<std::vector<std::string>> DataPlaneAddresses(int e);
  // Endpoint e (ShardCalls::endpoint): its ps task and stripe there.
  int TaskOf(int e) const;
  int StripeOf(int e) const;
  // "ps/T (host:port)" or "ps/T stripe S (host:port)" of endpoint e, and
  // ", the backup of shard k" for a backup copy.
  std::string EndpointName(int e) const;
  // Sends shard k's last push to the copy it is routed to now, when that
  // is not the copy that took it.
  absl::Status PushAgainIfMoved(int k);
  // Calls `method` on every shard (ShardCalls::CallAll) over the control
  // plane with the same request.
  absl::Status CallControl(PsMethod method, absl::Duration timeout,
                           const google::protobuf::MessageLite& request,
                           const ShardTransport::OnReply& on_reply);
  // Sends `request` to every ps task at once, or to the tasks `only` names
  // (Shutdown); with `end_bounds`, each task's answer goes there (0 for a
  // task that did not answer).
  absl::Status ShutdownEveryTask(const proto::ShutdownRequest& request,
                                 std::vector<int64_t>* end_bounds,
                                 const std::vector<int>& only = {});
  // The transport of pushes and pulls: the data plane's, or gRPC's.
  ShardTransport& tensors();
  // Splits `features`' distinct ids among the shards (shard_ids_).
  void SplitIds(const SparseFeatures& features);
  // Asks for shard k's rows of every table (its ids from SplitIds).
  void AddSparseIds(int k, proto::PullRequest* pull) const;
  // Reads shard k's rows, after `dense_bytes` of dense values, from
  // `reply` into features->rows. Internal when the reply's segments are
  // not what was asked.
  absl::Status ReadRows(int k, const proto::PullHeader& header, uint64_t dense_bytes,
                        ShardReply& reply, SparseFeatures* features);
  // Shard k's gradient rows as request pieces and header segments.
  void AddSparseGradients(int k, const SparseFeatures& features, proto::PushHeader* header,
                          std::vector<absl::Span<const char>>* pieces);
  // Sends `pulls` (one per shard) and reads the replies: the values into
  // `params` (null: a rows-only pull), the rows into `features` (null: none).
  // With `record_versions`, the next push names the versions answered: not
  // after a pull of moving averages or of rows alone (an evaluation's,
  // between a step's pull and its push), whose versions are not those its
  // gradients come from.
  absl::StatusOr<PullResult> CallPull(std::vector<proto::PullRequest>& pulls,
                                      std::vector<Tensor>* params, proto::DataType dtype,
                                      const ShardHooks* hooks, SparseFeatures* features,
                                      bool record_versions);

  const Options options_;
  const kernels::CpuContext copier_;
  const Placement placement_;
  const std::vector<VariableDef> variables_;
  // The transports (kept out of this header so that the trainer never sees
  // a gRPC type), the loop over them, and the codec.
  std::unique_ptr<GrpcShardTransport> grpc_;
  std::unique_ptr<DataPlaneShardTransport> data_plane_;  // Null: tensors over gRPC.
  std::unique_ptr<ShardCalls> calls_;
  std::unique_ptr<SliceCodec> codec_;
  std::vector<proto::PushHeader> push_headers_;  // Per shard, reused.
  std::vector<int64_t> versions_;
  std::vector<int64_t> incarnations_;  // Per shard; 0 until it answers.
  int64_t worker_incarnation_ = 0;     // Random id of this client.
  int64_t push_step_ = 0;              // Pushes sent so far.
  // Replicas: the last push's gradients, and per shard the endpoint that
  // took it (-1: pulled since).
  const std::vector<Tensor>* last_grads_ = nullptr;
  std::vector<int> pushed_to_;
  SparseFeatures* sparse_ = nullptr;   // SetSparseFeatures'.
  // Per shard, reused: its share of the batch's distinct ids, their
  // positions in the batch's order, and (per table) their gradient rows.
  struct ShardIds {
    std::vector<uint64_t> ids;
    std::vector<int32_t> positions;
    std::vector<std::vector<float>> grads;
    std::vector<float> rows;  // A reply's rows read in order.
  };
  std::vector<ShardIds> shard_ids_;
};

}  // namespace psrt

#endif  // PSRT_WORKER_STORE_PS_CLIENT_H_
