// AllreduceStore: the ParameterStore of allreduce mode (psrt_worker
// --mode=allreduce, or a cluster spec without a "ps" job), as Horovod runs
// data-parallel training: no parameter servers; every worker keeps the whole
// model and applies every step itself.
//
// The model lives in a ParameterShard of the worker's own (ps/
// parameter_shard.h, one shard holding every variable), so that the
// optimizers, moving averages and checkpoint files are the parameter
// servers' own: a checkpoint is a one-shard ps checkpoint
// (model.ckpt-N.ps-0-of-1.safetensors), which export_checkpoint.sh reads and
// a ps job could resume. A push sums the workers' gradients with the ring
// (worker/ring/collective.h), divides by the number of workers and applies
// the mean straight to the local shard (ParameterShard::ApplyGradient: the
// optimizer, moving averages and version, no copy), so every worker
// computes the same update from the same bits; a pull reads the shard's
// values back (ParameterShard::Read) without waiting. The gradients
// are reduced in fusion groups (Options::fusion_bytes), so that the
// trainer's overlap_comm reduces each group while the backward pass goes on
// (Horovod's tensor fusion). The ParameterStore interface calls its parts
// shards: here placement()'s "shard" k, ShardHooks' and ShardName's, is
// fusion group k (all of them held by the one local ParameterShard).
//
// Worker 0 is the chief (initialization, evaluation, checkpoints,
// TensorBoard). WaitForModelReady brings every worker to the chief's state:
// its training config (so that every worker's optimizer and schedule are
// the chief's) and its initial values, broadcast; or, when the chief resumed from a
// checkpoint, that checkpoint, which every worker restores from its own
// checkpoint_dir (every worker must read the chief's checkpoint directory:
// one host, or a volume they share).
//
// Faults: a worker that dies or hangs fails the others' next push within
// the Collective's timeout, with an error naming it; the job then restarts
// (the launcher's restart policy, or Kubernetes) and resumes from the last
// checkpoint.
//
// Elastic workers (Options::elastic, --max_workers): the ring follows the
// chief's lists of members (worker/ring/elastic_ring.h, which the chief's
// membership registry and the others' membership calls tell). A push on
// a ring whose list is no longer the newest fails with Aborted, and so does
// one whose ring broke when a newer list comes within a lease of it (a
// member died: the chief drops it after its lease); Regroup then joins the
// newest ring, and its members carry on from the newest state one of them
// holds (Horovod Elastic's reset from the last commit: a step is
// committed once any member applied it, since the ring gives every member
// the same sum): they tell each other their versions with an allreduce,
// and the first member at the newest one broadcasts its whole state
// (values, optimizer slots, moving averages, version, config). A worker
// that joins regroups in WaitForModelReady and gets the model so; no
// checkpoint is read. A chief that restarts restores its checkpoint, but
// the survivors' newer state wins when they regroup with it.
//
// Thread safety: not thread-safe (ParameterStore).
#ifndef PSRT_WORKER_STORE_ALLREDUCE_STORE_H_
#define PSRT_WORKER_STORE_ALLREDUCE_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/timeline.h"
#include "ps/parameter_shard.h"
#include "worker/ring/collective.h"
#include "worker/ring/elastic_ring.h"
#include "worker/store/parameter_store.h"

namespace psrt {

class AllreduceStore final : public ParameterStore {
 public:
  struct Options {
    // This worker's rank is collective->rank(). REQUIRES: outlives the store.
    Collective* collective = nullptr;
    // Instead of `collective`: an elastic job's rings, this worker replica
    // elastic->replica(). REQUIRES: outlives the store.
    ElasticRing* elastic = nullptr;
    // Elastic: how long a push whose ring broke waits for a newer list
    // before it fails (the chief's lease, plus its members' call period),
    // and how long Regroup may take.
    absl::Duration membership_wait = absl::Seconds(10);
    absl::Duration regroup_timeout = absl::Seconds(300);
    std::string checkpoint_dir;  // Empty: no checkpoints.
    // Tensor fusion: the gradients are reduced in groups of consecutive
    // variables of at most this many bytes (a larger variable alone), each
    // as soon as the backward pass has finished it (with the trainer's
    // overlap_comm), last layers first.
    int64_t fusion_bytes = int64_t{4} << 20;
    // Records fusion and apply spans; null: none. REQUIRES: outlives the
    // store.
    Timeline* timeline = nullptr;
  };
  AllreduceStore(Options options, std::vector<VariableDef> variables);

