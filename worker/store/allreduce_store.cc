#include "worker/store/allreduce_store.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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
  const int replica =
      options.elastic != nullptr ? options.elastic->replica() : options.collective->rank();
  shard.restore_at_start = replica == 0 && !options.checkpoint_dir.empty();
  return shard;
}

// The fusion groups as a placement: every variable whole, in groups of
// consecutive variables of at most `fusion_bytes` (a larger variable alone),
// formed from the last variable back, the order in which a backward pass
// finishes them; group 0 holds the first variables.
Placement FusionGroups(const std::vector<VariableDef>& variables, int64_t fusion_bytes) {
  std::vector<int> group_from_end(variables.size());
  int groups = 0;
  int64_t bytes = 0;
  for (int v = static_cast<int>(variables.size()) - 1; v >= 0; --v) {
    const int64_t n = NumElements(variables[v].shape) * static_cast<int64_t>(sizeof(float));
    if (groups == 0 || (bytes > 0 && bytes + n > fusion_bytes)) {
      ++groups;
      bytes = 0;
    }
    bytes += n;
    group_from_end[v] = groups - 1;
  }
  Placement placement;
  placement.num_shards = std::max(groups, 1);  // A shard of the placement per group.
  placement.shard_slices.resize(placement.num_shards);
  for (size_t v = 0; v < variables.size(); ++v) {
    VariableSlice slice;
    slice.name = variables[v].name;
    slice.variable = static_cast<int>(v);
    slice.shape = variables[v].shape;
    slice.num_bytes = NumElements(variables[v].shape) * static_cast<int64_t>(sizeof(float));
    slice.shard = groups - 1 - group_from_end[v];
    placement.shard_slices[slice.shard].push_back(static_cast<int>(placement.slices.size()));
    placement.slices.push_back(std::move(slice));
  }
  return placement;
}

// What the chief tells the others in WaitForModelReady, before its config.
struct ChiefState {
  int64_t restored_step = -1;  // The checkpoint it resumed from; -1: none.
  int64_t config_bytes = 0;    // Its TrainingConfig's serialized size.
};

}  // namespace

AllreduceStore::AllreduceStore(Options options, std::vector<VariableDef> variables)
    : options_(std::move(options)),
      variables_(std::move(variables)),
      placement_(FusionGroups(variables_, options_.fusion_bytes)),
      shard_(ShardOptions(options_)) {
  CHECK((options_.collective != nullptr) != (options_.elastic != nullptr));
  int64_t elements = 0;
  for (const VariableSlice& slice : placement_.slices) {
    elements += slice.num_bytes / static_cast<int64_t>(sizeof(float));
    proto::VariableMeta* meta = variable_metas_.Add();
    meta->set_name(slice.name);
    meta->set_dtype(proto::DT_FLOAT);
    for (int64_t d : slice.shape) meta->add_shape(d);
  }
  flat_ = Tensor({elements});
  // Group k is flat_[group_start_[k], group_start_[k + 1]).
  group_start_.assign(num_groups() + 1, 0);
  for (const VariableSlice& slice : placement_.slices) {
    group_start_[slice.shard + 1] += slice.num_bytes / static_cast<int64_t>(sizeof(float));
  }
  for (int group = 0; group < num_groups(); ++group) {
    group_start_[group + 1] += group_start_[group];
  }
  LOG(INFO) << "allreduce: " << flat_.num_bytes() << " bytes of gradients in "
            << num_groups() << " fusion groups of at most " << options_.fusion_bytes
            << " bytes (a larger variable alone)";
}

int AllreduceStore::replica() const {
  return options_.elastic != nullptr ? options_.elastic->replica() : options_.collective->rank();
}

std::string AllreduceStore::ShardName(int /*group*/) const {
  return absl::StrCat("worker/", replica(), "'s own parameters (allreduce mode)");
}

proto::TrainingConfig AllreduceStore::ShardConfig(proto::TrainingConfig config) const {
  config.set_replicas_to_aggregate(1);
  return config;
}

