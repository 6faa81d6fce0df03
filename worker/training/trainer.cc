#include "worker/training/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/random_id.h"
#include "common/training_config.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "common/timeline.h"
#include "glog/logging.h"
#include "worker/training/step_pipeline.h"

namespace psrt {
namespace {

std::string FormatDuration(double secs) {
  const int64_t s = static_cast<int64_t>(secs + 0.5);
  return absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
}

}  // namespace

Trainer::Trainer(const TrainerOptions& options, Towers* towers, ParameterStore* client,
                 const Dataset* train, const Dataset* test)
    : options_(options),
      towers_(towers),
      model_(towers->tower(0)),
      client_(client),
      train_(train),
      test_(test) {
  train_source_ = [this]() -> absl::StatusOr<std::unique_ptr<BatchSource>> {
    return std::make_unique<DatasetBatchSource>(train_, options_.replica,
                                                options_.num_replicas, options_.shuffle,
                                                options_.seed + 1000 * options_.replica);
  };
}

Trainer::Trainer(const TrainerOptions& options, Towers* towers, ParameterStore* client,
                 BatchSourceFactory train_source, BatchSourceFactory test_source,
                 int64_t test_examples)
    : options_(options),
      towers_(towers),
      model_(towers->tower(0)),
      client_(client),
      train_(nullptr),
      train_source_(std::move(train_source)),
      test_(nullptr),
      test_source_(std::move(test_source)),
      test_examples_(test_examples) {}

absl::Status Trainer::CheckOneRun(const std::vector<proto::StatusResponse>& shards) const {
  std::map<std::string, std::vector<std::string>> runs;  // Run id -> shards.
  for (int k = 0; k < static_cast<int>(shards.size()); ++k) {
    if (shards[k].initialized()) runs[shards[k].config().run_id()].push_back(client_->ShardName(k));
  }
  if (runs.size() <= 1) return absl::OkStatus();
  std::vector<std::string> held;
  for (const auto& [run, names] : runs) {
    held.push_back(absl::StrCat(absl::StrJoin(names, ", "), " hold",
                                names.size() == 1 ? "s" : "", " run ",
                                run.empty() ? "(none: an older checkpoint)" : run));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "the parameter servers hold states of different training runs (",
      absl::StrJoin(held, "; "), "), and no checkpoint of one run is held by all of them: "
      "a --checkpoint_dir shared with or left over from another job? Give each job its own "
      "checkpoint directories, or remove the other run's files"));
}