  absl::Status WaitForServers(absl::Duration timeout) override;
  absl::Status Init(const proto::TrainingConfig& config, const std::vector<Tensor>& params,
                    int64_t recovery_epoch = 0) override;
  absl::StatusOr<proto::TrainingConfig> WaitForModelReady(absl::Duration timeout) override;
  absl::StatusOr<PullResult> Pull(int64_t min_version, std::vector<Tensor>* params,
                                  bool moving_average = false, int64_t min_clock = 0,
                                  Precision precision = Precision::kWire,
                                  const ShardHooks* hooks = nullptr) override;
  // Averages `grads` with every worker's (a collective op: every worker
  // pushes at every step) and applies the mean.
  absl::StatusOr<PushResult> Push(const std::vector<Tensor>& grads,
                                  const ShardHooks* hooks = nullptr) override;
  absl::Status Shutdown() override;
  // The local shard's status, once for each fusion group.
  absl::StatusOr<std::vector<proto::StatusResponse>> GetStatus() override;
  absl::Status Save(int64_t step, int64_t version, int keep, int64_t keep_step = -1) override;
  absl::Status Restore(int64_t step, int64_t recovery_epoch) override;
  void ForgetIncarnations() override {}
  bool regroups() const override { return options_.elastic != nullptr; }
  absl::Status Regroup() override;

  const Placement& placement() const override { return placement_; }
  proto::DataType wire_dtype() const override { return proto::DT_FLOAT; }
  // The same name for every fusion group: this worker's own parameters.
  std::string ShardName(int group) const override;

 private:
  // The shard's config: the job's, with every version taking one push (the
  // workers' mean).
  proto::TrainingConfig ShardConfig(proto::TrainingConfig config) const;
  // Initializes the local shard with `config` and the values in flat_ (or
  // confirms the state it restored), in recovery round `recovery_epoch`.
  absl::Status InitShard(const proto::TrainingConfig& config, int64_t recovery_epoch = 0);
  // Copies `tensors` (one per variable) into flat_, back to back: those of
  // fusion group `group`, or all of them (-1).
  void Flatten(const std::vector<Tensor>& tensors, int group);
  // The ring of the moment (elastic: null before the first Regroup).
  Collective* ring() const {
    return options_.elastic != nullptr ? options_.elastic->ring() : options_.collective;
  }
  // This worker's replica index (its rank in a fixed ring).
  int replica() const;
  // Elastic: every member's state is the newest one's (see the header
  // comment). REQUIRES: the ring was joined.
  absl::Status SyncState();
  // What becomes of a ring op's failure `status`: Aborted when a newer
  // list of members comes within membership_wait (elastic), else itself.
  absl::Status RingFailure(absl::Status status) const;
  int num_groups() const { return placement_.num_shards; }

  const Options options_;
  const std::vector<VariableDef> variables_;
  const Placement placement_;  // Its shards are the fusion groups.
  ParameterShard shard_;
  Tensor flat_;  // Every variable back to back: pushes and broadcasts.
  std::vector<int64_t> group_start_;  // Fusion group k's first element in flat_.
  // The shard's variables (the slices of placement_), for its Init.
  google::protobuf::RepeatedPtrField<proto::VariableMeta> variable_metas_;
  int64_t version_ = 0;  // Last pulled.
};

}  // namespace psrt

#endif  // PSRT_WORKER_STORE_ALLREDUCE_STORE_H_
