// HybridStore: Persia's split of a CTR model (psrt_worker --dense_allreduce,
// with --sync_replicas --sparse_async). The dense variables are every
// worker's own, averaged by the allreduce ring at every step
// (AllreduceStore); the embedding tables are on the ps tasks (a PsClient
// that holds no dense variable), whose shards take each push's rows on
// arrival (--sparse_async) and move their version once per step, with the
// ring.
//
// Its shards (placement(), GetStatus, ShardName) are the ps shards, then
// the ring's fusion groups: the chief's recovery (cluster_recovery.h) sees
// both parts, restores both to a checkpoint step that both hold, and
// confirms both. Checkpoints: the ps shards save the tables, and the
// workers the dense part, in a directory of their own (AllreduceStore's
// one-shard files, which the ps tasks' must not meet: MakeStore puts them
// in <checkpoint_dir>/dense). A
// Pull reads the dense values locally and the batch's rows from the ps
// tasks; a Push averages the dense gradients over the ring, applies them,
// then sends the rows' gradients to the ps tasks. ShardHooks are not
// supported (the CTR models do not overlap communication).
//
// Faults: as in allreduce mode, the job restarts and resumes from the
// newest checkpoint of both parts. A worker that dies fails the others'
// next push; a ps task that restarts (restoring its checkpoint) makes the
// pull or push that sees it fail with FailedPrecondition instead of
// Aborted, which a ps-mode worker recovers from in place: the workers may
// see it at different points of a step (one before the step's ring
// reduction, another after it) and would run different ring operations.
// The chief's start then restores both parts to the newest step both hold
// and confirms them, and the other workers' dense parts follow it over the
// ring (AllreduceStore::WaitForModelReady).
//
// Thread safety: not thread-safe (ParameterStore).
#ifndef PSRT_WORKER_STORE_HYBRID_STORE_H_
#define PSRT_WORKER_STORE_HYBRID_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/store/allreduce_store.h"
#include "worker/store/parameter_store.h"
#include "worker/store/ps_client.h"

namespace psrt {

class HybridStore final : public ParameterStore {
 public:
  // REQUIRES: `tables` holds no dense variable (placed over none) and the
  // model's tables; `dense` holds every dense variable, its checkpoint
  // directory another than the ps tasks'.
  HybridStore(std::unique_ptr<AllreduceStore> dense, std::unique_ptr<PsClient> tables);

  absl::Status WaitForServers(absl::Duration timeout) override;
  absl::Status Init(const proto::TrainingConfig& config, const std::vector<Tensor>& params,
                    int64_t recovery_epoch = 0) override;
  absl::StatusOr<proto::TrainingConfig> WaitForModelReady(absl::Duration timeout) override;
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
  void ForgetIncarnations() override { tables_->ForgetIncarnations(); }
  void SetSparseFeatures(SparseFeatures* features) override {
    tables_->SetSparseFeatures(features);
  }
  absl::Status LookupRows(SparseFeatures* features) override;

  const Placement& placement() const override { return placement_; }
  proto::DataType wire_dtype() const override { return proto::DT_FLOAT; }
  std::string ShardName(int shard) const override;

 private:
  int num_ps_shards() const { return tables_->num_shards(); }

  const std::unique_ptr<AllreduceStore> dense_;
  const std::unique_ptr<PsClient> tables_;
  const Placement placement_;  // The ps shards (empty), then the fusion groups.
  std::vector<Tensor> no_params_;  // The ps shards' dense variables: none.
};

}  // namespace psrt

#endif  // PSRT_WORKER_STORE_HYBRID_STORE_H_
