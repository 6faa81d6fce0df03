// psrt_worker's flags of the training rule (training_rule_flags.h): the
// optimizers, their hyperparameters and schedule, and the embedding tables'
// rule, admission and eviction.
#include "worker/training_rule_flags.h"

#include <algorithm>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "common/task_flags.h"
#include "common/training_config.h"
#include "gflags/gflags.h"

DECLARE_bool(sync_replicas);
DECLARE_int32(replicas_to_aggregate);

DEFINE_int32(max_workers, 0,
             "Elastic workers (with --sync_replicas, ps mode): workers 0..N-1 may join the "
             "running job (the chief admits them at its next step) and leave it (killed, or "
             "psrtctl drain); each step averages the gradients of the workers that are members "
             "then. 0: the cluster spec's workers, fixed. Give every worker the same value.");
DEFINE_int32(min_workers, 0,
             "Elastic workers: the chief trains only while at least this many workers "
             "(itself included) are members, waiting for more at its step; 0: 1.");
DEFINE_double(elastic_lease_secs, 5,
              "Elastic workers: the chief drops a worker it has not heard from for this long "
              "(each worker calls it four times per lease).");

DEFINE_string(optimizer, "sgd",
              "sgd, momentum, adagrad, rmsprop, adam or ftrl, applied on the parameter "
              "servers with TensorFlow's rules and defaults.");
DEFINE_double(learning_rate, 0.1, "(Initial) learning rate.");
DEFINE_string(sparse_optimizer, "",
              "CTR models: the embedding tables' optimizer (as --optimizer, applied lazily to "
              "the rows a batch touches); empty: --optimizer.");
DEFINE_double(sparse_learning_rate, 0,
              "CTR models: the embedding tables' learning rate; 0: --learning_rate.");
DEFINE_bool(sparse_async, false,
            "CTR models with --sync_replicas: the embedding rows of every push are applied "
            "on arrival, as in async training, while the dense gradients stay synchronous "
            "(Persia's hybrid).");
DEFINE_int32(embedding_admit_count, 0,
             "CTR models: an id gets its embedding row at its Nth training look-up; until "
             "then it reads zeros and its gradient is dropped (counted). 0 or 1: at once.");
DEFINE_double(embedding_admit_probability, 0,
              "CTR models: an id gets its row at each training look-up with this "
              "probability (instead of --embedding_admit_count); 0: off.");
DEFINE_int64(embedding_ttl_steps, 0,
             "CTR models: embedding rows no training step has touched for this many global "
             "steps are dropped (an id that returns starts afresh); 0: never.");
DEFINE_int64(embedding_max_rows_per_ps, 0,
             "CTR models: the most rows of each embedding table a ps task keeps; past it "
             "the least recently touched are dropped. 0: no limit.");
DEFINE_double(momentum, 0.9, "Momentum, for momentum (and rmsprop, default 0 there).");
DEFINE_bool(use_nesterov, false, "Nesterov momentum, for --optimizer=momentum.");
DEFINE_double(adam_beta1, 0.9, "Adam's beta1.");
DEFINE_double(adam_beta2, 0.999, "Adam's beta2.");
DEFINE_double(epsilon, 0, "Adam's or RMSProp's epsilon; 0: TensorFlow's default.");
DEFINE_double(rmsprop_decay, 0.9, "RMSProp's decay (rho).");
DEFINE_double(adagrad_initial_accumulator, 0.1,
              "Adagrad's (and FTRL's) initial accumulator value.");
DEFINE_double(l1_regularization_strength, 0, "FTRL's L1 regularization strength.");
DEFINE_double(l2_regularization_strength, 0, "FTRL's L2 regularization strength.");
DEFINE_string(learning_rate_decay, "none",
              "Schedule: none, exponential (tf.train.exponential_decay) or "
              "piecewise (tf.train.piecewise_constant).");
DEFINE_double(decay_rate, 0.96, "exponential: factor per --decay_steps.");
DEFINE_int64(decay_steps, 0, "exponential: steps per decay; 0: use --decay_epochs.");
DEFINE_double(decay_epochs, 1, "exponential: epochs per decay, when --decay_steps is 0.");
DEFINE_bool(staircase, false, "exponential: decay in whole steps.");
DEFINE_string(boundaries, "", "piecewise: comma-separated ascending steps.");
DEFINE_string(values, "", "piecewise: comma-separated learning rates, one more than boundaries.");
DEFINE_int64(warmup_steps, 0, "Linear learning-rate warmup over this many steps.");
DEFINE_double(moving_average_decay, 0,
              "Keep an exponential moving average of every variable on the "
              "parameter servers (saved with checkpoints); 0: off.");

