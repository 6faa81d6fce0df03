#include "worker/training/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/binary_classification.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "common/timeline.h"
#include "glog/logging.h"
#include "kernels/elementwise.h"
#include "worker/input/prefetching_batch_source.h"

namespace psrt {
namespace {

ClusterRecovery::Options RecoveryOptions(const TrainerOptions& options) {
  ClusterRecovery::Options recovery;
  recovery.chief = options.replica == 0;
  recovery.config = options.config;
  recovery.wants_checkpoints =
      options.save_checkpoint_steps > 0 || options.save_checkpoint_secs > 0;
  recovery.timeout = options.ps_wait;
  recovery.metrics = options.metrics;
  return recovery;
}

CheckpointPolicy::Options PolicyOptions(const TrainerOptions& options) {
  CheckpointPolicy::Options policy;
  policy.save_steps = options.save_checkpoint_steps;
  policy.save_secs = options.save_checkpoint_secs;
  policy.keep = options.keep_checkpoints;
  policy.max_failed_saves = options.max_failed_saves;
  policy.sync = options.config.mode() == proto::SYNC;
  return policy;
}

// The categorical ids of the first `used` examples of the source's last
// batch (of `made` examples) into `features`, deduplicated, with a rows and
// a gradients tensor per table of `model`.
absl::Status ReadIds(const BatchSource& source, int64_t made, int64_t used, const Model& model,
                     SparseFeatures* features) {
  const absl::Span<const uint64_t> ids = source.sparse_ids();
  if (made <= 0 || ids.empty() || ids.size() % made != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the input gives ", ids.size(), " categorical ids for a batch of ", made,
        " examples: a sparse model reads categorical input (--data_format=criteo)"));
  }
  features->num_fields = static_cast<int>(ids.size() / made);
  features->ids.assign(ids.begin(), ids.begin() + used * features->num_fields);
  kernels::Deduplicate(features->ids, &features->unique);
  const std::vector<TableDef>& tables = model.tables();
  features->rows.resize(tables.size());
  features->grads.resize(tables.size());
  const int64_t unique = static_cast<int64_t>(features->unique.unique.size());
  for (size_t t = 0; t < tables.size(); ++t) {
    features->rows[t].Resize({unique, tables[t].dim});
    features->grads[t].Resize({unique, tables[t].dim});
  }
  return absl::OkStatus();
}

Progress::Options ProgressOptions(const TrainerOptions& options) {
  Progress::Options progress;
  progress.batch_size = options.batch_size;
  progress.train_steps = options.train_steps;
  progress.log_every_steps = options.log_every_steps;
  progress.progress_bar = options.progress_bar;
  progress.chief = options.replica == 0;
  progress.config = options.config;
  return progress;
}

}  // namespace

Trainer::Trainer(const TrainerOptions& options, Towers* towers, ParameterStore* client,
                 const Dataset* train, const Dataset* test)
    : Trainer(options, towers, client, nullptr, nullptr, test != nullptr ? test->size() : 0) {
  train_ = train;
  // Batches made while the step before computes, where the device reads
  // them fastest.
  train_source_ = [this]() -> absl::StatusOr<std::unique_ptr<BatchSource>> {
    return std::make_unique<PrefetchingBatchSource>(
        std::make_unique<DatasetBatchSource>(
            train_, elastic() ? 0 : options_.replica, elastic() ? 1 : options_.num_replicas,
            options_.shuffle, options_.seed + 1000 * options_.replica),
        towers_->input_allocator());
  };
  // The test set in order, streamed like any other.
  test_source_ = [test]() -> absl::StatusOr<std::unique_ptr<BatchSource>> {
    return std::make_unique<DatasetBatchSource>(test, 0, 1, /*shuffle=*/false, 0);
  };
}

Trainer::Trainer(const TrainerOptions& options, Towers* towers, ParameterStore* client,
                 BatchSourceFactory train_source, BatchSourceFactory test_source,
                 int64_t test_examples)
    : options_(options),
      towers_(towers),
      model_(towers->tower(0)),
      client_(client),
      train_source_(std::move(train_source)),
      test_source_(std::move(test_source)),
      test_examples_(test_examples),
      recovery_(RecoveryOptions(options), client),
      checkpoints_(PolicyOptions(options), client),
      progress_(ProgressOptions(options)),
      sparse_(!model_->tables().empty()) {}

