#include "worker/store/hybrid_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace psrt {
namespace {

// `dense`'s placement after `ps_shards` empty shards.
Placement ShiftedPlacement(const Placement& dense, int ps_shards) {
  Placement placement = dense;
  placement.num_shards = ps_shards + dense.num_shards;
  placement.shard_slices.insert(placement.shard_slices.begin(), ps_shards, {});
  for (VariableSlice& slice : placement.slices) slice.shard += ps_shards;
  return placement;
}

// A ps task's state changed under a worker (Aborted: it restarted and
// restored a checkpoint). In ps mode the worker recovers in place; here the
// workers may see it at different points of a step, one before the step's
// ring reduction and another after it, and would then run different ring
// operations: the worker stops instead, and the job restarts from the
// newest checkpoint of both parts, as allreduce mode does for a worker's
// death.
absl::Status NotInPlace(absl::Status status) {
  if (!absl::IsAborted(status)) return status;
  return absl::FailedPreconditionError(absl::StrCat(
      status.message(), " (with --dense_allreduce the job restarts from its newest checkpoint "
      "instead: the workers' ring cannot be recovered in place)"));
}

}  // namespace

HybridStore::HybridStore(std::unique_ptr<AllreduceStore> dense, std::unique_ptr<PsClient> tables)
    : dense_(std::move(dense)),
      tables_(std::move(tables)),
      placement_(ShiftedPlacement(dense_->placement(), tables_->num_shards())) {
  CHECK(tables_->placement().slices.empty()) << "the ps shards hold no dense variable";
}

std::string HybridStore::ShardName(int shard) const {
  return shard < num_ps_shards() ? tables_->ShardName(shard)
                                 : dense_->ShardName(shard - num_ps_shards());
}

absl::Status HybridStore::WaitForServers(absl::Duration timeout) {
  RETURN_IF_ERROR(tables_->WaitForServers(timeout));
  return dense_->WaitForServers(timeout);
}

absl::Status HybridStore::Init(const proto::TrainingConfig& config,
                               const std::vector<Tensor>& params, int64_t recovery_epoch) {
  RETURN_IF_ERROR(tables_->Init(config, no_params_, recovery_epoch));
  return dense_->Init(config, params, recovery_epoch);
}

absl::StatusOr<proto::TrainingConfig> HybridStore::WaitForModelReady(absl::Duration timeout) {
  ASSIGN_OR_RETURN(proto::TrainingConfig config, tables_->WaitForModelReady(timeout));
  // The ring brings every worker to the chief's dense state.
  RETURN_IF_ERROR(dense_->WaitForModelReady(timeout).status());
  return config;
}

absl::StatusOr<ParameterStore::PullResult> HybridStore::Pull(int64_t min_version,
                                                             std::vector<Tensor>* params,
                                                             bool moving_average,
                                                             int64_t min_clock,
                                                             Precision precision,
                                                             const ShardHooks* hooks) {
  CHECK(hooks == nullptr) << "HybridStore supports no ShardHooks";
  absl::StatusOr<PullResult> pulled =
      tables_->Pull(min_version, &no_params_, moving_average, min_clock, precision);
  if (!pulled.ok()) return NotInPlace(pulled.status());
  const PullResult& rows = *pulled;
  ASSIGN_OR_RETURN(PullResult dense, dense_->Pull(min_version, params, moving_average));
  PullResult result = rows;
  result.version = std::min(rows.version, dense.version);
  result.training_done = rows.training_done || dense.training_done;
  return result;
}

absl::StatusOr<ParameterStore::PushResult> HybridStore::Push(const std::vector<Tensor>& grads,
                                                             const ShardHooks* hooks) {
  CHECK(hooks == nullptr) << "HybridStore supports no ShardHooks";
  ASSIGN_OR_RETURN(PushResult dense, dense_->Push(grads));
  absl::StatusOr<PushResult> rows_pushed = tables_->Push(no_params_);
  if (!rows_pushed.ok()) return NotInPlace(rows_pushed.status());
  const PushResult& rows = *rows_pushed;
  PushResult result;
  result.accepted = dense.accepted && rows.accepted;
  result.training_done = dense.training_done || rows.training_done;
  return result;
}

absl::Status HybridStore::LookupRows(SparseFeatures* features) {
  return NotInPlace(tables_->LookupRows(features));
}

absl::Status HybridStore::Shutdown() {
  const absl::Status dense = dense_->Shutdown();
  const absl::Status rows = tables_->Shutdown();
  return rows.ok() ? dense : rows;
}

absl::StatusOr<std::vector<proto::StatusResponse>> HybridStore::GetStatus() {
  ASSIGN_OR_RETURN(std::vector<proto::StatusResponse> statuses, tables_->GetStatus());
  ASSIGN_OR_RETURN(std::vector<proto::StatusResponse> dense, dense_->GetStatus());
  statuses.insert(statuses.end(), dense.begin(), dense.end());
  return statuses;
}

absl::Status HybridStore::Save(int64_t step, int64_t version, int keep, int64_t keep_step) {
  RETURN_IF_ERROR(tables_->Save(step, version, keep, keep_step));
  return dense_->Save(step, version, keep, keep_step);
}

absl::Status HybridStore::Restore(int64_t step, int64_t recovery_epoch) {
  RETURN_IF_ERROR(tables_->Restore(step, recovery_epoch));
  return dense_->Restore(step, recovery_epoch);
}

}  // namespace psrt
