#include "common/training_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace psrt {
namespace {

absl::Status CheckRange(absl::string_view name, float value, float low, float high) {
  if (!(value >= low && value < high)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must be in [", low, ", ", high, "), got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

using proto::LearningRateSchedule;

float LearningRateAt(const proto::TrainingConfig& config, int64_t step) {
  const LearningRateSchedule& s = config.schedule();
  double lr = config.learning_rate();
  switch (s.type()) {
    case LearningRateSchedule::EXPONENTIAL_DECAY: {
      double exponent = static_cast<double>(step) / s.decay_steps();
      if (s.staircase()) exponent = std::floor(exponent);
      lr *= std::pow(double{s.decay_rate()}, exponent);
      break;
    }
    case LearningRateSchedule::PIECEWISE_CONSTANT: {
      int i = 0;
      while (i < s.boundaries_size() && step > s.boundaries(i)) ++i;
      lr = s.values(i);
      break;
    }
    default:
      break;
  }
  if (s.warmup_steps() > 0 && step < s.warmup_steps()) {
    lr *= static_cast<double>(step + 1) / s.warmup_steps();
  }
  return static_cast<float>(lr);
}

absl::Status ValidateSchedule(const LearningRateSchedule& s) {
  if (s.warmup_steps() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("warmup_steps must be >= 0, got ", s.warmup_steps()));
  }
  switch (s.type()) {
    case LearningRateSchedule::CONSTANT:
      return absl::OkStatus();
    case LearningRateSchedule::EXPONENTIAL_DECAY:
      if (s.decay_steps() <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "exponential decay: decay_steps must be positive, got ", s.decay_steps()));
      }
      if (!(s.decay_rate() > 0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "exponential decay: decay_rate must be positive, got ", s.decay_rate()));
      }
      return absl::OkStatus();
    case LearningRateSchedule::PIECEWISE_CONSTANT:
      if (s.values_size() != s.boundaries_size() + 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "piecewise constant: needs one more value than boundaries, got ",
            s.values_size(), " values and ", s.boundaries_size(), " boundaries"));
      }
      for (int i = 1; i < s.boundaries_size(); ++i) {
        if (s.boundaries(i) <= s.boundaries(i - 1)) {
          return absl::InvalidArgumentError(
              "piecewise constant: boundaries must be strictly increasing");
        }
      }
      for (float v : s.values()) {
        if (!(v > 0)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "piecewise constant: learning rates must be positive, got ", v));
        }
      }
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown learning rate schedule ", LearningRateSchedule::Type_Name(s.type())));
  }
}

void SetOptimizerDefaults(proto::TrainingConfig* config) {
  switch (config->optimizer()) {
    case proto::ADAM:
      if (config->beta1() == 0) config->set_beta1(0.9f);
      if (config->beta2() == 0) config->set_beta2(0.999f);
      if (config->epsilon() == 0) config->set_epsilon(1e-8f);
      break;
    case proto::RMSPROP:
      if (config->rho() == 0) config->set_rho(0.9f);
      if (config->epsilon() == 0) config->set_epsilon(1e-10f);
      break;
    case proto::ADAGRAD:
    case proto::FTRL:
      if (config->initial_accumulator_value() == 0) {
        config->set_initial_accumulator_value(0.1f);
      }
      break;
    default:
      break;
  }
}

absl::StatusOr<proto::TrainingConfig> SparseTrainingConfig(const proto::TrainingConfig& config) {
  if (!proto::OptimizerType_IsValid(config.sparse_optimizer())) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown sparse optimizer ", config.sparse_optimizer()));
  }
  if (!(config.sparse_learning_rate() >= 0) || !std::isfinite(config.sparse_learning_rate())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sparse_learning_rate must be a positive number or 0 (the dense one), got ",
        config.sparse_learning_rate()));
  }
  proto::TrainingConfig rule = config;
  if (config.sparse_optimizer() != proto::OPTIMIZER_UNSPECIFIED) {
    rule.set_optimizer(config.sparse_optimizer());
  }
  if (config.sparse_learning_rate() > 0) rule.set_learning_rate(config.sparse_learning_rate());
  SetOptimizerDefaults(&rule);
  RETURN_IF_ERROR(ValidateTrainingConfig(rule));
  return rule;
}