float Trainer::WeightDecay(const std::vector<Tensor>& params, std::vector<Tensor>* grads,
                           int begin, int end) const {
  if (options_.weight_decay <= 0) return 0;
  double l2 = 0;
  for (int v = begin; v < end; ++v) {
    if (params[v].rank() < 2) continue;  // Weights only, not biases.
    l2 += kernels::WeightDecay(options_.weight_decay, params[v].flat(), (*grads)[v].flat());
  }
  return static_cast<float>(l2);
}

void Trainer::ClipGradients(std::vector<Tensor>* grads) {
  if (options_.clip_norm <= 0) return;
  std::vector<absl::Span<float>> tensors;
  for (size_t v = 0; v < grads->size(); ++v) {
    // A moving statistic's "gradient" is its new value: not clipped.
    if (!IsMovingStatistic(model_->variables()[v].name)) tensors.push_back((*grads)[v].flat());
  }
  // A sparse model's rows count in the global norm, as tf.clip_by_global_norm
  // counts IndexedSlices.
  if (sparse_) {
    for (Tensor& g : features_.grads) tensors.push_back(g.flat());
  }
  kernels::ClipByGlobalNorm(options_.clip_norm, tensors);
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
    // (A sparse model's rows come with each test batch, not with these.)
    ASSIGN_OR_RETURN(auto pulled, client_->Pull(0, &eval_averages_, /*moving_average=*/true,
                                                /*min_clock=*/0, ParameterStore::Precision::kFull));
    (void)pulled;
    params = &eval_averages_;
  }
  const int64_t n = test_examples_;
  int64_t correct = 0;
  double loss = 0;
  std::vector<float> probabilities;  // Sparse (binary) models: for AUC.
  std::vector<int32_t> all_labels;
  // Batches of the training size: a model keeps buffers for the largest
  // batch it has run (on a GPU, device memory), so a larger evaluation batch
  // would hold that much more for the rest of training. The last batch runs
  // into the next epoch; only its first `size` examples count, as a batch
  // of their own.
  const int64_t eval_batch = std::max(options_.batch_size, 1);
  if (n > 0) {
    ASSIGN_OR_RETURN(std::unique_ptr<BatchSource> source, test_source_());
    Tensor images;
    Tensor batch;
    std::vector<int32_t> labels;
    for (int64_t begin = 0; begin < n; begin += eval_batch) {
      const int64_t size = std::min(eval_batch, n - begin);
      RETURN_IF_ERROR(source->NextBatch(static_cast<int>(eval_batch), &images, &labels));
      if (sparse_) {
        RETURN_IF_ERROR(ReadIds(*source, eval_batch, size, *model_, &eval_features_));
        RETURN_IF_ERROR(client_->LookupRows(&eval_features_));
        model_->SetSparseFeatures(&eval_features_);
      }
      const Tensor* evaluated = &images;
      if (size < eval_batch) {
        const int64_t pixels = images.dim(1);
        batch.Resize({size, pixels});
        std::copy_n(images.data(), size * pixels, batch.data());
        evaluated = &batch;
      }
      const Model::Evaluation evaluation = model_->Evaluate(
          *params, *evaluated, absl::MakeConstSpan(labels).subspan(0, size));
      RETURN_IF_ERROR(model_->status());
      correct += evaluation.correct;
      loss += double{evaluation.mean_loss} * size;
      if (sparse_) {
        probabilities.insert(probabilities.end(), evaluation.probabilities.begin(),
                             evaluation.probabilities.begin() + size);
        all_labels.insert(all_labels.end(), labels.begin(), labels.begin() + size);
      }
    }
  }
  if (sparse_) model_->SetSparseFeatures(&features_);
  Evaluation result;
  result.accuracy = n == 0 ? 0 : static_cast<double>(correct) / n;
  result.loss = n == 0 ? 0 : loss / n;
  if (sparse_) {
    result.auc = RocAuc(probabilities, all_labels);
    result.loss = LogLoss(probabilities, all_labels);
  }
  LOG(INFO) << absl::StrFormat("eval: step %d, %stest_accuracy = %.4f, test_loss = %.4f%s", step,
                               sparse_ ? absl::StrFormat("test_auc = %.4f, ", result.auc) : "",
                               result.accuracy, result.loss,
                               options_.eval_moving_average ? " (moving averages)" : "");
  if (events_ != nullptr) {
    if (sparse_) RETURN_IF_ERROR(events_->WriteScalar("eval/auc", step, result.auc));
    RETURN_IF_ERROR(events_->WriteScalar("eval/accuracy", step, result.accuracy));
    RETURN_IF_ERROR(events_->WriteScalar("eval/loss", step, result.loss));
    RETURN_IF_ERROR(events_->Flush());
  }
  return result;
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
  if (result.ok() || options_.replica != 0) {
    const absl::Status goodbye = client_->Shutdown();
    LOG_IF(WARNING, !goodbye.ok()) << "goodbye not delivered everywhere: " << goodbye.message();
  }
  return result;
}

