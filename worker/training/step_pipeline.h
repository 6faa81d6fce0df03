// StepPipeline: overlaps a worker's pull and push with its forward and
// backward pass, shard by shard, as P3 and BytePS schedule them.
//
// The pull of a step runs on the pipeline's own thread while the model
// computes; the model's before_read hook (models/model.h) waits in
// WaitForVariables only until the shards holding those variables have
// arrived, so the first layers compute while the later layers' shards are
// still on the wire. If the caller decides to push the step's gradients
// (StartPush), each shard's push leaves as soon as MarkReady has named all
// of its variables: the last layers' shards go out while the backward pass
// works on the first layers. The messages are the ones PsClient sends
// anyway (one push per shard and step), so sync exactness and retry
// semantics are PsClient's. How much overlaps depends on the placement:
// with common/placement.h's kPrioritized (the default) and kContiguous a
// shard holds neighbouring layers.
//
// Thread safety: one caller thread (the trainer's, and the model's hooks
// on it) drives the pipeline; PsClient calls run on the pipeline's thread,
// one at a time, and the caller may use the client itself only while the
// pipeline is idle (no pull started and not waited for, no push started
// and not finished).
#ifndef PSRT_WORKER_TRAINING_STEP_PIPELINE_H_
#define PSRT_WORKER_TRAINING_STEP_PIPELINE_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/placement.h"
#include "common/task_runner.h"
#include "common/tensor.h"
#include "worker/store/parameter_store.h"

namespace psrt {

class StepPipeline {
 public:
  // REQUIRES: `client` outlives the pipeline; `placement` is the client's.
  StepPipeline(ParameterStore* client, const Placement& placement, int num_variables);
  // Waits for the call running, if any (a push still waiting for gradients
  // is abandoned, as AbandonPush does).
  ~StepPipeline();
  StepPipeline(const StepPipeline&) = delete;
  StepPipeline& operator=(const StepPipeline&) = delete;

  // Starts ParameterStore::Pull(min_version, params, ..., min_clock) on the
  // pipeline's thread. REQUIRES: the pipeline is idle.
  void StartPull(int64_t min_version, std::vector<Tensor>* params, int64_t min_clock);
  // Blocks until every shard holding a slice of variables [begin, end) has
  // arrived in the parameters, or the pull has ended (after a failed pull
  // some shards may have arrived and others not: the caller discards the
  // step).
  void WaitForVariables(int begin, int end);
  // Blocks until the pull has ended, and returns its outcome.
  absl::StatusOr<ParameterStore::PullResult> WaitForPull();

  // Starts ParameterStore::Push(*grads) on the pipeline's thread; a shard is sent
  // once MarkReady has named all its variables, the shards in the order
  // a backward pass completes them (the highest first variable first).
  // REQUIRES: WaitForPull returned OK; `grads` stays until FinishPush.
  void StartPush(const std::vector<Tensor>* grads);
  // The gradients of [begin, end) are final (no effect before StartPush).
  void MarkReady(int begin, int end);
  // Marks every variable ready, waits for the push and returns its outcome.
  absl::StatusOr<ParameterStore::PushResult> FinishPush();
  // The step's gradients will never be final (a device fault): no shard
  // not yet sent is sent, and the push ends with Aborted. Call FinishPush
  // after it to wait for that end. No effect before StartPush.
  void AbandonPush();
  bool push_started() const { return push_started_; }

  // The time the caller spent blocked in WaitForVariables since the last
  // call: the pull's share of the step that compute did not hide.
  absl::Duration TakeBlockedTime();

 private:
  ParameterStore* const client_;
  // Per variable: the shards holding a slice of it.
  std::vector<std::vector<int>> variable_shards_;
  // Per shard: how many distinct variables it holds.
  std::vector<int> shard_variables_;
  ParameterStore::ShardHooks push_hooks_;  // Its order is fixed at construction.
  ParameterStore::ShardHooks pull_hooks_;
  bool push_started_ = false;  // Caller's thread only.
  absl::Duration blocked_;     // Caller's thread only.

  absl::Mutex mu_;
  std::vector<bool> arrived_ ABSL_GUARDED_BY(mu_);       // Per shard.
  std::optional<absl::StatusOr<ParameterStore::PullResult>> pull_result_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> variable_ready_ ABSL_GUARDED_BY(mu_);
  std::vector<int> shard_pending_ ABSL_GUARDED_BY(mu_);  // Variables not ready.
  bool push_abandoned_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::StatusOr<ParameterStore::PushResult>> push_result_ ABSL_GUARDED_BY(mu_);

  TaskRunner thread_{1};  // Last: destroyed (joined) first.
};

}  // namespace psrt

#endif  // PSRT_WORKER_TRAINING_STEP_PIPELINE_H_