absl::Status Trainer::RecoverOrInitialize(const std::vector<Tensor>& values,
                                          bool after_fault) {
  ASSIGN_OR_RETURN(std::vector<proto::StatusResponse> shards, client_->GetStatus());
  checkpoints_ = std::all_of(shards.begin(), shards.end(),
                             [](const auto& s) { return s.has_checkpoint_dir(); });
  if (!checkpoints_ && !after_fault &&
      (options_.save_checkpoint_steps > 0 || options_.save_checkpoint_secs > 0)) {
    LOG(INFO) << "no checkpoints: not every parameter server has a --checkpoint_dir";
  }
  // This recovery round: newer than any the shards have taken, so that a
  // request of an abandoned round (a Restore still in flight when the chief
  // moved on) is refused wherever it lands late. Each Restore attempt is a
  // round of its own.
  int64_t epoch = 0;
  for (const auto& s : shards) epoch = std::max(epoch, s.recovery_epoch());
  ++epoch;
  // The newest checkpoint every shard holds: kept by every later save.
  std::vector<int64_t> common(shards[0].checkpoint_steps().begin(),
                              shards[0].checkpoint_steps().end());
  for (const auto& s : shards) {
    std::set<int64_t> held(s.checkpoint_steps().begin(), s.checkpoint_steps().end());
    common.erase(std::remove_if(common.begin(), common.end(),
                                [&](int64_t step) { return held.count(step) == 0; }),
                 common.end());
  }
  std::sort(common.rbegin(), common.rend());
  last_complete_save_ = common.empty() ? -1 : common.front();
  std::vector<std::string> empty;  // Shards that hold no model.
  std::set<int64_t> restored;      // Checkpoints restored by unconfirmed shards.
  bool all_ready = true;
  for (int k = 0; k < client_->num_shards(); ++k) {
    all_ready &= shards[k].ready();
    if (!shards[k].initialized()) empty.push_back(client_->ShardName(k));
    if (shards[k].initialized() && !shards[k].ready()) restored.insert(shards[k].restored_step());
  }
  // Init marks initialized shards ready (their state is kept) and
  // initializes the others.
  if (empty.size() == shards.size() && !after_fault) {
    proto::TrainingConfig config = options_.config;
    config.set_run_id(NewRandomHexId());
    RETURN_IF_ERROR(client_->Init(config, values, epoch));
    LOG(INFO) << "chief initialized " << values.size() << " variables on "
              << client_->num_shards() << " shards (run " << config.run_id() << ")";
    return absl::OkStatus();
  }
  std::set<int64_t> versions;
  for (const auto& s : shards) versions.insert(s.version());
  // Sync shards move in lockstep; different versions mean a shard was
  // brought to another state.
  const bool lockstep = options_.config.mode() != proto::SYNC || versions.size() == 1;
  absl::Status one_run = CheckOneRun(shards);
  if (all_ready && lockstep && one_run.ok()) {
    LOG(INFO) << "the parameter servers already hold the model; continuing";
    return client_->Init(options_.config, values, epoch);
  }
  if (empty.empty() && restored.size() == 1 && lockstep && one_run.ok() &&
      std::none_of(shards.begin(), shards.end(), [](const auto& s) { return s.ready(); })) {
    LOG(INFO) << "every parameter server restored checkpoint " << *restored.begin();
    return client_->Init(options_.config, values, epoch);
  }
  // Some shards restarted (or restored another checkpoint, or one of
  // another run, than the others): move all of them to the newest step that
  // all of them hold, of one run.
  for (int64_t step : common) {
    absl::Status status = client_->Restore(step, epoch);
    if (status.ok()) {
      ASSIGN_OR_RETURN(shards, client_->GetStatus());
      status = CheckOneRun(shards);
      if (!status.ok()) one_run = status;
    }
    if (status.ok()) {
      LOG(WARNING) << "the parameter servers held different states; all of them "
                      "now hold checkpoint " << step;
      return client_->Init(options_.config, values, epoch);  // Marks them ready.
    }
    LOG(WARNING) << "cannot restore checkpoint " << step << " everywhere: "
                 << status.message();
    ++epoch;
  }
  if (!one_run.ok()) return one_run;
  if (!empty.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        absl::StrJoin(empty, ", "), " lost the model (restarted without a "
        "checkpoint to restore) and no checkpoint is held by every parameter "
        "server: give every ps task --checkpoint_dir so that a restarted one "
        "can recover"));
  }
  return absl::FailedPreconditionError(
      "the parameter servers hold different states and no checkpoint that "
      "all of them can restore; remove their checkpoint directories (or "
      "restore them) and start again");
}