absl::StatusOr<bool> Trainer::Start() {
  RETURN_IF_ERROR(client_->WaitForServers(options_.startup_timeout));
  if (chief()) {
    RETURN_IF_ERROR(recovery_.RecoverOrInitialize(params_, /*after_fault=*/false));
    if (!options_.logdir.empty()) {
      ASSIGN_OR_RETURN(events_, EventWriter::Open(options_.logdir));
    }
  }
  // An elastic ring's members are the chief's to say: a worker joins
  // before its ring can be built.
  int64_t first_version = 0;
  const bool joined_first = options_.membership != nullptr && client_->regroups();
  if (joined_first) {
    // Its ring hands it the newest state, whatever version it was admitted at.
    RETURN_IF_ERROR(options_.membership->Join().status());
  }
  absl::StatusOr<proto::TrainingConfig> ready =
      client_->WaitForModelReady(options_.startup_timeout);
  if (absl::IsCancelled(ready.status())) {
    LOG(INFO) << ready.status().message() << "; nothing to do";
    return false;
  }
  RETURN_IF_ERROR(ready.status());
  const proto::TrainingConfig& chief_config = *ready;
  if (chief_config.mode() != options_.config.mode() ||
      chief_config.num_replicas() != options_.config.num_replicas() ||
      chief_config.max_workers() != options_.config.max_workers()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this worker runs ", proto::SyncMode_Name(options_.config.mode()), " with ",
        options_.config.num_replicas(), " replicas (--max_workers=",
        options_.config.max_workers(), ") but the chief chose ",
        proto::SyncMode_Name(chief_config.mode()), " with ", chief_config.num_replicas(),
        " (--max_workers=", chief_config.max_workers(), "): give every worker the same flags"));
  }
  if (options_.membership != nullptr && !joined_first) {
    ASSIGN_OR_RETURN(first_version, options_.membership->Join());
  }
  absl::StatusOr<ParameterStore::PullResult> first = client_->Pull(first_version, &params_);
  if (absl::IsAborted(first.status()) && !client_->regroups()) {
    // A ps restarted between the model's readiness and this pull (it waits
    // for the chief to confirm its checkpoint): recover as a step does.
    pulled_.version = first_version;
    RETURN_IF_ERROR(recovery_.Recover(first.status(), &params_, &pulled_));
    if (options_.membership != nullptr) options_.membership->Recovered();
  } else {
    RETURN_IF_ERROR(first.status());
    pulled_ = *std::move(first);
  }
  progress_.Start(pulled_.version, events_.get());
  if (options_.metrics != nullptr) {
    options_.metrics->SetGlobalStep(pulled_.version);
    options_.metrics->SetState(proto::WORKER_TRAINING);
  }
  RETURN_IF_ERROR(DataFromStep(pulled_.version));
  if (pulled_.version > 0) LOG(INFO) << "resuming at global step " << pulled_.version;
  progress_.StartInterval();
  // A first checkpoint right away, so that a parameter server that restarts
  // early has one to restore; a resumed run has one at its step already.
  checkpoints_.Start(chief() && recovery_.checkpoints(), recovery_.newest_common_checkpoint(),
                     pulled_.version > 0 ? pulled_.version : -1);
  last_eval_step_ = pulled_.version;
  return true;
}

absl::Status Trainer::DataFromStep(int64_t version) {
  ASSIGN_OR_RETURN(batches_, train_source_());
  const bool sync = options_.config.mode() == proto::SYNC;
  const int64_t steps = sync ? version : version / options_.num_replicas;
  return batches_->Skip(steps * options_.batch_size);
}

