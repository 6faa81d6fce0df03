// CheckpointPolicy: the chief's decisions of when the shards save a
// checkpoint, and of when failed saves stop the job.
//
// A save is due at step 0 (a first checkpoint right away, so that a shard
// that restarts early has one to restore), every save_steps steps and every
// save_secs seconds, never twice at one step. Each save asks the shards to
// keep the newest checkpoint all of them hold, so that saves failing on some
// shards never leave them without a common step. A save that could not be
// written (not one refused because the state moved on, or a shard is
// restarting) counts; max_failed_saves of them in a row stop the job.
//
// Thread safety: not thread-safe; the trainer's thread drives it.
#ifndef PSRT_WORKER_TRAINING_CHECKPOINT_POLICY_H_
#define PSRT_WORKER_TRAINING_CHECKPOINT_POLICY_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/store/parameter_store.h"

namespace psrt {

class CheckpointPolicy {
 public:
  struct Options {
    int64_t save_steps = 0;  // 0: not by steps.
    double save_secs = 0;    // 0: not by time.
    int keep = 5;
    int max_failed_saves = 3;  // 0: never stop.
    bool sync = true;          // Every shard saves at the step's version.
  };
  // REQUIRES: `store` outlives this. No save is due until Start.
  CheckpointPolicy(const Options& options, ParameterStore* store);

  // Training starts: saves are `enabled` when every shard can save; the
  // shards hold checkpoint `newest_common` (-1: none) in common and one of
  // step `saved_step` (-1: none). The clock of save_secs starts now.
  void Start(bool enabled, int64_t newest_common, int64_t saved_step);
  // After a recovery to checkpoint `step`: as Start, but the clock runs on.
  void Recovered(bool enabled, int64_t newest_common, int64_t step);

  bool Due(int64_t step) const;
  // Saves checkpoint `step` now. A failed save is logged, and tried again
  // when the next is due; DataLoss once max_failed_saves saves in a row have
  // not been written.
  absl::Status Save(int64_t step);
  // The last save, at the end of training, unless `step` is saved already.
  // Failures are logged only: the run still counts.
  void SaveAtEnd(int64_t step);

 private:
  // Every shard saves checkpoint `step`; OK or the save's error.
  absl::Status SaveEverywhere(int64_t step);

  const Options options_;
  ParameterStore* const store_;
  bool enabled_ = false;
  absl::Time last_save_time_;
  int64_t last_saved_step_ = -1;
  int64_t newest_common_ = -1;  // Kept by every save.
  int failed_saves_ = 0;        // In a row, not written.
};

}  // namespace psrt

#endif  // PSRT_WORKER_TRAINING_CHECKPOINT_POLICY_H_