void AllreduceStore::Flatten(const std::vector<Tensor>& tensors, int group) {
  float* out = flat_.data();
  int64_t at = 0;
  for (const VariableSlice& slice : placement_.slices) {
    const int64_t n = slice.num_bytes / static_cast<int64_t>(sizeof(float));
    if (group < 0 || slice.shard == group) {
      std::memcpy(out + at, tensors[slice.variable].data(), slice.num_bytes);
    }
    at += n;
  }
}

absl::Status AllreduceStore::InitShard(const proto::TrainingConfig& config,
                                       int64_t recovery_epoch) {
  proto::InitHeader header;
  *header.mutable_config() = config;
  header.set_recovery_epoch(recovery_epoch);
  *header.mutable_variables() = variable_metas_;
  SpanByteSource values(
      absl::Span<const char>(reinterpret_cast<const char*>(flat_.data()), flat_.num_bytes()));
  return shard_.Init(header, &values).status();
}

absl::Status AllreduceStore::WaitForServers(absl::Duration /*timeout*/) {
  if (replica() == 0 && shard_.GetStatus().restoring()) RETURN_IF_ERROR(shard_.RestoreLatest());
  // Elastic: the ring is joined when the members are known (Regroup).
  if (options_.elastic != nullptr) return absl::OkStatus();
  // Every worker is up, and each reaches the next one, before any model
  // state moves.
  return options_.collective->Join();
}

absl::Status AllreduceStore::Init(const proto::TrainingConfig& config,
                                  const std::vector<Tensor>& params,
                                  int64_t recovery_epoch) {
  Flatten(params, /*group=*/-1);
  // In the round of a Restore before it (HybridStore's recovery), which
  // the shard refuses an older one after.
  return InitShard(ShardConfig(config), recovery_epoch);
}

