// Trainer: one worker's training loop against the parameter servers.
//
//   pull(v) -> forward/backward on the next batch -> regularize, clip
//   -> push(gradients of v) -> pull(v + 1 in sync mode, the latest in async)
// until the global step reaches train_steps or the chief ends training.
// With overlap_comm the pull runs while the forward pass starts on the
// layers that have arrived, and the push while the backward pass goes on
// (worker/step_pipeline.h); the messages and their order per shard are the
// same.
//
// The chief (replica 0) also:
//  - brings the shards to one consistent state before training: if any
//    shard restored a checkpoint, every shard is restored to the newest step
//    all of them hold; otherwise it initializes the variables;
//  - saves checkpoints every save_checkpoint_steps / _secs (each shard at the
//    same version in sync mode) and at the end;
//  - evaluates every eval_every_steps and at the end (test accuracy and
//    loss, with the moving averages when asked), writes TensorBoard scalars
//    under logdir, prints `final: global_step=N test_accuracy=A`, and ends
//    training on the shards.
// A resumed worker skips the data it consumed before the checkpoint, so a
// sync run with fixed data order resumes exactly.
//
// Faults: when a shard restarts (and restores its last checkpoint) or is
// rolled back, the calls of every worker fail with Aborted; each worker then
// waits for the shards, the chief restores all of them to the newest
// checkpoint they all hold, and every worker pulls and carries on from that
// step. A restarted worker rejoins like a late one: it pulls the current
// version and continues.
//
// Thread safety: not thread-safe; Run() is called once.
#ifndef PSRT_WORKER_TRAINING_TRAINER_H_
#define PSRT_WORKER_TRAINING_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/event_writer.h"
#include "common/metrics.h"
#include "models/model.h"
#include "proto/psrt.pb.h"
#include "worker/input/batch_source.h"
#include "worker/input/idx_dataset.h"
#include "worker/store/parameter_store.h"
#include "worker/training/towers.h"

namespace psrt {

class Timeline;  // common/timeline.h

struct TrainerOptions {
  int replica = 0;       // 0 is the chief; -1 the evaluator.
  int num_replicas = 1;  // Shards of the training set.
  // The chief sends this to the shards; other replicas check that their own
  // mode agrees with the chief's.
  proto::TrainingConfig config;
  int batch_size = 100;
  int64_t train_steps = 1000;
  int log_every_steps = 100;
  bool shuffle = true;
  uint64_t seed = 1;  // Initial values (chief) and data order.
  absl::Duration startup_timeout = absl::Seconds(300);

  // Async mode: run at most this many steps ahead of the slowest replica
  // (0: lockstep); negative: unbounded.
  int staleness = -1;

  // Applied to the gradients before the push.
  float weight_decay = 0;  // L2: loss += wd / 2 * sum(w^2) over weights (rank >= 2).
  float clip_norm = 0;     // Clip by global norm across all gradients; 0: off.

  // Overlap each step's pull with the forward pass and its push with the
  // backward pass, shard by shard (worker/step_pipeline.h). Not with
  // clip_norm, which needs every gradient before the first push.
  bool overlap_comm = true;

  // Chief only.
  int64_t save_checkpoint_steps = 0;  // 0: not by steps.
  double save_checkpoint_secs = 0;    // 0: not by time.
  int keep_checkpoints = 5;           // Saves happen when every shard has a
                                      // checkpoint dir (psrt_ps --checkpoint_dir).
  // Stop with an error once this many saves in a row could not be written
  // (a full or broken disk: the shards keep their last complete checkpoint
  // meanwhile); 0: train on regardless. A save refused because the state
  // moved on (backup workers) or a shard is restarting does not count.
  int max_failed_saves = 3;
  int64_t eval_every_steps = 0;       // 0: only at the end.
  bool eval_moving_average = false;   // Evaluate the moving averages.
  std::string logdir;                 // TensorBoard event files; "": none.
  bool progress_bar = false;          // One redrawn line instead of logs.
  std::string final_params_path;      // Safetensors of the final values.

  // Records compute, push and pull spans per step (common/timeline.h);
  // null: none. REQUIRES: outlives the trainer.
  Timeline* timeline = nullptr;

