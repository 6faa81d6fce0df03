#include "ps/optimizer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/tensor.h"
#include "kernels/elementwise.h"

namespace psrt {
namespace {

class SgdOptimizer : public Optimizer {
 public:
  explicit SgdOptimizer(float learning_rate) : learning_rate_(learning_rate) {}
  void Apply(int64_t /*begin*/, absl::Span<const float> grad,
             absl::Span<float> values) override {
    kernels::ApplySgd(learning_rate_, grad, values);
  }

 private:
  const float learning_rate_;
};

// TensorFlow's MomentumOptimizer: accum = momentum * accum + grad;
// value -= learning_rate * accum.
class MomentumOptimizer : public Optimizer {
 public:
  MomentumOptimizer(float learning_rate, float momentum, int64_t n)
      : learning_rate_(learning_rate), momentum_(momentum), accum_({n}) {}
  void Apply(int64_t begin, absl::Span<const float> grad,
             absl::Span<float> values) override {
    kernels::ApplyMomentum(learning_rate_, momentum_, grad,
                           accum_.flat().subspan(begin, grad.size()), values);
  }

 private:
  const float learning_rate_;
  const float momentum_;
  Tensor accum_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> NewOptimizer(
    const proto::TrainingConfig& config, int64_t num_elements) {
  if (!(config.learning_rate() > 0) || !std::isfinite(config.learning_rate())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "learning_rate must be a positive number, got ", config.learning_rate()));
  }
  switch (config.optimizer()) {
    case proto::SGD:
      return std::make_unique<SgdOptimizer>(config.learning_rate());
    case proto::MOMENTUM:
      if (!(config.momentum() >= 0 && config.momentum() < 1)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "momentum must be in [0, 1), got ", config.momentum()));
      }
      return std::make_unique<MomentumOptimizer>(
          config.learning_rate(), config.momentum(), num_elements);
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown optimizer ", proto::OptimizerType_Name(config.optimizer()),
          " (known: SGD, MOMENTUM)"));
  }
}

}  // namespace psrt