absl::Status ValidateTrainingConfig(const proto::TrainingConfig& config) {
  if (config.mode() != proto::SYNC && config.mode() != proto::ASYNC) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown sync mode ", proto::SyncMode_Name(config.mode())));
  }
  if (config.num_replicas() < 1 || config.num_replicas() > kMaxReplicas) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_replicas must be in 1..", kMaxReplicas, ", got ", config.num_replicas()));
  }
  if (!(config.moving_average_decay() >= 0 && config.moving_average_decay() < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "moving_average_decay must be in [0, 1), got ",
        config.moving_average_decay()));
  }
  if (config.mode() == proto::SYNC &&
      (config.replicas_to_aggregate() < 1 ||
       config.replicas_to_aggregate() > config.num_replicas())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replicas_to_aggregate must be in 1..", config.num_replicas(),
        " (the number of replicas), got ", config.replicas_to_aggregate()));
  }
  if (config.max_workers() != 0 || config.min_workers() != 0) {
    if (config.mode() != proto::SYNC) {
      return absl::InvalidArgumentError(
          "elastic workers (min_workers, max_workers) need sync mode (--sync_replicas)");
    }
    if (config.max_workers() != config.num_replicas() || config.min_workers() < 1 ||
        config.min_workers() > config.max_workers()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "elastic workers: need 1 <= min_workers <= max_workers = num_replicas, got min_workers ",
          config.min_workers(), ", max_workers ", config.max_workers(), ", num_replicas ",
          config.num_replicas()));
    }
  }
  if (!(config.learning_rate() > 0) || !std::isfinite(config.learning_rate())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "learning_rate must be a positive number, got ", config.learning_rate()));
  }
  RETURN_IF_ERROR(ValidateSchedule(config.schedule()));
  switch (config.optimizer()) {
    case proto::SGD:
      return absl::OkStatus();
    case proto::MOMENTUM:
      return CheckRange("momentum", config.momentum(), 0, 1);
    case proto::ADAGRAD:
      if (!(config.initial_accumulator_value() > 0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "adagrad: initial_accumulator_value must be positive, got ",
            config.initial_accumulator_value()));
      }
      return absl::OkStatus();
    case proto::RMSPROP:
      RETURN_IF_ERROR(CheckRange("rmsprop rho", config.rho(), 0, 1));
      RETURN_IF_ERROR(CheckRange("rmsprop momentum", config.momentum(), 0, 1));
      if (!(config.epsilon() > 0)) {
        return absl::InvalidArgumentError("rmsprop: epsilon must be positive");
      }
      return absl::OkStatus();
    case proto::FTRL:
      if (!(config.initial_accumulator_value() > 0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "ftrl: initial_accumulator_value must be positive, got ",
            config.initial_accumulator_value()));
      }
      if (!(config.l1_regularization_strength() >= 0) ||
          !(config.l2_regularization_strength() >= 0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "ftrl: l1 and l2 regularization strengths must be >= 0, got ",
            config.l1_regularization_strength(), " and ", config.l2_regularization_strength()));
      }
      return absl::OkStatus();
    case proto::ADAM:
      RETURN_IF_ERROR(CheckRange("adam beta1", config.beta1(), 0, 1));
      RETURN_IF_ERROR(CheckRange("adam beta2", config.beta2(), 0, 1));
      if (!(config.epsilon() > 0)) {
        return absl::InvalidArgumentError("adam: epsilon must be positive");
      }
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown optimizer ", proto::OptimizerType_Name(config.optimizer()),
          " (known: SGD, MOMENTUM, ADAGRAD, RMSPROP, ADAM, FTRL)"));
  }
}

}  // namespace psrt