absl::Status Trainer::Recover(const absl::Status& cause, std::vector<Tensor>* params,
                              ParameterStore::PullResult* pulled) {
  constexpr int kMaxRecoveries = 20;
  if (++recoveries_ > kMaxRecoveries) {
    return absl::Status(cause.code(), absl::StrCat("gave up after ", kMaxRecoveries,
                                                   " recoveries: ", cause.message()));
  }
  LOG(WARNING) << "the parameter servers' state changed (" << cause.message()
               << "); waiting for them to be ready and pulling again";
  const absl::Time start = absl::Now();
  if (options_.metrics != nullptr) options_.metrics->SetState(proto::WORKER_WAITING);
  while (true) {
    RETURN_IF_ERROR(client_->WaitForServers(options_.startup_timeout));
    if (options_.replica == 0) RETURN_IF_ERROR(RecoverOrInitialize(*params, true));
    absl::StatusOr<proto::TrainingConfig> ready =
        client_->WaitForModelReady(options_.startup_timeout);
    if (absl::IsCancelled(ready.status())) {
      pulled->training_done = true;
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(ready.status());
    client_->ForgetIncarnations();  // The confirmed state is the one to train on.
    absl::StatusOr<ParameterStore::PullResult> pull = client_->Pull(0, params);
    if (pull.ok()) {
      *pulled = *pull;
      break;
    }
    // A restart seen only now, or another rollback meanwhile: again.
    if (!absl::IsAborted(pull.status()) || ++recoveries_ > kMaxRecoveries) {
      return pull.status();
    }
    LOG(WARNING) << pull.status().message();
  }
  LOG(WARNING) << "recovered in " << absl::Now() - start
               << ": carrying on at global step " << pulled->version;
  if (options_.metrics != nullptr) options_.metrics->SetState(proto::WORKER_TRAINING);
  return absl::OkStatus();
}

float Trainer::WeightDecay(const std::vector<Tensor>& params, std::vector<Tensor>* grads,
                           int begin, int end) const {
  if (options_.weight_decay <= 0) return 0;
  const float wd = options_.weight_decay;
  double l2 = 0;
  for (int v = begin; v < end; ++v) {
    if (params[v].rank() < 2) continue;  // Weights only, not biases.
    const float* w = params[v].data();
    float* g = (*grads)[v].data();
    double sum = 0;
    for (int64_t i = 0; i < params[v].num_elements(); ++i) {
      sum += double{w[i]} * w[i];
      g[i] += wd * w[i];
    }
    l2 += 0.5 * wd * sum;
  }
  return static_cast<float>(l2);
}

void Trainer::ClipGradients(std::vector<Tensor>* grads) const {
  if (options_.clip_norm <= 0) return;
  double squares = 0;
  for (const Tensor& g : *grads) {
    for (float x : g.flat()) squares += double{x} * x;
  }
  const double norm = std::sqrt(squares);
  if (norm > options_.clip_norm) {
    const float scale = static_cast<float>(options_.clip_norm / norm);
    for (Tensor& g : *grads) {
      for (float& x : g.flat()) x *= scale;
    }
  }
}

absl::Status Trainer::Save(int64_t step) {
  const bool sync = options_.config.mode() == proto::SYNC;
  absl::Status status =
      client_->Save(step, sync ? step : -1, options_.keep_checkpoints, last_complete_save_);
  if (status.ok()) {
    LOG(INFO) << "saved checkpoint " << step;
    last_complete_save_ = step;
    failed_saves_ = 0;
    return status;
  }
  LOG(ERROR) << "checkpoint " << step << " not saved everywhere: " << status.message()
             << "; every shard keeps checkpoint " << last_complete_save_
             << " until a save succeeds everywhere";
  // The state moved on (a backup worker's push), a shard restarted or
  // awaits confirmation: the next save may well succeed. Anything else is
  // the shard failing to write.
  const bool not_written = !absl::IsFailedPrecondition(status) && !absl::IsAborted(status) &&
                           !absl::IsUnavailable(status) && !absl::IsCancelled(status);
  if (not_written) ++failed_saves_;
  return status;
}

absl::Status Trainer::StopAfterFailedSaves(int64_t step, const absl::Status& last) const {
  if (options_.max_failed_saves <= 0 || failed_saves_ < options_.max_failed_saves) {
    return absl::OkStatus();
  }
  return absl::DataLossError(absl::StrCat(
      failed_saves_, " checkpoints in a row could not be written (the last, checkpoint ",
      step, ": ", last.message(), "); stopping rather than training on with nothing "
      "newer than checkpoint ", last_complete_save_, " to recover to (--max_failed_saves=",
      options_.max_failed_saves, "; 0 trains on)"));
}

absl::StatusOr<Trainer::Evaluation> Trainer::Evaluate(int64_t step,
                                                      std::vector<Tensor>* params) {
  // A trainer evaluates the moving averages in a buffer of their own: its
  // parameters are the ones it trains on. The evaluator has no other use
  // for its parameters.
  if (options_.eval_moving_average && options_.replica >= 0) {
    if (eval_averages_.size() != params->size()) {
      eval_averages_.clear();
      for (const Tensor& p : *params) eval_averages_.emplace_back(p.shape());
    }
    ASSIGN_OR_RETURN(auto pulled, client_->Pull(0, &eval_averages_, /*moving_average=*/true,
                                                /*min_clock=*/0, ParameterStore::Precision::kFull));
    (void)pulled;
    params = &eval_averages_;
  }
  const int64_t n = test_ != nullptr ? test_->size() : test_examples_;
  Tensor batch;
  int64_t correct = 0;
  double loss = 0;
  // Batches of the training size: a model keeps buffers for the largest
  // batch it has run (on a GPU, device memory), so a larger evaluation batch
  // would hold that much more for the rest of training.
  const int64_t eval_batch = std::max(options_.batch_size, 1);
  if (test_ != nullptr) {
    const int64_t pixels = test_->images.dim(1);
    for (int64_t begin = 0; begin < n; begin += eval_batch) {
      const int64_t size = std::min(eval_batch, n - begin);
      batch.Resize({size, pixels});
      std::copy_n(test_->images.data() + begin * pixels, size * pixels, batch.data());
      auto labels = absl::MakeConstSpan(test_->labels).subspan(begin, size);
      const Model::Evaluation evaluation = model_->Evaluate(*params, batch, labels);
      correct += evaluation.correct;
      loss += double{evaluation.mean_loss} * size;
    }
  } else if (n > 0) {
    // Streamed: the last batch runs into the next epoch; only its first
    // `size` examples count, as a batch of their own.
    ASSIGN_OR_RETURN(std::unique_ptr<BatchSource> source, test_source_());
    Tensor images;
    std::vector<int32_t> labels;
    for (int64_t begin = 0; begin < n; begin += eval_batch) {
      const int64_t size = std::min(eval_batch, n - begin);
      RETURN_IF_ERROR(source->NextBatch(static_cast<int>(eval_batch), &images, &labels));
      const Tensor* evaluated = &images;
      if (size < eval_batch) {
        const int64_t pixels = images.dim(1);
        batch.Resize({size, pixels});
        std::copy_n(images.data(), size * pixels, batch.data());
        evaluated = &batch;
      }
      const Model::Evaluation evaluation = model_->Evaluate(
          *params, *evaluated, absl::MakeConstSpan(labels).subspan(0, size));
      correct += evaluation.correct;
      loss += double{evaluation.mean_loss} * size;
    }
  }
  Evaluation result;
  result.accuracy = n == 0 ? 0 : static_cast<double>(correct) / n;
  result.loss = n == 0 ? 0 : loss / n;
  LOG(INFO) << absl::StrFormat("eval: step %d, test_accuracy = %.4f, test_loss = %.4f%s",
                               step, result.accuracy, result.loss,
                               options_.eval_moving_average ? " (moving averages)" : "");
  if (events_ != nullptr) {
    RETURN_IF_ERROR(events_->WriteScalar("eval/accuracy", step, result.accuracy));
    RETURN_IF_ERROR(events_->WriteScalar("eval/loss", step, result.loss));
    RETURN_IF_ERROR(events_->Flush());
  }
  return result;
}

void Trainer::ReportTiming(int64_t step, const StepTime& time, int64_t steps) {
  if (options_.progress_bar || steps <= 0) return;
  const auto per_step_ms = [steps](absl::Duration d) {
    return absl::ToDoubleMilliseconds(d) / steps;
  };
  LOG(INFO) << absl::StrFormat(
      "step %d timing: compute_ms=%.2f exposed_comm_ms=%.2f wait_ms=%.2f "
      "(per step; push_ms=%.2f pull_ms=%.2f input_ms=%.2f)",
      step, per_step_ms(time.compute),
      per_step_ms(time.push + time.pull - time.waited), per_step_ms(time.waited),
      per_step_ms(time.push), per_step_ms(time.pull), per_step_ms(time.input));
}

void Trainer::Report(int64_t step, double loss, double examples_per_sec,
                     int64_t stale) {
  const double lr = LearningRateAt(options_.config, step);
  if (events_ != nullptr) {
    absl::Status s = events_->WriteScalar("loss", step, loss);
    if (s.ok()) s = events_->WriteScalar("learning_rate", step, lr);
    if (s.ok()) s = events_->WriteScalar("examples_per_sec", step, examples_per_sec);
    if (s.ok()) s = events_->WriteScalar("stale_gradients_dropped", step, stale);
    if (s.ok()) s = events_->Flush();
    if (!s.ok()) LOG(WARNING) << "summaries: " << s.message();
  }
  if (options_.progress_bar) {
    const double done = static_cast<double>(step - start_step_) /
                        std::max<int64_t>(1, options_.train_steps - start_step_);
    const double elapsed = absl::ToDoubleSeconds(absl::Now() - start_time_);
    const double eta = done > 0 ? elapsed * (1 - done) / done : 0;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(std::min(1.0, done) * kWidth);
    std::fprintf(stderr, "\r[%s%s] step %lld/%lld loss %.4f %.0f ex/s ETA %s ",
                 std::string(filled, '=').c_str(), std::string(kWidth - filled, ' ').c_str(),
                 static_cast<long long>(step), static_cast<long long>(options_.train_steps),
                 loss, examples_per_sec, FormatDuration(eta).c_str());
    std::fflush(stderr);
    return;
  }
  LOG(INFO) << absl::StrFormat("step %d, loss = %.4f (%.1f examples/sec; %.3f sec/batch)",
                               step, loss, examples_per_sec,
                               options_.batch_size / examples_per_sec)
            << (stale > 0 ? absl::StrCat(" [", stale, " stale]") : "");
}

absl::Status Trainer::RunEvaluator() {
  std::vector<Tensor> params;
  model_->Initialize(options_.seed, &params);
  RETURN_IF_ERROR(client_->WaitForServers(options_.startup_timeout));
  RETURN_IF_ERROR(client_->WaitForModelReady(options_.startup_timeout).status());
  if (!options_.logdir.empty()) {
    ASSIGN_OR_RETURN(events_, EventWriter::Open(options_.logdir + "/eval"));
  }
  if (options_.metrics != nullptr) options_.metrics->SetState(proto::WORKER_EVALUATING);
  const int64_t every = options_.eval_every_steps > 0 ? options_.eval_every_steps : 1000;
  int64_t next = 0;
  while (true) {
    absl::StatusOr<ParameterStore::PullResult> pulled =
        client_->Pull(next, &params, options_.eval_moving_average);
    if (!pulled.ok()) {
      if (absl::IsUnavailable(pulled.status())) {
        LOG(INFO) << "the parameter servers are gone: training is over";
        break;
      }
      if (!absl::IsAborted(pulled.status())) return pulled.status();
      LOG(WARNING) << pulled.status().message() << "; waiting for the model";
      absl::Status ready = client_->WaitForModelReady(options_.startup_timeout).status();
      if (absl::IsCancelled(ready)) break;
      RETURN_IF_ERROR(ready);
      next = 0;
      continue;
    }
    RETURN_IF_ERROR(Evaluate(pulled->version, &params).status());
    if (options_.metrics != nullptr) options_.metrics->SetGlobalStep(pulled->version);
    if (pulled->training_done || pulled->version >= options_.train_steps) break;
    next = (pulled->version / every + 1) * every;
  }
  if (events_ != nullptr) RETURN_IF_ERROR(events_->Close());
  return absl::OkStatus();
}

absl::StatusOr<TrainResult> Trainer::Run() {
  absl::StatusOr<TrainResult> result = Train();
  // A replica says goodbye when it stops, and the chief's goodbye ends
  // training. A chief that failed does not: the job is not done, and a
  // restarted chief recovers and carries on (a ps whose chief never comes
  // back exits after its --chief_timeout_secs, failing the job).
  if (result.ok() || options_.replica != 0) client_->Shutdown();
  return result;
}

absl::StatusOr<TrainResult> Trainer::Train() {
  // Replica r reads examples r, r + W, ... (BatchIterator): it needs one.
  if (train_ != nullptr && train_->size() <= options_.replica) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the training data holds ", train_->size(), " examples, too few for ",
        options_.num_replicas, " replicas: replica ", options_.replica, " gets none"));
  }
  const bool chief = options_.replica == 0;
  const bool sync = options_.config.mode() == proto::SYNC;
  std::vector<Tensor> params;
  std::vector<Tensor> grads;
  model_->Initialize(options_.seed, &params);

  RETURN_IF_ERROR(client_->WaitForServers(options_.startup_timeout));
  if (chief) {
    RETURN_IF_ERROR(RecoverOrInitialize(params, /*after_fault=*/false));
    if (!options_.logdir.empty()) {
      ASSIGN_OR_RETURN(events_, EventWriter::Open(options_.logdir));
    }
  }
  absl::StatusOr<proto::TrainingConfig> ready =
      client_->WaitForModelReady(options_.startup_timeout);
  if (absl::IsCancelled(ready.status())) {
    LOG(INFO) << ready.status().message() << "; nothing to do";
    return TrainResult();
  }
  RETURN_IF_ERROR(ready.status());
  const proto::TrainingConfig& chief_config = *ready;
  if (chief_config.mode() != options_.config.mode() ||
      chief_config.num_replicas() != options_.config.num_replicas()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this worker runs ", proto::SyncMode_Name(options_.config.mode()),
        " with ", options_.config.num_replicas(), " replicas but the chief chose ",
        proto::SyncMode_Name(chief_config.mode()), " with ",
        chief_config.num_replicas(), " (give every worker the same flags)"));
  }

  ASSIGN_OR_RETURN(ParameterStore::PullResult pulled, client_->Pull(0, &params));
  start_step_ = pulled.version;
  start_time_ = absl::Now();
  if (options_.metrics != nullptr) {
    options_.metrics->SetGlobalStep(pulled.version);
    options_.metrics->SetState(proto::WORKER_TRAINING);
  }
  // This replica's data, positioned after what it consumed before global
  // step `version`: one batch per step (sync), or about 1/W of the steps
  // (async). A resumed or recovered sync run thus sees the same data as an
  // uninterrupted one.
  auto data_from_step =
      [&](int64_t version) -> absl::StatusOr<std::unique_ptr<BatchSource>> {
    ASSIGN_OR_RETURN(std::unique_ptr<BatchSource> batches, train_source_());
    const int64_t steps = sync ? version : version / options_.num_replicas;
    RETURN_IF_ERROR(batches->Skip(steps * options_.batch_size));
    return batches;
  };
  ASSIGN_OR_RETURN(std::unique_ptr<BatchSource> batches, data_from_step(pulled.version));
  if (pulled.version > 0) LOG(INFO) << "resuming at global step " << pulled.version;

  Tensor images;
  std::vector<int32_t> labels;
  TrainResult result;
  absl::Time interval_start = absl::Now();
  absl::Time last_save = absl::Now();
  // A first checkpoint right away, so that a parameter server that restarts
  // early has one to restore; a resumed run has one at its step already.
  int64_t last_saved_step = pulled.version > 0 ? pulled.version : -1;
  int64_t last_eval_step = pulled.version;
  int64_t interval_steps = 0;
  double interval_loss = 0;
  StepTime interval_time;
  absl::Duration total_input;  // For the share of input waits at the end.
  // The next batch into images and labels, timed: input waits show.
  auto next_batch = [&]() -> absl::Status {
    const absl::Time start = absl::Now();
    absl::Status status = batches->NextBatch(options_.batch_size, &images, &labels);
    const absl::Duration took = absl::Now() - start;
    interval_time.input += took;
    total_input += took;
    return status;
  };
  int64_t stale = 0;
  int64_t clock_base = 0;  // Local steps before the shards' clocks restarted.
  // The shards' state was replaced (a restart or a rollback): wait for them,
  // pull, and carry on. Any other error ends training.
  auto recover_or_fail = [&](const absl::Status& status) -> absl::Status {
    if (!absl::IsAborted(status)) return status;
    RETURN_IF_ERROR(Recover(status, &params, &pulled));
    ASSIGN_OR_RETURN(batches, data_from_step(pulled.version));
    clock_base = result.local_steps;
    // The shards hold a checkpoint of this step (the next ones are saved
    // again on schedule).
    last_saved_step = pulled.version;
    last_eval_step = std::min(last_eval_step, pulled.version);
    return absl::OkStatus();
  };
  // The chief's duties between steps, due at global step `version`, and
  // the end of training.
  auto save_due = [&](int64_t version) {
    return chief && checkpoints_ && version > last_saved_step &&
           (version == 0 ||
            (options_.save_checkpoint_steps > 0 &&
             version % options_.save_checkpoint_steps == 0) ||
            (options_.save_checkpoint_secs > 0 &&
             absl::Now() - last_save >= absl::Seconds(options_.save_checkpoint_secs)));
  };
  auto eval_due = [&](int64_t version) {
    return chief && options_.eval_every_steps > 0 &&
           version >= last_eval_step + options_.eval_every_steps;
  };
  auto finished = [&](const ParameterStore::PullResult& p) {
    return p.training_done || p.version >= options_.train_steps;
  };
  const int num_variables = static_cast<int>(params.size());
  std::optional<StepPipeline> pipeline;
  if (options_.overlap_comm && options_.clip_norm <= 0) {
    pipeline.emplace(client_, client_->placement(), num_variables);
  }
  // Whether `grads` and `loss` already hold the gradients of the next batch
  // at `pulled`: computed while it was being pulled (and maybe pushed).
  bool computed = false;
  float loss = 0;
  while (!finished(pulled)) {
    // A push that left during the backward pass was cleared of duties.
    const bool pushing = pipeline.has_value() && pipeline->push_started();
    if (!pushing && save_due(pulled.version)) {
      last_save = absl::Now();  // A failed save is tried again at the next one.
      absl::Status saved = Save(pulled.version);
      if (saved.ok()) last_saved_step = pulled.version;
      RETURN_IF_ERROR(StopAfterFailedSaves(pulled.version, saved));
    }
    if (!pushing && eval_due(pulled.version)) {
      absl::Status evaluated = Evaluate(pulled.version, &params).status();
      if (!evaluated.ok()) {
        computed = false;
        RETURN_IF_ERROR(recover_or_fail(evaluated));
        continue;
      }
      last_eval_step = pulled.version;
    }
    if (!computed) {
      RETURN_IF_ERROR(next_batch());
      const absl::Time compute_start = absl::Now();
      Timeline::Span span(options_.timeline, "compute", "step", pulled.version);
      loss = towers_->ComputeGradients(params, images, labels, &grads);
      loss += WeightDecay(params, &grads, 0, num_variables);
      ClipGradients(&grads);
      interval_time.compute += absl::Now() - compute_start;
    }
    computed = false;
    if (!std::isfinite(loss)) {  // Never pushed: the gate saw the loss.
      return absl::InternalError(absl::StrCat(
          "loss became ", loss, " at step ", pulled.version,
          " (learning rate too high?)"));
    }
    const absl::Time push_start = absl::Now();
    absl::StatusOr<ParameterStore::PushResult> pushed;
    {
      Timeline::Span span(options_.timeline, pushing ? "push (rest)" : "push", "step",
                          pulled.version);
      pushed = pushing ? pipeline->FinishPush() : client_->Push(grads);
    }
    interval_time.push += absl::Now() - push_start;
    if (!pushed.ok()) {
      RETURN_IF_ERROR(recover_or_fail(pushed.status()));
      continue;
    }
    if (!pushed->accepted) ++stale;
    ++result.local_steps;
    ++interval_steps;
    interval_loss += loss;
    const int64_t min_version = sync ? pulled.version + 1 : 0;
    const int64_t min_clock = !sync && options_.staleness >= 0
                                  ? result.local_steps - clock_base - options_.staleness
                                  : 0;
    absl::StatusOr<ParameterStore::PullResult> next;
    if (pipeline.has_value()) {
      // The next step computes as its parameters arrive, and pushes as its
      // gradients are done unless a duty or the end comes first.
      // The batch first: a failed one ends training before a pull starts.
      RETURN_IF_ERROR(next_batch());
      const absl::Time start = absl::Now();
      pipeline->StartPull(min_version, &params, min_clock);
      float l2 = 0;
      bool loss_finite = true;
      bool push_decided = false;
      StepHooks hooks;
      hooks.before_read = [&](int begin, int end) { pipeline->WaitForVariables(begin, end); };
      hooks.loss_ready = [&](float forward_loss) { loss_finite = std::isfinite(forward_loss); };
      hooks.gradients_ready = [&](int begin, int end) {
        l2 += WeightDecay(params, &grads, begin, end);
        if (!push_decided) {
          // The step's push leaves during the backward pass unless it is one
          // the loop must stop or wait before: a failed pull, a non-finite
          // loss, the end of training, a checkpoint or an evaluation due.
          push_decided = true;
          absl::StatusOr<ParameterStore::PullResult> arrived = pipeline->WaitForPull();
          if (arrived.ok()) arrived->training_done |= pushed->training_done;
          if (arrived.ok() && loss_finite && !finished(*arrived) &&
              !save_due(arrived->version) && !eval_due(arrived->version)) {
            pipeline->StartPush(&grads);
          }
        }
        pipeline->MarkReady(begin, end);
      };
      {
        Timeline::Span span(options_.timeline, "compute", "step", pulled.version + 1);
        loss = towers_->ComputeGradients(params, images, labels, &grads, hooks) + l2;
      }
      next = pipeline->WaitForPull();
      const absl::Duration blocked = pipeline->TakeBlockedTime();
      interval_time.compute += absl::Now() - start - blocked;
      interval_time.pull += blocked;
      computed = next.ok();
    } else {
      const absl::Time pull_start = absl::Now();
      Timeline::Span span(options_.timeline, "pull", "step", pulled.version);
      next = client_->Pull(min_version, &params, /*moving_average=*/false, min_clock);
      interval_time.pull += absl::Now() - pull_start;
    }
    if (!next.ok()) {
      RETURN_IF_ERROR(recover_or_fail(next.status()));
      continue;
    }
    pulled = *next;
    interval_time.waited += pulled.waited;
    recoveries_ = 0;  // A step went through: the budget is for a run of faults.
    if (pushed->training_done) pulled.training_done = true;
    if (options_.metrics != nullptr) {
      options_.metrics->RecordStep(pulled.version, options_.batch_size);
    }

    if (result.local_steps % options_.log_every_steps == 0) {
      const double secs = absl::ToDoubleSeconds(absl::Now() - interval_start);
      if (chief || !options_.progress_bar) {
        Report(pulled.version, interval_loss / interval_steps,
               options_.batch_size * interval_steps / secs, stale);
        ReportTiming(pulled.version, interval_time, interval_steps);
      }
      interval_start = absl::Now();
      interval_steps = 0;
      interval_loss = 0;
      interval_time = StepTime();
    }
  }
  if (options_.progress_bar && chief) std::fputc('\n', stderr);
  result.global_step = pulled.version;
  LOG(INFO) << "replica " << options_.replica << " finished: "
            << result.local_steps << " local steps, global step "
            << result.global_step << ", " << stale << " stale pushes";
  if (train_ == nullptr) {  // Decoded input: did the steps wait for it?
    const absl::Duration total = absl::Now() - start_time_;
    LOG(INFO) << absl::StrFormat(
        "input wait %.1f%% of step time (%.2f s of %.2f s in NextBatch)",
        100 * absl::ToDoubleSeconds(total_input) /
            std::max(1e-9, absl::ToDoubleSeconds(total)),
        absl::ToDoubleSeconds(total_input), absl::ToDoubleSeconds(total));
  }

  if (chief) {
    if (checkpoints_ && result.global_step > last_saved_step) {
      Save(result.global_step).IgnoreError();  // Logged; the run still counts.
    }
    if (client_->wire_dtype() != proto::DT_FLOAT) {
      // The model as the shards hold it, not as the wire rounded it.
      ASSIGN_OR_RETURN(auto full, client_->Pull(0, &params, /*moving_average=*/false,
                                                /*min_clock=*/0, ParameterStore::Precision::kFull));
      (void)full;
    }
    ASSIGN_OR_RETURN(Evaluation final_eval, Evaluate(result.global_step, &params));
    result.test_accuracy = final_eval.accuracy;
    if (!options_.final_params_path.empty()) {
      std::vector<NamedTensor> named;
      for (size_t i = 0; i < params.size(); ++i) {
        named.emplace_back(model_->variables()[i].name, &params[i]);
      }
      RETURN_IF_ERROR(WriteSafetensors(
          options_.final_params_path, named,
          {{"global_step", absl::StrCat(result.global_step)}}));
    }
    if (events_ != nullptr) RETURN_IF_ERROR(events_->Close());
    std::printf("final: global_step=%lld test_accuracy=%.4f\n",
                static_cast<long long>(result.global_step), result.test_accuracy);
    std::fflush(stdout);
  }
  return result;
}

}  // namespace psrt