absl::Status Trainer::NextBatch() {
  const absl::Time start = absl::Now();
  absl::Status status = batches_->NextBatch(options_.batch_size, &images_, &labels_);
  if (status.ok() && sparse_) {
    status = ReadIds(*batches_, options_.batch_size, options_.batch_size, *model_, &features_);
  }
  progress_.AddInputTime(absl::Now() - start);
  return status;
}

absl::Status Trainer::RecoverOrFail(const absl::Status& status) {
  computed_ = false;
  batch_pulled_ = false;
  if (!absl::IsAborted(status)) return status;
  if (client_->regroups()) {
    // An elastic ring's members changed: the newest ring, the newest state.
    LOG(INFO) << status.message();
    RETURN_IF_ERROR(client_->Regroup());
    ASSIGN_OR_RETURN(pulled_, client_->Pull(0, &params_));
  } else {
    RETURN_IF_ERROR(recovery_.Recover(status, &params_, &pulled_));
    if (options_.membership != nullptr) options_.membership->Recovered();
  }
  RETURN_IF_ERROR(DataFromStep(pulled_.version));
  clock_base_ = result_.local_steps;
  // The shards hold a checkpoint of this step (the next ones are saved
  // again on schedule); a regrouped ring restored none.
  if (!client_->regroups()) {
    checkpoints_.Recovered(chief() && recovery_.checkpoints(),
                           recovery_.newest_common_checkpoint(), pulled_.version);
  }
  last_eval_step_ = std::min(last_eval_step_, pulled_.version);
  return absl::OkStatus();
}

bool Trainer::Finished(const ParameterStore::PullResult& pulled) const {
  return pulled.training_done || pulled.version >= options_.train_steps;
}

bool Trainer::EvalDue(int64_t version) const {
  return chief() && options_.eval_every_steps > 0 &&
         version >= last_eval_step_ + options_.eval_every_steps;
}

