#include "common/learning_rate.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace psrt {

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

}  // namespace psrt