absl::StatusOr<proto::TrainingConfig> AllreduceStore::WaitForModelReady(
    absl::Duration /*timeout*/) {
  if (options_.elastic != nullptr) {
    // The chief's initialized (or restored) model reaches every member.
    RETURN_IF_ERROR(Regroup());
    return shard_.GetStatus().config();
  }
  ChiefState chief;
  std::string config;  // The chief's, serialized.
  const int rank = options_.collective->rank();
  if (rank == 0) {
    const proto::StatusResponse status = shard_.GetStatus();
    config = status.config().SerializeAsString();
    chief.config_bytes = static_cast<int64_t>(config.size());
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
  // Every worker applies the chief's config (its learning-rate schedule
  // counts epochs in the chief's steps), whatever its own flags and data
  // give: the same update everywhere.
  config.resize(chief.config_bytes);
  RETURN_IF_ERROR(options_.collective->Broadcast(absl::MakeSpan(config), /*root=*/0));
  proto::TrainingConfig chief_config;
  if (!chief_config.ParseFromString(config)) {
    return absl::InternalError("allreduce mode: the chief's training config does not parse");
  }
  if (chief.restored_step < 0) {  // A fresh start: the chief's initial values.
    if (rank == 0) {
      std::vector<Tensor> values;
      for (const VariableDef& v : variables_) values.emplace_back(v.shape);
      RETURN_IF_ERROR(Pull(0, &values).status());
      Flatten(values, /*group=*/-1);
    }
    RETURN_IF_ERROR(options_.collective->Broadcast(
        {reinterpret_cast<char*>(flat_.data()), flat_.num_bytes()}, /*root=*/0));
    if (rank != 0) RETURN_IF_ERROR(InitShard(chief_config));
  } else if (rank != 0) {
    absl::Status restored = shard_.Restore(chief.restored_step);
    if (!restored.ok()) {
      return absl::Status(restored.code(), absl::StrCat(
          "allreduce mode: the chief resumed from checkpoint ", chief.restored_step,
          ", which worker/", rank, " cannot restore from --checkpoint_dir=\"",
          options_.checkpoint_dir, "\" (every worker must read the chief's checkpoint "
          "directory: one host, or a shared volume): ", restored.message()));
    }
    RETURN_IF_ERROR(InitShard(chief_config));  // Confirms it.
  }
  return chief_config;
}

absl::StatusOr<ParameterStore::PullResult> AllreduceStore::Pull(
    int64_t min_version, std::vector<Tensor>* params, bool moving_average,
    int64_t /*min_clock*/, Precision /*precision*/, const ShardHooks* hooks) {
  // The local model is at the newest version already: Push applied it.
  ASSIGN_OR_RETURN(const ParameterShard::PullReply reply, shard_.Read(moving_average));
  if (reply.header.version() < min_version && !reply.header.training_done()) {
    return absl::InternalError(absl::StrCat("allreduce: the local model is at version ",
                                            reply.header.version(), ", below the ",
                                            min_version, " asked for"));
  }
  const char* in = reinterpret_cast<const char*>(reply.snapshot->values.data());
  for (const VariableSlice& slice : placement_.slices) {
    std::memcpy(reinterpret_cast<char*>((*params)[slice.variable].data()) + slice.byte_offset,
                in, slice.num_bytes);
    in += slice.num_bytes;
  }
  if (hooks != nullptr && hooks->arrived) {
    for (int group = 0; group < num_groups(); ++group) hooks->arrived(group);
  }
  PullResult result;
  result.version = version_ = reply.header.version();
  result.training_done = reply.header.training_done();
  return result;
}

absl::StatusOr<ParameterStore::PushResult> AllreduceStore::Push(const std::vector<Tensor>& grads,
                                                                const ShardHooks* hooks) {
  // Elastic: a ring whose list is not the newest takes no step.
  if (options_.elastic != nullptr && options_.elastic->stale()) {
    return absl::AbortedError("allreduce: the elastic job's members changed: the workers regroup");
  }
  Collective* const ring = this->ring();
  // Every worker reduces the groups in this order, last layers first,
  // whatever `hooks` asks: each group as soon as its gradients are final.
  for (int group = num_groups() - 1; group >= 0; --group) {
    if (hooks != nullptr && hooks->wait_until_ready) RETURN_IF_ERROR(hooks->wait_until_ready(group));
    {
      Timeline::Span fusion(options_.timeline, "fusion", "allreduce", version_);
      Flatten(grads, group);
    }
    const absl::Status reduced = ring->AllreduceSum(flat_.flat().subspan(
        group_start_[group], group_start_[group + 1] - group_start_[group]));
    if (!reduced.ok()) return RingFailure(reduced);
  }
  Timeline::Span apply(options_.timeline, "apply", "allreduce", version_);
  kernels::Scale(1.0f / ring->size(), flat_.flat());
  // The mean goes straight into the optimizer: no push, no copy.
  ASSIGN_OR_RETURN(const proto::PushResponse response, shard_.ApplyGradient(flat_.flat()));
  PushResult result;
  result.accepted = response.accepted();
  result.training_done = response.training_done();
  return result;
}

absl::Status AllreduceStore::Shutdown() {
  shard_.Shutdown(replica());
  return absl::OkStatus();
}

absl::Status AllreduceStore::RingFailure(absl::Status status) const {
  if (options_.elastic == nullptr || absl::IsAborted(status)) return status;
  // A member that died breaks the ring before the chief's lease drops it:
  // a newer list coming soon says so.
  const absl::Time deadline = absl::Now() + options_.membership_wait;
  while (!options_.elastic->stale() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  if (!options_.elastic->stale()) return status;
  return absl::AbortedError(
      absl::StrCat("the elastic job's members changed: ", status.message()));
}

absl::Status AllreduceStore::Regroup() {
  if (options_.elastic == nullptr) return ParameterStore::Regroup();
  const absl::Time deadline = absl::Now() + options_.regroup_timeout;
  while (true) {
    absl::Status status = options_.elastic->Regroup(deadline - absl::Now());
    if (status.ok()) status = SyncState();
    if (status.ok()) return absl::OkStatus();
    // A ring that broke (a member died) waits for the list without it.
    status = RingFailure(status);
    if (!absl::IsAborted(status) || absl::Now() >= deadline) return status;
    LOG(INFO) << status.message() << "; regrouping again";
  }
}

absl::Status AllreduceStore::SyncState() {
  Collective& ring = *this->ring();
  const int w = ring.size();
  // Each member's version + 1 (0: it holds no model yet), exactly: floats
  // carry 24 bits, so each count travels as three 21-bit parts.
  constexpr int kParts = 3;
  constexpr int kPartBits = 21;
  const proto::StatusResponse status = shard_.GetStatus();
  const int64_t mine = status.initialized() && status.ready() ? status.version() + 1 : 0;
  std::vector<float> parts(static_cast<size_t>(kParts) * w, 0.0f);
  for (int k = 0; k < kParts; ++k) {
    parts[ring.rank() * kParts + k] =
        static_cast<float>((mine >> (kPartBits * k)) & ((int64_t{1} << kPartBits) - 1));
  }
  RETURN_IF_ERROR(ring.AllreduceSum(absl::MakeSpan(parts)));
  std::vector<int64_t> held(w, 0);
  int root = 0;
  for (int r = 0; r < w; ++r) {
    for (int k = 0; k < kParts; ++k) {
      held[r] |= static_cast<int64_t>(parts[r * kParts + k]) << (kPartBits * k);
    }
    if (held[r] > held[root]) root = r;
  }
  if (held[root] == 0) {
    return absl::FailedPreconditionError("allreduce: no member of the ring holds the model");
  }
  const int64_t version = held[root] - 1;
  const ElasticRing::Members& members = options_.elastic->members();
  const std::string ring_of = absl::StrCat("allreduce: the ring of list ",
                                           ListNumber(members.generation),
                                           " (worker replicas ",
                                           absl::StrJoin(members.replicas, ", "), ")");
  if (std::all_of(held.begin(), held.end(), [&](int64_t v) { return v == held[root]; })) {
    LOG(INFO) << ring_of << " carries on at global step " << version
              << " (every member holds it)";
    return absl::OkStatus();
  }
  // The root's state, whole: its description, then its tensors.
  proto::ReplicaState state;
  std::string data;
  if (ring.rank() == root) RETURN_IF_ERROR(shard_.ExportState(&state, &data));
  std::string described = state.SerializeAsString();
  int64_t sizes[2] = {static_cast<int64_t>(described.size()), static_cast<int64_t>(data.size())};
  RETURN_IF_ERROR(ring.Broadcast({reinterpret_cast<char*>(sizes), sizeof(sizes)}, root));
  described.resize(sizes[0]);
  data.resize(sizes[1]);
  RETURN_IF_ERROR(ring.Broadcast(absl::MakeSpan(described), root));
  RETURN_IF_ERROR(ring.Broadcast(absl::MakeSpan(data), root));
  if (ring.rank() != root) {
    if (!state.ParseFromString(described)) {
      return absl::InternalError("allreduce: a member's state does not parse");
    }
    SpanByteSource bytes(absl::Span<const char>(data.data(), data.size()));
    RETURN_IF_ERROR(shard_.ImportState(state, &bytes));
  }
  LOG(INFO) << ring_of << " carries on at global step " << version
            << " from the state of worker replica " << members.replicas[root];
  return absl::OkStatus();
}

absl::StatusOr<std::vector<proto::StatusResponse>> AllreduceStore::GetStatus() {
  // Every fusion group (a shard of placement()) is held by the one local
  // ParameterShard.
  return std::vector<proto::StatusResponse>(num_groups(), shard_.GetStatus());
}

absl::Status AllreduceStore::Save(int64_t step, int64_t version, int keep, int64_t keep_step) {
  return shard_.Save(step, version, keep, keep_step).status();
}

absl::Status AllreduceStore::Restore(int64_t step, int64_t recovery_epoch) {
  return shard_.Restore(step, recovery_epoch);
}

}  // namespace psrt