absl::Status Trainer::Step() {
  // A push that left during the backward pass was cleared of duties.
  const bool pushing = pipeline_.has_value() && pipeline_->push_started();
  if (options_.membership != nullptr) {
    if (options_.membership->draining()) {
      if (pushing) {
        const absl::Status pushed = pipeline_->FinishPush().status();
        LOG_IF(WARNING, !pushed.ok()) << "the last push before leaving: " << pushed.message();
      }
      result_.drained = true;
      return absl::OkStatus();
    }
    // The chief: the first version it has not pushed is where workers join.
    const absl::Status admitted = options_.membership->AtStep(
        pushing ? pulled_.version + 1 : pulled_.version, [this] {
          absl::StatusOr<std::vector<proto::StatusResponse>> shards = client_->GetStatus();
          return shards.ok() && std::any_of(shards->begin(), shards->end(),
                                            [](const auto& s) { return s.training_done(); });
        });
    if (!admitted.ok()) return RecoverOrFail(admitted);
  }
  if (!pushing && checkpoints_.Due(pulled_.version)) {
    RETURN_IF_ERROR(checkpoints_.Save(pulled_.version));
  }
  if (!pushing && EvalDue(pulled_.version)) {
    absl::Status evaluated = Evaluate(pulled_.version, &params_).status();
    if (!evaluated.ok()) return RecoverOrFail(evaluated);
    last_eval_step_ = pulled_.version;
  }
  if (!computed_) {
    if (!batch_pulled_) {
      RETURN_IF_ERROR(NextBatch());
      if (sparse_) {  // The batch's rows (at the start, or after a recovery).
        if (absl::Status looked = client_->LookupRows(&features_); !looked.ok()) {
          return RecoverOrFail(looked);
        }
      }
    }
    batch_pulled_ = false;
    if (sparse_) model_->SetSparseFeatures(&features_);
    const absl::Time compute_start = absl::Now();
    Timeline::Span span(options_.timeline, "compute", "step", pulled_.version);
    loss_ = towers_->ComputeGradients(params_, images_, labels_, &grads_);
    RETURN_IF_ERROR(towers_->status());  // A device fault: never pushed.
    loss_ += WeightDecay(params_, &grads_, 0, static_cast<int>(params_.size()));
    ClipGradients(&grads_);
    progress_.time().compute += absl::Now() - compute_start;
  }
  computed_ = false;
  if (!std::isfinite(loss_)) {  // Never pushed: the gate saw the loss.
    return absl::InternalError(absl::StrCat("loss became ", loss_, " at step ",
                                            pulled_.version, " (learning rate too high?)"));
  }
  const absl::Time push_start = absl::Now();
  absl::StatusOr<ParameterStore::PushResult> pushed;
  {
    Timeline::Span span(options_.timeline, pushing ? "push (rest)" : "push", "step",
                        pulled_.version);
    pushed = pushing ? pipeline_->FinishPush() : client_->Push(grads_);
  }
  progress_.time().push += absl::Now() - push_start;
  if (!pushed.ok()) return RecoverOrFail(pushed.status());
  if (!pushed->accepted) ++stale_;
  ++result_.local_steps;
  progress_.StepPushed(loss_);
  const bool sync = options_.config.mode() == proto::SYNC;
  const int64_t min_version = sync ? pulled_.version + 1 : 0;
  const int64_t min_clock = !sync && options_.staleness >= 0
                                ? result_.local_steps - clock_base_ - options_.staleness
                                : 0;
  absl::StatusOr<ParameterStore::PullResult> next;
  if (pipeline_.has_value()) {
    // The batch first: a failed one ends training before a pull starts.
    RETURN_IF_ERROR(NextBatch());
    next = ComputeWhilePulling(min_version, min_clock, pushed->training_done);
    computed_ = next.ok();
  } else {
    // A sparse model's next batch first: the pull brings the rows of its ids.
    if (sparse_) RETURN_IF_ERROR(NextBatch());
    const absl::Time pull_start = absl::Now();
    Timeline::Span span(options_.timeline, "pull", "step", pulled_.version);
    next = client_->Pull(min_version, &params_, /*moving_average=*/false, min_clock);
    progress_.time().pull += absl::Now() - pull_start;
    batch_pulled_ = sparse_ && next.ok();
  }
  if (!next.ok()) return RecoverOrFail(next.status());
  pulled_ = *next;
  progress_.time().waited += pulled_.waited;
  recovery_.StepDone();
  if (pushed->training_done) pulled_.training_done = true;
  if (options_.metrics != nullptr) {
    options_.metrics->RecordStep(pulled_.version, options_.batch_size);
  }
  progress_.StepDone(result_.local_steps, pulled_.version, stale_);
  return absl::OkStatus();
}

absl::StatusOr<ParameterStore::PullResult> Trainer::ComputeWhilePulling(int64_t min_version,
                                                                        int64_t min_clock,
                                                                        bool training_done) {
  const absl::Time start = absl::Now();
  pipeline_->StartPull(min_version, &params_, min_clock);
  float l2 = 0;
  bool loss_finite = true;
  bool push_decided = false;
  StepHooks hooks;
  hooks.before_read = [&](int begin, int end) { pipeline_->WaitForVariables(begin, end); };
  hooks.loss_ready = [&](float forward_loss) { loss_finite = std::isfinite(forward_loss); };
  hooks.gradients_ready = [&](int begin, int end) {
    l2 += WeightDecay(params_, &grads_, begin, end);
    if (!push_decided) {
      // The step's push leaves during the backward pass unless it is one
      // the loop must stop or wait before: a failed pull, a non-finite
      // loss, the end of training, a checkpoint or an evaluation due.
      push_decided = true;
      absl::StatusOr<ParameterStore::PullResult> arrived = pipeline_->WaitForPull();
      if (arrived.ok()) arrived->training_done |= training_done;
      if (arrived.ok() && loss_finite && !Finished(*arrived) &&
          !checkpoints_.Due(arrived->version) && !EvalDue(arrived->version)) {
        pipeline_->StartPush(&grads_);
      }
    }
    pipeline_->MarkReady(begin, end);
  };
  {
    Timeline::Span span(options_.timeline, "compute", "step", pulled_.version + 1);
    loss_ = towers_->ComputeGradients(params_, images_, labels_, &grads_, hooks) + l2;
  }
  absl::StatusOr<ParameterStore::PullResult> next = pipeline_->WaitForPull();
  const absl::Duration blocked = pipeline_->TakeBlockedTime();
  progress_.time().compute += absl::Now() - start - blocked;
  progress_.time().pull += blocked;
  // A device fault: the layers past it were never announced, so never pushed.
  if (absl::Status device = towers_->status(); !device.ok()) {
    if (pipeline_->push_started()) {
      pipeline_->AbandonPush();
      (void)pipeline_->FinishPush();  // Aborted: the store is idle again.
    }
    return device;
  }
  return next;
}

