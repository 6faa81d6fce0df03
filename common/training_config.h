// Training configuration (proto::TrainingConfig) helpers shared by the
// chief, which builds the config from its flags, and the parameter servers,
// which apply it: validation, TensorFlow's optimizer defaults, and the
// learning-rate schedules (tf.train's exponential decay, piecewise constant,
// linear warmup; see LearningRateSchedule in proto/psrt.proto).
#ifndef PSRT_COMMON_TRAINING_CONFIG_H_
#define PSRT_COMMON_TRAINING_CONFIG_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/psrt.pb.h"

namespace psrt {

// The most training replicas a config may name: a parameter server keeps
// per-replica state, so a corrupt count must not make it allocate gigabytes.
constexpr int kMaxReplicas = 1 << 16;

// Checks everything: mode and replica counts, learning rate and schedule,
// the optimizer and its hyperparameters, the moving-average decay. Errors are
// InvalidArgument naming the field and the value.
absl::Status ValidateTrainingConfig(const proto::TrainingConfig& config);

// Fills in TensorFlow's defaults for the optimizer's unset (zero)
// hyperparameters: Adam's betas and epsilon, RMSProp's rho and epsilon,
// Adagrad's initial accumulator.
void SetOptimizerDefaults(proto::TrainingConfig* config);

// The rule of the embedding tables: `config` with its sparse_optimizer and
// sparse_learning_rate in place of the dense ones (where set), and that
// optimizer's defaults; ValidateTrainingConfig's errors for it.
absl::StatusOr<proto::TrainingConfig> SparseTrainingConfig(const proto::TrainingConfig& config);

// The learning rate at global step `step` (0 before the first update).
// REQUIRES: ValidateSchedule(config.schedule()).ok().
float LearningRateAt(const proto::TrainingConfig& config, int64_t step);

// Checks the schedule; errors name the offending field.
absl::Status ValidateSchedule(const proto::LearningRateSchedule& schedule);

}  // namespace psrt

#endif  // PSRT_COMMON_TRAINING_CONFIG_H_
