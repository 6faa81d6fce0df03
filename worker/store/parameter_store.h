// ParameterStore: where a worker's trainer keeps the model's variables and
// sends its gradients. Two implementations:
//  - PsClient (worker/ps_client.h): the parameter-server tasks, over gRPC;
//  - AllreduceStore (worker/allreduce_store.h): allreduce mode, where every
//    worker averages the gradients with the others (a ring allreduce) and
//    applies them to a store of its own.
// The trainer (worker/trainer.h) sees only this interface. A store is cut
// into shards (placement()); the calls act on all of them. A shard is a ps
// shard (one stripe of a ps task) for PsClient, a fusion group for
// AllreduceStore.
//
// Thread safety: not thread-safe; one thread at a time drives a store.
#ifndef PSRT_WORKER_STORE_PARAMETER_STORE_H_
#define PSRT_WORKER_STORE_PARAMETER_STORE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/placement.h"
#include "common/tensor.h"
#include "models/sparse_features.h"
#include "proto/psrt.pb.h"

namespace psrt {

class ParameterStore {
 public:
  struct PullResult {
    int64_t version = 0;  // Lowest version among the shards.
    bool training_done = false;
    // The longest a shard made the pull wait for its version (PullHeader's
    // waited_us): the part of the pull's time that is not communication.
    absl::Duration waited;
  };
  struct PushResult {
    bool accepted = true;  // False if any shard dropped it as stale.
    bool training_done = false;
  };
  // How a pull's values travel: as the store's wire dtype says, or float32
  // whatever it says (for evaluation and the final model).
  enum class Precision { kWire, kFull };
  // Lets a caller overlap a pull or a push with its compute
  // (worker/step_pipeline.h), while the call runs on another thread.
  struct ShardHooks {
    // Pull: runs (on the store's thread, a gRPC one for PsClient) once
    // shard k's values are in the parameters (on every attempt that
    // delivers them).
    std::function<void(int shard)> arrived;
    // Push: the shards are sent in `order` (every shard once), each only
    // after `wait_until_ready(shard)` returns OK: its gradients are final.
    // An error there abandons the push: that shard and those after it are
    // not sent (those sent before stay sent) and Push returns the error.
    std::vector<int> order;
    std::function<absl::Status(int shard)> wait_until_ready;
  };

  virtual ~ParameterStore() = default;

  // Waits until every shard answers and none is still restoring its
  // checkpoint at start. DeadlineExceeded names the shards still missing.
  virtual absl::Status WaitForServers(absl::Duration timeout) = 0;
  // Chief: registers the variables and their initial values on every shard
  // (or confirms the state they hold), in recovery round `recovery_epoch`
  // (proto's RestoreRequest).
  virtual absl::Status Init(const proto::TrainingConfig& config,
                            const std::vector<Tensor>& params, int64_t recovery_epoch = 0) = 0;
  // Waits until the chief has made every shard ready (initialized or
  // restored, and confirmed), checks that it holds exactly this worker's
  // variables, and returns the chief's config. Cancelled when the chief has
  // already ended training.
  virtual absl::StatusOr<proto::TrainingConfig> WaitForModelReady(absl::Duration timeout) = 0;
  // Fills `params` (one tensor per variable, already shaped) with values of
  // version >= min_version from every shard, once every unfinished replica
  // has pushed min_clock gradients (bounded staleness); with
  // `moving_average`, with their moving averages instead.
  virtual absl::StatusOr<PullResult> Pull(int64_t min_version, std::vector<Tensor>* params,
                                          bool moving_average = false, int64_t min_clock = 0,
                                          Precision precision = Precision::kWire,
                                          const ShardHooks* hooks = nullptr) = 0;
  // Pushes one gradient per variable, tagged with the versions last pulled.
  virtual absl::StatusOr<PushResult> Push(const std::vector<Tensor>& grads,
                                          const ShardHooks* hooks = nullptr) = 0;
  // Tells every shard this replica is done (the chief's ends training).
  // Every shard is told, whatever another answers; the first refusal or
  // failure is returned, naming the shard.
  virtual absl::Status Shutdown() = 0;
  // Status of every shard, in shard order.
  virtual absl::StatusOr<std::vector<proto::StatusResponse>> GetStatus() = 0;
  // Every shard saves checkpoint `step` if it is at `version` (any: -1).
  // Each keeps its `keep` latest checkpoints and `keep_step` (-1: none).
  virtual absl::Status Save(int64_t step, int64_t version, int keep,
                            int64_t keep_step = -1) = 0;
  // Every shard loads checkpoint `step`, in recovery round `recovery_epoch`.
  virtual absl::Status Restore(int64_t step, int64_t recovery_epoch) = 0;
  // Accept whatever incarnation each shard answers with next: after the
  // chief has brought the shards to one confirmed state.
  virtual void ForgetIncarnations() = 0;

  // Sparse (CTR) models, whose embedding tables the store's shards hold.
  // From now on every Pull also fetches the rows of `features`' ids
  // (features->unique.unique) into features->rows, and every Push also
  // sends their gradient rows (features->grads); null: no more. REQUIRES:
  // the store was made with the model's tables; `features` outlives its
  // use, its rows and grads one tensor per table.
  virtual void SetSparseFeatures(SparseFeatures* features) { (void)features; }
  // The rows of `features`' ids alone, as they are now (an evaluation's,
  // or a batch's after a recovery). Unimplemented by a store without
  // tables.
  virtual absl::Status LookupRows(SparseFeatures* features) {
    (void)features;
    return absl::UnimplementedError("this parameter store holds no embedding tables");
  }

  // Elastic workers: the chief's list of members to every shard; the
  // lowest version the shards answer with. Unimplemented by a store
  // without parameter servers. Unlike the other methods, PsClient's may be
  // called from another thread while the trainer uses the store (the
  // chief's lease thread): it only makes calls (ShardCalls is thread-safe).
  virtual absl::StatusOr<int64_t> SetMembers(const proto::MembersRequest& request) {
    (void)request;
    return absl::UnimplementedError("elastic workers need parameter servers (ps mode)");
  }

  // Elastic workers in allreduce mode (AllreduceStore with an ElasticRing):
  // whether the store regroups. Its calls fail with Aborted when the
  // members changed; the trainer then calls Regroup, which joins the ring
  // of the newest members and brings every member to the newest state one
  // of them holds, and pulls it. WaitForModelReady regroups too (a worker
  // that joins gets the model so). Only this thread calls Regroup.
  virtual bool regroups() const { return false; }
  virtual absl::Status Regroup() {
    return absl::UnimplementedError("only an elastic allreduce ring regroups");
  }

  virtual const Placement& placement() const = 0;
  int num_shards() const { return placement().num_shards; }
  virtual proto::DataType wire_dtype() const = 0;
  // How errors and logs name shard `shard`.
  virtual std::string ShardName(int shard) const = 0;
};

}  // namespace psrt

#endif  // PSRT_WORKER_STORE_PARAMETER_STORE_H_
