#include "ps/optimizer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/training_config.h"
#include "glog/logging.h"
#include "kernels/elementwise.h"
#include "kernels/functors.h"
#include "kernels/optimizer_functors.h"

namespace psrt {
namespace {

namespace functor = kernels::functor;

template <class F>
void Run(int64_t n, const F& f) {
  kernels::ForEachIndex(0, n, f);
}

class SgdOptimizer : public Optimizer {
 public:
  explicit SgdOptimizer(const proto::TrainingConfig& config) : config_(config) {}
  void BeginStep(int64_t step) override { lr_ = LearningRateAt(config_, step); }
  void Apply(int64_t /*begin*/, absl::Span<const float> grad,
             absl::Span<float> values) override {
    Run(grad.size(), functor::SgdUpdate{lr_, grad.data(), values.data()});
  }
  std::vector<std::pair<std::string, Tensor*>> slots() override { return {}; }

 private:
  const proto::TrainingConfig config_;
  float lr_ = 0;
};

class MomentumOptimizer : public Optimizer {
 public:
  MomentumOptimizer(const proto::TrainingConfig& config, int64_t n)
      : config_(config), accum_({n}) {}
  void BeginStep(int64_t step) override { lr_ = LearningRateAt(config_, step); }
  void Apply(int64_t begin, absl::Span<const float> grad,
             absl::Span<float> values) override {
    float* accum = accum_.data() + begin;
    const float m = config_.momentum();
    if (config_.use_nesterov()) {
      Run(grad.size(), functor::NesterovMomentumUpdate{lr_, m, grad.data(), accum,
                                                       values.data()});
    } else {
      Run(grad.size(),
          functor::MomentumUpdate{lr_, m, grad.data(), accum, values.data()});
    }
  }
  std::vector<std::pair<std::string, Tensor*>> slots() override {
    return {{"Momentum", &accum_}};
  }

 private:
  const proto::TrainingConfig config_;
  Tensor accum_;
  float lr_ = 0;
};

class AdagradOptimizer : public Optimizer {
 public:
  AdagradOptimizer(const proto::TrainingConfig& config, int64_t n)
      : config_(config), accum_({n}) {
    std::fill_n(accum_.data(), n, config.initial_accumulator_value());
  }
  void BeginStep(int64_t step) override { lr_ = LearningRateAt(config_, step); }
  void Apply(int64_t begin, absl::Span<const float> grad,
             absl::Span<float> values) override {
    Run(grad.size(), functor::AdagradUpdate{lr_, grad.data(), accum_.data() + begin,
                                            values.data()});
  }
  std::vector<std::pair<std::string, Tensor*>> slots() override {
    return {{"Adagrad", &accum_}};
  }

 private:
  const proto::TrainingConfig config_;
  Tensor accum_;
  float lr_ = 0;
};

class RmsPropOptimizer : public Optimizer {
 public:
  RmsPropOptimizer(const proto::TrainingConfig& config, int64_t n)
      : config_(config), ms_({n}), mom_({n}) {
    std::fill_n(ms_.data(), n, 1.0f);  // TensorFlow starts "rms" at one.
  }
  void BeginStep(int64_t step) override { lr_ = LearningRateAt(config_, step); }
  void Apply(int64_t begin, absl::Span<const float> grad,
             absl::Span<float> values) override {
    Run(grad.size(), functor::RmsPropUpdate{lr_, config_.rho(), config_.momentum(),
                                            config_.epsilon(), grad.data(),
                                            ms_.data() + begin, mom_.data() + begin,
                                            values.data()});
  }
  std::vector<std::pair<std::string, Tensor*>> slots() override {
    return {{"RMSProp", &ms_}, {"RMSProp_1", &mom_}};
  }

 private:
  const proto::TrainingConfig config_;
  Tensor ms_;
  Tensor mom_;
  float lr_ = 0;
};

class AdamOptimizer : public Optimizer {
 public:
  AdamOptimizer(const proto::TrainingConfig& config, int64_t n)
      : config_(config), m_({n}), v_({n}) {}
  void BeginStep(int64_t step) override {
    // Update number step + 1 (TensorFlow's beta powers start at beta^1).
    const double t = static_cast<double>(step) + 1;
    lr_t_ = LearningRateAt(config_, step) *
            std::sqrt(1 - std::pow(double{config_.beta2()}, t)) /
            (1 - std::pow(double{config_.beta1()}, t));
  }
  void Apply(int64_t begin, absl::Span<const float> grad,
             absl::Span<float> values) override {
    Run(grad.size(), functor::AdamUpdate{lr_t_, config_.beta1(), config_.beta2(),
                                         config_.epsilon(), grad.data(),
                                         m_.data() + begin, v_.data() + begin,
                                         values.data()});
  }
  std::vector<std::pair<std::string, Tensor*>> slots() override {
    return {{"Adam", &m_}, {"Adam_1", &v_}};
  }

 private:
  const proto::TrainingConfig config_;
  Tensor m_;
  Tensor v_;
  float lr_t_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> NewOptimizer(
    const proto::TrainingConfig& config, int64_t num_elements) {
  RETURN_IF_ERROR(ValidateTrainingConfig(config));
  switch (config.optimizer()) {
    case proto::SGD:
      return std::make_unique<SgdOptimizer>(config);
    case proto::MOMENTUM:
      return std::make_unique<MomentumOptimizer>(config, num_elements);
    case proto::ADAGRAD:
      return std::make_unique<AdagradOptimizer>(config, num_elements);
    case proto::RMSPROP:
      return std::make_unique<RmsPropOptimizer>(config, num_elements);
    case proto::ADAM:
      return std::make_unique<AdamOptimizer>(config, num_elements);
    default:  // ValidateTrainingConfig refuses the others.
      LOG(FATAL) << "unreachable";
  }
}

}  // namespace psrt
