// ClusterRecovery: the protocol that brings the parameter-server shards to
// one consistent state, at start and after a fault.
//
// Protocol. The chief (RecoverOrInitialize) reads every shard's status and
//  - initializes the variables when no shard holds a model (at start only);
//  - keeps what the shards hold when all are ready (or all restored the same
//    checkpoint by themselves) at one version, of one run;
//  - otherwise restores every shard to the newest checkpoint all of them
//    hold, of one run, in a recovery round (epoch) newer than any a shard
//    has taken, so that a late request of an abandoned round is refused;
// and confirms the state (Init). Shards that lost the model with no common
// checkpoint, or hold states of different runs, are FailedPrecondition.
// When a call fails with Aborted (a shard restarted or was rolled back),
// every worker calls Recover: it waits for the shards, has the chief
// recover them, waits until the model is ready and pulls, at most
// kMaxRecoveries times in a row (StepDone resets the count).
//
// Thread safety: not thread-safe; the trainer's thread drives it, and uses
// the store only while no call of it runs.
#ifndef PSRT_WORKER_TRAINING_CLUSTER_RECOVERY_H_
#define PSRT_WORKER_TRAINING_CLUSTER_RECOVERY_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "common/tensor.h"
#include "proto/psrt.pb.h"
#include "worker/store/parameter_store.h"

namespace psrt {

class ClusterRecovery {
 public:
  struct Options {
    bool chief = false;
    proto::TrainingConfig config;  // What the chief confirms on the shards.
    bool wants_checkpoints = false;  // Only to say why there are none.
    // Each wait for the shards after a fault (psrt_worker --ps_wait_secs).
    absl::Duration timeout = absl::Seconds(180);
    WorkerMetrics* metrics = nullptr;  // State while recovering; may be null.
  };
  static constexpr int kMaxRecoveries = 20;

  // REQUIRES: `store` outlives this.
  ClusterRecovery(const Options& options, ParameterStore* store);

  // Chief: brings every shard to one state and confirms it (see Protocol).
  // `values` initializes; after a fault, shards that lost the model are an
  // error instead.
  absl::Status RecoverOrInitialize(const std::vector<Tensor>& values, bool after_fault);
  // After an Aborted `cause`: waits for the shards, has the chief recover
  // them, waits until they are ready and pulls into `params`. Sets
  // pulled->training_done if the chief ended training meanwhile.
  absl::Status Recover(const absl::Status& cause, std::vector<Tensor>* params,
                       ParameterStore::PullResult* pulled);
  // A step went through: the recovery budget is for a run of faults.
  void StepDone() { recoveries_ = 0; }

  // As of the chief's last RecoverOrInitialize: whether every shard can
  // save, and the newest checkpoint every shard holds (-1: none).
  bool checkpoints() const { return checkpoints_; }
  int64_t newest_common_checkpoint() const { return newest_common_checkpoint_; }

 private:
  // FailedPrecondition naming the shards and their runs when the
  // initialized shards hold states of more than one run.
  absl::Status CheckOneRun(const std::vector<proto::StatusResponse>& shards) const;

  const Options options_;
  ParameterStore* const store_;
  int recoveries_ = 0;
  bool checkpoints_ = false;
  int64_t newest_common_checkpoint_ = -1;
};

}  // namespace psrt

#endif  // PSRT_WORKER_TRAINING_CLUSTER_RECOVERY_H_
