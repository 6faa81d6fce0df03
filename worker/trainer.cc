#include "worker/trainer.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace psrt {

Trainer::Trainer(const TrainerOptions& options, Model* model, PsClient* client,
                 const Dataset* train, const Dataset* test)
    : options_(options),
      model_(model),
      client_(client),
      train_(train),
      test_(test) {}

absl::StatusOr<double> Trainer::Evaluate(const std::vector<Tensor>& params) {
  constexpr int64_t kEvalBatch = 1000;
  const int64_t n = test_->size();
  const int64_t pixels = test_->images.dim(1);
  Tensor batch;
  int64_t correct = 0;
  for (int64_t begin = 0; begin < n; begin += kEvalBatch) {
    const int64_t size = std::min(kEvalBatch, n - begin);
    batch.Resize({size, pixels});
    std::copy_n(test_->images.data() + begin * pixels, size * pixels, batch.data());
    correct += model_->CountCorrect(
        params, batch, absl::MakeConstSpan(test_->labels).subspan(begin, size));
  }
  return n == 0 ? 0.0 : static_cast<double>(correct) / n;
}

absl::StatusOr<TrainResult> Trainer::Run() {
  const bool chief = options_.replica == 0;
  const bool sync = options_.config.mode() == proto::SYNC;
  std::vector<Tensor> params;
  std::vector<Tensor> grads;
  model_->Initialize(options_.seed, &params);

  RETURN_IF_ERROR(client_->WaitForServers(options_.startup_timeout));
  if (chief) {
    RETURN_IF_ERROR(client_->Init(options_.config, params));
    LOG(INFO) << "chief initialized " << params.size() << " variables on "
              << client_->num_shards() << " parameter servers";
  }
  ASSIGN_OR_RETURN(proto::TrainingConfig chief_config,
                   client_->WaitForModelReady(options_.startup_timeout));
  if (chief_config.mode() != options_.config.mode() ||
      chief_config.num_replicas() != options_.config.num_replicas()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this worker runs ", proto::SyncMode_Name(options_.config.mode()),
        " with ", options_.config.num_replicas(), " replicas but the chief chose ",
        proto::SyncMode_Name(chief_config.mode()), " with ",
        chief_config.num_replicas(), " (give every worker the same flags)"));
  }

  BatchIterator batches(train_, options_.replica, options_.num_replicas,
                        options_.shuffle, options_.seed + 1000 * options_.replica);
  Tensor images;
  std::vector<int32_t> labels;
  TrainResult result;
  ASSIGN_OR_RETURN(PsClient::PullResult pulled, client_->Pull(0, &params));
  absl::Time interval_start = absl::Now();
  int64_t interval_steps = 0;
  double interval_loss = 0;
  int64_t stale = 0;
  while (!pulled.training_done && pulled.version < options_.train_steps) {
    batches.NextBatch(options_.batch_size, &images, &labels);
    const float loss = model_->ComputeGradients(params, images, labels, &grads);
    if (!std::isfinite(loss)) {
      return absl::InternalError(absl::StrCat(
          "loss became ", loss, " at step ", pulled.version,
          " (learning rate too high?)"));
    }
    ASSIGN_OR_RETURN(PsClient::PushResult pushed, client_->Push(grads));
    if (!pushed.accepted) ++stale;
    ++result.local_steps;
    ++interval_steps;
    interval_loss += loss;
    ASSIGN_OR_RETURN(pulled, client_->Pull(sync ? pulled.version + 1 : 0, &params));
    if (pushed.training_done) pulled.training_done = true;

    if (result.local_steps % options_.log_every_steps == 0) {
      const double secs = absl::ToDoubleSeconds(absl::Now() - interval_start);
      const double sec_per_batch = secs / interval_steps;
      LOG(INFO) << absl::StrFormat(
          "step %d, loss = %.4f (%.1f examples/sec; %.3f sec/batch)",
          pulled.version, interval_loss / interval_steps,
          options_.batch_size / sec_per_batch, sec_per_batch)
                << (stale > 0 ? absl::StrCat(" [", stale, " stale]") : "");
      interval_start = absl::Now();
      interval_steps = 0;
      interval_loss = 0;
    }
  }
  result.global_step = pulled.version;
  LOG(INFO) << "replica " << options_.replica << " finished: "
            << result.local_steps << " local steps, global step "
            << result.global_step << ", " << stale << " stale pushes";

  if (chief) {
    ASSIGN_OR_RETURN(result.test_accuracy, Evaluate(params));
    if (!options_.final_params_path.empty()) {
      std::vector<NamedTensor> named;
      for (size_t i = 0; i < params.size(); ++i) {
        named.push_back({model_->variables()[i].name, &params[i]});
      }
      RETURN_IF_ERROR(WriteSafetensors(
          options_.final_params_path, named,
          {{"global_step", absl::StrCat(result.global_step)}}));
    }
    std::printf("final: global_step=%lld test_accuracy=%.4f\n",
                static_cast<long long>(result.global_step), result.test_accuracy);
    std::fflush(stdout);
  }
  client_->Shutdown();
  return result;
}

}  // namespace psrt
