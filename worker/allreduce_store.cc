#include "worker/allreduce_store.h"

#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/byte_source.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "kernels/elementwise.h"

namespace psrt {
namespace {

ParameterShard::Options ShardOptions(const AllreduceStore::Options& options) {
  ParameterShard::Options shard;
  shard.checkpoint_dir = options.checkpoint_dir;
  // The chief resumes from its newest checkpoint; the others restore the one
  // it resumed from (WaitForModelReady).
  shard.restore_at_start = options.collective->rank() == 0 && !options.checkpoint_dir.empty();
  return shard;
}

// One shard holding every variable, whole.
Placement WholeModel(const std::vector<VariableDef>& variables) {
  PlacementOptions options;
  options.partition_threshold_bytes = int64_t{1} << 62;
  absl::StatusOr<Placement> placement = ComputePlacement(variables, 1, options);
  CHECK(placement.ok()) << placement.status();
  return *std::move(placement);
}

// What the chief tells the others in WaitForModelReady.
struct ChiefState {
  int64_t restored_step = -1;  // The checkpoint it resumed from; -1: none.
};

}  // namespace

AllreduceStore::AllreduceStore(Options options, std::vector<VariableDef> variables)
    : options_(std::move(options)),
      variables_(std::move(variables)),
      placement_(WholeModel(variables_)),
      shard_(ShardOptions(options_)) {
  CHECK(options_.collective != nullptr);
  int64_t elements = 0;
  for (const VariableSlice& slice : placement_.slices) {
    elements += slice.num_bytes / static_cast<int64_t>(sizeof(float));
    proto::VariableMeta* meta = push_header_.add_variables();
    meta->set_name(slice.name);
    meta->set_dtype(proto::DT_FLOAT);
    for (int64_t d : slice.shape) meta->add_shape(d);
  }
  flat_ = Tensor({elements});
  std::random_device device;
  push_header_.set_worker_incarnation(static_cast<int64_t>((uint64_t{device()} << 31) ^ device()) | 1);
}

std::string AllreduceStore::ShardName(int /*shard*/) const {
  return absl::StrCat("worker/", rank(), "'s own parameters (allreduce mode)");
}

proto::TrainingConfig AllreduceStore::ShardConfig(proto::TrainingConfig config) const {
  config.set_replicas_to_aggregate(1);
  return config;
}

void AllreduceStore::Flatten(const std::vector<Tensor>& tensors) {
  char* out = reinterpret_cast<char*>(flat_.data());
  for (const VariableSlice& slice : placement_.slices) {
    std::memcpy(out, reinterpret_cast<const char*>(tensors[slice.variable].data()) +
                         slice.byte_offset,
                slice.num_bytes);
    out += slice.num_bytes;
  }
}

absl::Status AllreduceStore::InitShard(const proto::TrainingConfig& config) {
  proto::InitHeader header;
  *header.mutable_config() = config;
  *header.mutable_variables() = push_header_.variables();
  SpanByteSource values(
      absl::Span<const char>(reinterpret_cast<const char*>(flat_.data()), flat_.num_bytes()));
  return shard_.Init(header, &values).status();
}

absl::Status AllreduceStore::WaitForServers(absl::Duration /*timeout*/) {
  // The other workers are waited for by the first collective op.
  if (rank() == 0 && shard_.GetStatus().restoring()) return shard_.RestoreLatest();
  return absl::OkStatus();
}

absl::Status AllreduceStore::Init(const proto::TrainingConfig& config,
                                  const std::vector<Tensor>& params,
                                  int64_t /*recovery_epoch*/) {
  Flatten(params);
  return InitShard(ShardConfig(config));
}

absl::StatusOr<proto::TrainingConfig> AllreduceStore::WaitForModelReady(
    absl::Duration /*timeout*/) {
  ChiefState chief;
  if (rank() == 0) {
    const proto::StatusResponse status = shard_.GetStatus();
    if (!status.initialized() || !status.ready()) {
      return absl::FailedPreconditionError(
          "allreduce mode: the chief's parameters are not initialized");
    }
    if (status.version() > 0) chief.restored_step = status.restored_step();
    if (status.version() > 0 && chief.restored_step < 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "allreduce mode: the chief is at global step ", status.version(),
          " without a checkpoint the other workers could restore"));
    }
  }
  RETURN_IF_ERROR(options_.collective->Broadcast(
      {reinterpret_cast<char*>(&chief), sizeof(chief)}, /*root=*/0));
  if (chief.restored_step < 0) {  // A fresh start: the chief's initial values.
    if (rank() == 0) {
      std::vector<Tensor> values;
      for (const VariableDef& v : variables_) values.emplace_back(v.shape);
      RETURN_IF_ERROR(Pull(0, &values).status());
      Flatten(values);
    }
    RETURN_IF_ERROR(options_.collective->Broadcast(
        {reinterpret_cast<char*>(flat_.data()), flat_.num_bytes()}, /*root=*/0));
    if (rank() != 0) RETURN_IF_ERROR(InitShard(ShardConfig(options_.config)));
  } else if (rank() != 0) {
    absl::Status restored = shard_.Restore(chief.restored_step);
    if (!restored.ok()) {
      return absl::Status(restored.code(), absl::StrCat(
          "allreduce mode: the chief resumed from checkpoint ", chief.restored_step,
          ", which worker/", rank(), " cannot restore from --checkpoint_dir=\"",
          options_.checkpoint_dir, "\" (every worker must read the chief's checkpoint "
          "directory: one host, or a shared volume): ", restored.message()));
    }
    RETURN_IF_ERROR(InitShard(ShardConfig(options_.config)));  // Confirms it.
  }
  return options_.config;
}

