// The learning rate of a TrainingConfig as a function of the global step:
// TensorFlow's tf.train schedules (see LearningRateSchedule in
// proto/psrt.proto). The parameter servers use it to apply updates and the
// chief to report the rate in summaries.
#ifndef PSRT_COMMON_LEARNING_RATE_H_
#define PSRT_COMMON_LEARNING_RATE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "proto/psrt.pb.h"

namespace psrt {

// The learning rate at global step `step` (0 before the first update).
// REQUIRES: ValidateSchedule(config.schedule()).ok().
float LearningRateAt(const proto::TrainingConfig& config, int64_t step);

// Checks the schedule; errors name the offending field.
absl::Status ValidateSchedule(const proto::LearningRateSchedule& schedule);

}  // namespace psrt

#endif  // PSRT_COMMON_LEARNING_RATE_H_