absl::StatusOr<TrainResult> Trainer::Train() {
  // Replica r reads examples r, r + W, ... (BatchIterator): it needs one.
  if (train_ != nullptr && train_->size() <= options_.replica) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the training data holds ", train_->size(), " examples, too few for ",
        options_.num_replicas, " replicas: replica ", options_.replica, " gets none"));
  }
  model_->Initialize(options_.seed, &params_);
  if (chief() && options_.initial_values) {
    ASSIGN_OR_RETURN(const std::vector<Tensor> initial, options_.initial_values());
    CHECK_EQ(initial.size(), params_.size()) << "initial values of another model";
    for (size_t v = 0; v < params_.size(); ++v) {
      CHECK(initial[v].shape() == params_[v].shape()) << model_->variables()[v].name;
      std::memcpy(params_[v].data(), initial[v].data(), params_[v].num_bytes());
    }
    LOG(INFO) << "initial values: " << params_.size() << " variables from the Keras weights file";
  }
  if (sparse_) client_->SetSparseFeatures(&features_);
  ASSIGN_OR_RETURN(const bool started, Start());
  if (!started) return TrainResult();
  if (options_.overlap_comm && options_.clip_norm <= 0 && !sparse_) {
    pipeline_.emplace(client_, client_->placement(), static_cast<int>(params_.size()));
  }
  while (!Finished(pulled_) && !result_.drained) RETURN_IF_ERROR(Step());
  progress_.EndBar();
  result_.global_step = pulled_.version;
  if (result_.drained) {
    options_.membership->Leave();
    LOG(INFO) << "replica " << options_.replica << " drained: left the job at global step "
              << result_.global_step << " after " << result_.local_steps << " local steps";
    return result_;
  }
  LOG(INFO) << "replica " << options_.replica << " finished: " << result_.local_steps
            << " local steps, global step " << result_.global_step << ", " << stale_
            << " stale pushes";
  if (train_ == nullptr) progress_.LogInputWait();  // Decoded input: did the steps wait?
  if (chief()) RETURN_IF_ERROR(FinishAsChief());
  return result_;
}

absl::Status Trainer::FinishAsChief() {
  checkpoints_.SaveAtEnd(result_.global_step);
  if (client_->wire_dtype() != proto::DT_FLOAT) {
    // The model as the shards hold it, not as the wire rounded it.
    ASSIGN_OR_RETURN(auto full, client_->Pull(0, &params_, /*moving_average=*/false,
                                              /*min_clock=*/0, ParameterStore::Precision::kFull));
    (void)full;
  }
  ASSIGN_OR_RETURN(Evaluation final_eval, Evaluate(result_.global_step, &params_));
  result_.test_accuracy = final_eval.accuracy;
  if (sparse_) {
    result_.test_auc = final_eval.auc;
    result_.test_logloss = final_eval.loss;
  }
  if (!options_.final_params_path.empty()) {
    std::vector<NamedTensor> named;
    for (size_t i = 0; i < params_.size(); ++i) {
      named.emplace_back(model_->variables()[i].name, &params_[i]);
    }
    RETURN_IF_ERROR(WriteSafetensors(options_.final_params_path, named,
                                     {{"global_step", absl::StrCat(result_.global_step)}}));
  }
  if (events_ != nullptr) RETURN_IF_ERROR(events_->Close());
  if (sparse_) {
    std::printf("final: global_step=%lld test_auc=%.4f test_logloss=%.4f\n",
                static_cast<long long>(result_.global_step), result_.test_auc,
                result_.test_logloss);
  } else {
    std::printf("final: global_step=%lld test_accuracy=%.4f\n",
                static_cast<long long>(result_.global_step), result_.test_accuracy);
  }
  std::fflush(stdout);
  return absl::OkStatus();
}

}  // namespace psrt