absl::StatusOr<ParameterStore::PullResult> AllreduceStore::Pull(
    int64_t min_version, std::vector<Tensor>* params, bool moving_average,
    int64_t /*min_clock*/, Precision /*precision*/, const ShardHooks* /*hooks*/) {
  ParameterShard::PullOptions options;
  options.min_version = min_version;
  options.moving_average = moving_average;
  options.replica = rank();
  options.deadline = absl::Now() + options_.pull_timeout;
  absl::Notification done;
  absl::StatusOr<ParameterShard::PullReply> reply;
  shard_.Pull(options, [&](absl::StatusOr<ParameterShard::PullReply> r) {
    reply = std::move(r);
    done.Notify();
  });
  done.WaitForNotification();
  RETURN_IF_ERROR(reply.status());
  const char* in = reinterpret_cast<const char*>(reply->snapshot->values.data());
  for (const VariableSlice& slice : placement_.slices) {
    std::memcpy(reinterpret_cast<char*>((*params)[slice.variable].data()) + slice.byte_offset,
                in, slice.num_bytes);
    in += slice.num_bytes;
  }
  PullResult result;
  result.version = version_ = reply->header.version();
  result.training_done = reply->header.training_done();
  return result;
}

absl::StatusOr<ParameterStore::PushResult> AllreduceStore::Push(const std::vector<Tensor>& grads,
                                                                const ShardHooks* /*hooks*/) {
  Flatten(grads);
  RETURN_IF_ERROR(options_.collective->AllreduceSum(flat_.flat()));
  kernels::Scale(1.0f / options_.collective->size(), flat_.flat());
  push_header_.set_version(version_);
  push_header_.set_step(push_header_.step() + 1);
  SpanByteSource mean(
      absl::Span<const char>(reinterpret_cast<const char*>(flat_.data()), flat_.num_bytes()));
  ASSIGN_OR_RETURN(proto::PushResponse response, shard_.Push(push_header_, &mean));
  PushResult result;
  result.accepted = response.accepted();
  result.training_done = response.training_done();
  return result;
}

void AllreduceStore::Shutdown() { shard_.Shutdown(rank()); }

absl::StatusOr<std::vector<proto::StatusResponse>> AllreduceStore::GetStatus() {
  return std::vector<proto::StatusResponse>{shard_.GetStatus()};
}

absl::Status AllreduceStore::Save(int64_t step, int64_t version, int keep, int64_t keep_step) {
  return shard_.Save(step, version, keep, keep_step).status();
}

absl::Status AllreduceStore::Restore(int64_t step, int64_t recovery_epoch) {
  return shard_.Restore(step, recovery_epoch);
}

}  // namespace psrt