namespace psrt {
namespace {

template <class T>
absl::StatusOr<std::vector<T>> ParseList(const std::string& flag, const std::string& text) {
  std::vector<T> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    T value;
    bool ok;
    if constexpr (std::is_floating_point_v<T>) {
      ok = absl::SimpleAtof(part, &value);
    } else {
      ok = absl::SimpleAtoi(part, &value);
    }
    if (!ok) {
      return absl::InvalidArgumentError("--" + flag + ": \"" + std::string(part) +
                                        "\" is not a number");
    }
    out.push_back(value);
  }
  return out;
}

// The embedding rows' admission and eviction (--embedding_*) into `config`:
// the ps budget split over each task's stripes (ids spread evenly over them).
absl::Status SetEmbeddingPolicy(proto::TrainingConfig* config) {
  if (FLAGS_embedding_admit_count < 0 || FLAGS_embedding_ttl_steps < 0 ||
      FLAGS_embedding_max_rows_per_ps < 0) {
    return absl::InvalidArgumentError(
        "--embedding_admit_count, --embedding_ttl_steps and --embedding_max_rows_per_ps must "
        "not be negative");
  }
  if (!(FLAGS_embedding_admit_probability >= 0 && FLAGS_embedding_admit_probability <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--embedding_admit_probability must be in [0, 1] (0: off), got ",
        FLAGS_embedding_admit_probability));
  }
  if (FLAGS_embedding_admit_count > 1 && FLAGS_embedding_admit_probability > 0 &&
      FLAGS_embedding_admit_probability < 1) {
    return absl::InvalidArgumentError(
        "--embedding_admit_count and --embedding_admit_probability are two ways to admit "
        "ids: set one");
  }
  config->set_embedding_admit_count(FLAGS_embedding_admit_count);
  config->set_embedding_admit_probability(FLAGS_embedding_admit_probability);
  config->set_embedding_ttl_steps(FLAGS_embedding_ttl_steps);
  if (FLAGS_embedding_max_rows_per_ps > 0) {
    ASSIGN_OR_RETURN(const int stripes, PsStripesFromFlags());
    config->set_embedding_max_rows_per_shard(
        std::max<int64_t>(1, FLAGS_embedding_max_rows_per_ps / stripes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ElasticWorkers> ElasticWorkersFromFlags(int spec_workers, int replica,
                                                       bool hybrid) {
  ElasticWorkers elastic;
  if (!(FLAGS_elastic_lease_secs > 0)) {
    return absl::InvalidArgumentError("--elastic_lease_secs must be positive");
  }
  elastic.lease = absl::Seconds(FLAGS_elastic_lease_secs);
  if (FLAGS_max_workers <= 0) return elastic;
  if (hybrid) {
    return absl::InvalidArgumentError(
        "--max_workers: elastic workers train in ps mode or allreduce mode, not with "
        "--dense_allreduce (its ring is fixed)");
  }
  if (spec_workers > FLAGS_max_workers) {
    return absl::InvalidArgumentError(absl::StrCat("the cluster spec has ", spec_workers,
                                                   " workers, more than --max_workers=",
                                                   FLAGS_max_workers));
  }
  if (replica >= FLAGS_max_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("this task is worker replica ", replica, ", but --max_workers=",
                     FLAGS_max_workers, " admits 0..", FLAGS_max_workers - 1));
  }
  elastic.max_workers = FLAGS_max_workers;
  return elastic;
}

absl::StatusOr<proto::TrainingConfig> TrainingConfigFromFlags(int num_replicas,
                                                              double* decay_epochs,
                                                              bool allreduce) {
  proto::TrainingConfig config;
  config.set_mode(FLAGS_sync_replicas || allreduce ? proto::SYNC : proto::ASYNC);
  config.set_num_replicas(num_replicas);
  config.set_replicas_to_aggregate(
      FLAGS_replicas_to_aggregate > 0 ? FLAGS_replicas_to_aggregate : num_replicas);
  if (FLAGS_max_workers > 0 || FLAGS_min_workers > 0) {
    if ((!FLAGS_sync_replicas && !allreduce) || FLAGS_replicas_to_aggregate > 0) {
      return absl::InvalidArgumentError(
          "--max_workers and --min_workers make sync training elastic: they need "
          "--sync_replicas (or allreduce mode) and no --replicas_to_aggregate (each step "
          "averages every member's gradient)");
    }
    if (FLAGS_max_workers <= 0 || FLAGS_min_workers > FLAGS_max_workers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--min_workers=", FLAGS_min_workers, " needs --max_workers at least as large, got ",
          FLAGS_max_workers));
    }
    config.set_max_workers(FLAGS_max_workers);
    config.set_min_workers(std::max(1, FLAGS_min_workers));
    // The most a step can wait for at the start (examples per step).
    config.set_replicas_to_aggregate(config.min_workers());
  }
  if (config.replicas_to_aggregate() > num_replicas) {
    return absl::InvalidArgumentError(
        "--replicas_to_aggregate=" + std::to_string(FLAGS_replicas_to_aggregate) +
        " exceeds the " + std::to_string(num_replicas) + " workers of the cluster");
  }
  static const std::map<std::string, proto::OptimizerType> kOptimizers = {
      {"sgd", proto::SGD},         {"momentum", proto::MOMENTUM},
      {"adagrad", proto::ADAGRAD}, {"rmsprop", proto::RMSPROP},
      {"adam", proto::ADAM},       {"ftrl", proto::FTRL}};
  auto optimizer = kOptimizers.find(FLAGS_optimizer);
  if (optimizer == kOptimizers.end()) {
    return absl::InvalidArgumentError("--optimizer: unknown optimizer \"" + FLAGS_optimizer +
                                      "\" (known: adagrad, adam, ftrl, momentum, rmsprop, sgd)");
  }
  config.set_optimizer(optimizer->second);
  config.set_learning_rate(FLAGS_learning_rate);
  if (!FLAGS_sparse_optimizer.empty()) {
    auto sparse = kOptimizers.find(FLAGS_sparse_optimizer);
    if (sparse == kOptimizers.end()) {
      return absl::InvalidArgumentError(
          "--sparse_optimizer: unknown optimizer \"" + FLAGS_sparse_optimizer +
          "\" (known: adagrad, adam, ftrl, momentum, rmsprop, sgd)");
    }
    config.set_sparse_optimizer(sparse->second);
  }
  if (FLAGS_sparse_learning_rate < 0) {
    return absl::InvalidArgumentError("--sparse_learning_rate must not be negative");
  }
  config.set_sparse_learning_rate(FLAGS_sparse_learning_rate);
  RETURN_IF_ERROR(SetEmbeddingPolicy(&config));
  if (FLAGS_sparse_async && !FLAGS_sync_replicas) {
    return absl::InvalidArgumentError(
        "--sparse_async goes with --sync_replicas (asynchronous training applies the rows on "
        "arrival already)");
  }
  config.set_sparse_async(FLAGS_sparse_async);
  const bool rmsprop = optimizer->second == proto::RMSPROP;
  const bool momentum_set = !gflags::GetCommandLineFlagInfoOrDie("momentum").is_default;
  config.set_momentum(rmsprop && !momentum_set ? 0.0f : FLAGS_momentum);
  config.set_use_nesterov(FLAGS_use_nesterov);
  config.set_beta1(FLAGS_adam_beta1);
  config.set_beta2(FLAGS_adam_beta2);
  config.set_epsilon(FLAGS_epsilon);
  config.set_rho(FLAGS_rmsprop_decay);
  config.set_initial_accumulator_value(FLAGS_adagrad_initial_accumulator);
  config.set_l1_regularization_strength(FLAGS_l1_regularization_strength);
  config.set_l2_regularization_strength(FLAGS_l2_regularization_strength);
  SetOptimizerDefaults(&config);
  config.set_moving_average_decay(FLAGS_moving_average_decay);

  proto::LearningRateSchedule* schedule = config.mutable_schedule();
  schedule->set_warmup_steps(FLAGS_warmup_steps);
  *decay_epochs = 0;
  if (FLAGS_learning_rate_decay == "exponential") {
    schedule->set_type(proto::LearningRateSchedule::EXPONENTIAL_DECAY);
    schedule->set_decay_rate(FLAGS_decay_rate);
    if (FLAGS_decay_steps > 0) {
      schedule->set_decay_steps(FLAGS_decay_steps);
    } else {
      // At least 1 step; with --decay_epochs > 0 provisional until the
      // training set's size is known (ResolveDecayEpochs).
      *decay_epochs = std::max(0.0, FLAGS_decay_epochs);
      schedule->set_decay_steps(1);
    }
    schedule->set_staircase(FLAGS_staircase);
  } else if (FLAGS_learning_rate_decay == "piecewise") {
    schedule->set_type(proto::LearningRateSchedule::PIECEWISE_CONSTANT);
    ASSIGN_OR_RETURN(std::vector<int64_t> boundaries,
                     ParseList<int64_t>("boundaries", FLAGS_boundaries));
    ASSIGN_OR_RETURN(std::vector<float> values, ParseList<float>("values", FLAGS_values));
    *schedule->mutable_boundaries() = {boundaries.begin(), boundaries.end()};
    *schedule->mutable_values() = {values.begin(), values.end()};
  } else if (FLAGS_learning_rate_decay != "none") {
    return absl::InvalidArgumentError("--learning_rate_decay: unknown schedule \"" +
                                      FLAGS_learning_rate_decay +
                                      "\" (known: none, exponential, piecewise)");
  }
  RETURN_IF_ERROR(ValidateTrainingConfig(config));
  RETURN_IF_ERROR(SparseTrainingConfig(config).status());
  return config;
}

}  // namespace psrt
