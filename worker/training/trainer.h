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
// Sparse (CTR) models (Model::tables()): each batch's categorical ids come
// from the batch source (BatchSource::sparse_ids); the next batch is read
// before the pull, which brings the rows of its distinct ids with the dense
// values, and the push sends their gradient rows with the dense gradients
// (ParameterStore::SetSparseFeatures); the step does not overlap its pull and
// push with compute. The chief evaluates test AUC and logloss (the rows of
// each test batch looked up as they are), logs them, writes them to
// TensorBoard (eval/auc, eval/loss) and prints
// `final: global_step=N test_auc=A test_logloss=L`.
//
// Elastic workers (options.membership): a worker joins before its first
// pull, from the version the chief admits it at; the chief admits and
// waits for --min_workers before each step; a worker asked to drain
// finishes its step's push, leaves, and returns (TrainResult.drained).
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
#include <optional>
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
#include "worker/training/checkpoint_policy.h"
#include "worker/training/cluster_recovery.h"
#include "worker/training/elastic_membership.h"
#include "worker/training/progress.h"
#include "worker/training/step_pipeline.h"
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
  // The chief's initial values in place of random ones from `seed`
  // (--init_from_keras_weights), in the model's variables() order; called
  // once, by the chief, as training starts. Empty: random. A checkpoint
  // that the shards restore wins over both.
  std::function<absl::StatusOr<std::vector<Tensor>>()> initial_values;
  absl::Duration startup_timeout = absl::Seconds(300);
  // After a fault, how long the shards are waited for (a ps that went away
  // and does not come back): then the step fails, naming the ps.
  absl::Duration ps_wait = absl::Seconds(180);

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

  // Elastic workers (config.max_workers > 0): the chief's list of members,
  // or this worker's calls to it (worker/training/elastic_membership.h);
  // null otherwise. Every replica then reads the whole training set (of a
  // Dataset; streamed inputs stay split num_replicas ways), in an order of
  // its own. REQUIRES: outlives the trainer.
  ElasticMembership* membership = nullptr;

  // Progress for /metrics and the status RPC: state, steps, examples/sec
  // (common/metrics.h); null: not reported. REQUIRES: outlives the trainer.
  WorkerMetrics* metrics = nullptr;
};

struct TrainResult {
  int64_t global_step = 0;
  int64_t local_steps = 0;
  double test_accuracy = -1;  // Chief only.
  double test_auc = -1;       // Chief only, sparse models.
  double test_logloss = -1;   // Chief only, sparse models.
  bool drained = false;       // Left an elastic job before its end.
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
    double auc = -1;  // Sparse (binary) models.
  };
  bool chief() const { return options_.replica == 0; }
  bool elastic() const { return options_.config.max_workers() > 0; }
  absl::StatusOr<TrainResult> Train();
  // Waits for the shards (the chief brings them to one state), checks the
  // chief's config, pulls, and positions the data. False: the chief had
  // ended training already, nothing to do.
  absl::StatusOr<bool> Start();
  // One step: the chief's duties due, then compute (unless done while
  // pulling), push, pull the next parameters. An Aborted call recovers
  // (RecoverOrFail); any other error ends training.
  absl::Status Step();
  // The overlapped step's pull, while the next batch computes on the
  // variables as they arrive and its push leaves during the backward pass
  // unless the loop must stop or wait first (`training_done`: the push said so).
  absl::StatusOr<ParameterStore::PullResult> ComputeWhilePulling(int64_t min_version,
                                                                 int64_t min_clock,
                                                                 bool training_done);
  // The chief's end of training: the last checkpoint, the final evaluation
  // and parameters, `final: ...` on stdout.
  absl::Status FinishAsChief();
  // This replica's data, positioned after what it consumed before global
  // step `version`: one batch per step (sync), or about 1/W of the steps
  // (async). A resumed or recovered sync run thus sees the same data as an
  // uninterrupted one.
  absl::Status DataFromStep(int64_t version);
  // The next batch into images_ and labels_ (and a sparse model's ids into
  // features_), timed: input waits show.
  absl::Status NextBatch();
  // After a failed call: the shards' state was replaced (Aborted: a restart
  // or a rollback): waits for them, pulls, and carries on. Any other error
  // is returned: it ends training.
  absl::Status RecoverOrFail(const absl::Status& status);
  bool Finished(const ParameterStore::PullResult& pulled) const;
  bool EvalDue(int64_t version) const;
  // Adds weight decay to the gradients of variables [begin, end); returns
  // their L2 loss.
  float WeightDecay(const std::vector<Tensor>& params, std::vector<Tensor>* grads,
                    int begin, int end) const;
  // Scales the gradients (and a sparse model's rows' gradients) down to a
  // global norm of at most clip_norm.
  void ClipGradients(std::vector<Tensor>* grads);
  absl::StatusOr<Evaluation> Evaluate(int64_t step, std::vector<Tensor>* params);

  const TrainerOptions options_;
  Towers* const towers_;
  Model* const model_;  // Tower 0.
  ParameterStore* const client_;
  const Dataset* train_ = nullptr;  // Null with a BatchSourceFactory.
  BatchSourceFactory train_source_;
  BatchSourceFactory test_source_;  // A Dataset's is made by the constructor.
  int64_t test_examples_ = 0;
  std::unique_ptr<EventWriter> events_;
  std::vector<Tensor> eval_averages_;  // The moving averages evaluated.
  ClusterRecovery recovery_;
  CheckpointPolicy checkpoints_;  // The chief's.
  Progress progress_;

  // The training loop's state.
  std::vector<Tensor> params_;
  std::vector<Tensor> grads_;
  ParameterStore::PullResult pulled_;  // The parameters the next step computes on.
  std::unique_ptr<BatchSource> batches_;
  Tensor images_;
  std::vector<int32_t> labels_;
  std::optional<StepPipeline> pipeline_;  // With overlap_comm.
  // Whether grads_ and loss_ already hold the gradients of the next batch
  // at pulled_: computed while it was being pulled (and maybe pushed).
  bool computed_ = false;
  // Sparse models: the batch's ids and rows (the store's, between a pull
  // and the push), and an evaluation's.
  const bool sparse_;
  SparseFeatures features_;
  SparseFeatures eval_features_;
  // Sparse models: images_, labels_ and features_ hold the next batch, its
  // rows pulled with the parameters.
  bool batch_pulled_ = false;
  float loss_ = 0;
  TrainResult result_;
  int64_t stale_ = 0;
  int64_t clock_base_ = 0;  // Local steps before the shards' clocks restarted.
  int64_t last_eval_step_ = 0;
};

}  // namespace psrt

#endif  // PSRT_WORKER_TRAINING_TRAINER_H_