  // Progress for /metrics and the status RPC: state, steps, examples/sec
  // (common/metrics.h); null: not reported. REQUIRES: outlives the trainer.
  WorkerMetrics* metrics = nullptr;
};

struct TrainResult {
  int64_t global_step = 0;
  int64_t local_steps = 0;
  double test_accuracy = -1;  // Chief only.
};

// Makes this replica's training batch stream from its beginning (the
// trainer Skips to where a resumed run continues). Called at the start and
// after each recovery.
using BatchSourceFactory = std::function<absl::StatusOr<std::unique_ptr<BatchSource>>()>;

class Trainer {
 public:
  // REQUIRES: all pointers outlive the trainer; `test` may be null for
  // replicas other than the chief. Gradients come from the towers (one or
  // more); tower 0 also initializes and evaluates. The training batches are
  // replica r's shard of `train` (examples i % num_replicas == r), shuffled
  // each epoch from seed + 1000 * r.
  Trainer(const TrainerOptions& options, Towers* towers, ParameterStore* client,
          const Dataset* train, const Dataset* test);
  // Training batches from `train_source` instead (image records: see
  // worker/image_pipeline.h), which already holds this replica's shard.
  // The time the steps wait in its NextBatch is logged with each timing
  // line (input_ms) and at the end (as a share of the training time).
  // Each evaluation reads the first `test_examples` examples of a fresh
  // `test_source` (a test set too large to hold decoded in memory).
  // REQUIRES: test_source makes batches of options.batch_size, in the same
  // order each time; it may be empty (test_examples 0) for replicas other
  // than the chief, and train_source for the evaluator.
  Trainer(const TrainerOptions& options, Towers* towers, ParameterStore* client,
          BatchSourceFactory train_source, BatchSourceFactory test_source,
          int64_t test_examples);
  // InvalidArgument, before any RPC, when `train` has no example for this
  // replica (fewer examples than replicas). Says goodbye to the shards
  // (ParameterStore::Shutdown) at the end, except from a chief that failed: its
  // goodbye would end training as if the job were done.
  absl::StatusOr<TrainResult> Run();

  // The "evaluator" task of TF_CONFIG: never trains; every eval_every_steps
  // global steps (default 1000) it pulls the parameters (the moving averages
  // when asked), evaluates them on the test set and writes the results as
  // TensorBoard scalars under logdir/eval; it returns when training ends.
  // REQUIRES: `test` is not null.
  absl::Status RunEvaluator();

 private:
  struct Evaluation {
    double accuracy = 0;
    double loss = 0;
  };
  absl::StatusOr<TrainResult> Train();
  // Chief: bring every shard to one state and confirm it: initialize them
  // (at start, when none holds the model), keep what they hold (all ready,
  // or all restored the same checkpoint), or restore the newest checkpoint
  // all of them hold. `values` initializes; after a fault, shards that lost
  // the model are an error instead.
  absl::Status RecoverOrInitialize(const std::vector<Tensor>& values, bool after_fault);
  // FailedPrecondition naming the shards and their runs when the
  // initialized shards hold states of more than one run.
  absl::Status CheckOneRun(const std::vector<proto::StatusResponse>& shards) const;
  // After an Aborted call (a shard restarted or was rolled back): waits for
  // the shards, has the chief recover them, waits until they are ready and
  // pulls. Sets pulled->training_done if the chief ended training meanwhile.
  absl::Status Recover(const absl::Status& cause, std::vector<Tensor>* params,
                       ParameterStore::PullResult* pulled);
  // Adds weight decay to the gradients of variables [begin, end); returns
  // their L2 loss.
  float WeightDecay(const std::vector<Tensor>& params, std::vector<Tensor>* grads,
                    int begin, int end) const;
  // Scales the gradients down to a global norm of at most clip_norm.
  void ClipGradients(std::vector<Tensor>* grads) const;
  // Every shard saves checkpoint `step`, keeping last_complete_save_ too; on
  // success `step` becomes it. A failure is logged and returned, and counted
  // when a shard could not write.
  absl::Status Save(int64_t step);
  // DataLoss once max_failed_saves saves in a row have not been written
  // (`last`: the latest one's error, at `step`); OK otherwise.
  absl::Status StopAfterFailedSaves(int64_t step, const absl::Status& last) const;
  absl::StatusOr<Evaluation> Evaluate(int64_t step, std::vector<Tensor>* params);
  void Report(int64_t step, double loss, double examples_per_sec, int64_t stale);
  // Where a log interval's steps spent their time, summed over the steps.
  struct StepTime {
    absl::Duration compute;  // Forward, backward and regularization.
    absl::Duration push;
    absl::Duration pull;    // Includes `waited`.
    absl::Duration waited;  // Pulls waiting on the shards for their version.
    absl::Duration input;   // NextBatch: waiting for (or copying) a batch.
  };
  // Logs `step N timing: compute_ms=C exposed_comm_ms=E wait_ms=W ...`, per
  // step: exposed communication is push + pull - waited, the time the worker
  // spends on the wire rather than computing or waiting for the others.
  void ReportTiming(int64_t step, const StepTime& time, int64_t steps);

  const TrainerOptions options_;
  Towers* const towers_;
  Model* const model_;  // Tower 0.
  ParameterStore* const client_;
  const Dataset* const train_;  // Null with a BatchSourceFactory.
  BatchSourceFactory train_source_;
  const Dataset* const test_;  // Or, when null, the stream:
  BatchSourceFactory test_source_;
  int64_t test_examples_ = 0;
  std::unique_ptr<EventWriter> events_;
  std::vector<Tensor> eval_averages_;  // The moving averages evaluated.
  bool checkpoints_ = false;  // Every shard can save.
  absl::Time start_time_;
  int64_t start_step_ = 0;
  int recoveries_ = 0;
  // The newest checkpoint every shard holds (-1: none known): each save asks
  // the shards to keep it, so that saves failing on some shards never leave
  // them without a common step.
  int64_t last_complete_save_ = -1;
  int failed_saves_ = 0;  // Saves in a row not written (see max_failed_saves).
};

}  // namespace psrt

#endif  // PSRT_WORKER_TRAINING_TRAINER_H_
