#include "ps/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

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
  void ApplyTo(absl::Span<const float> grad, float* values,
               const SlotPointers& /*slots*/) const override {
    Run(grad.size(), functor::SgdUpdate{lr_, grad.data(), values});
  }

 private:
  const proto::TrainingConfig config_;
  float lr_ = 0;
};

class MomentumOptimizer : public Optimizer {
 public:
  MomentumOptimizer(const proto::TrainingConfig& config, int64_t n)
      : config_(config), accum_({n}) {
    AddSlot("Momentum", &accum_);
  }
  void BeginStep(int64_t step) override { lr_ = LearningRateAt(config_, step); }
  void ApplyTo(absl::Span<const float> grad, float* values,
               const SlotPointers& slots) const override {
    const float m = config_.momentum();
    if (config_.use_nesterov()) {
      Run(grad.size(), functor::NesterovMomentumUpdate{lr_, m, grad.data(), slots[0], values});
    } else {
      Run(grad.size(), functor::MomentumUpdate{lr_, m, grad.data(), slots[0], values});
    }
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
    AddSlot("Adagrad", &accum_, config.initial_accumulator_value());
  }
  void BeginStep(int64_t step) override { lr_ = LearningRateAt(config_, step); }
  void ApplyTo(absl::Span<const float> grad, float* values,
               const SlotPointers& slots) const override {
    Run(grad.size(), functor::AdagradUpdate{lr_, grad.data(), slots[0], values});
  }

 private:
  const proto::TrainingConfig config_;
  Tensor accum_;
  float lr_ = 0;
};

class FtrlOptimizer : public Optimizer {
 public:
  FtrlOptimizer(const proto::TrainingConfig& config, int64_t n)
      : config_(config), accum_({n}), linear_({n}) {
    AddSlot("Ftrl", &accum_, config.initial_accumulator_value());
    AddSlot("Ftrl_1", &linear_);
  }
  void BeginStep(int64_t step) override { lr_ = LearningRateAt(config_, step); }
  void ApplyTo(absl::Span<const float> grad, float* values,
               const SlotPointers& slots) const override {
    Run(grad.size(), functor::FtrlUpdate{lr_, config_.l1_regularization_strength(),
                                         config_.l2_regularization_strength(), grad.data(),
                                         slots[0], slots[1], values});
  }

 private:
  const proto::TrainingConfig config_;
  Tensor accum_;
  Tensor linear_;
  float lr_ = 0;
};

class RmsPropOptimizer : public Optimizer {
 public:
  RmsPropOptimizer(const proto::TrainingConfig& config, int64_t n)
      : config_(config), ms_({n}), mom_({n}) {
    AddSlot("RMSProp", &ms_, 1.0f);  // TensorFlow starts "rms" at one.
    AddSlot("RMSProp_1", &mom_);
  }
  void BeginStep(int64_t step) override { lr_ = LearningRateAt(config_, step); }
  void ApplyTo(absl::Span<const float> grad, float* values,
               const SlotPointers& slots) const override {
    Run(grad.size(), functor::RmsPropUpdate{lr_, config_.rho(), config_.momentum(),
                                            config_.epsilon(), grad.data(), slots[0],
                                            slots[1], values});
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
      : config_(config), m_({n}), v_({n}) {
    AddSlot("Adam", &m_);
    AddSlot("Adam_1", &v_);
  }
  void BeginStep(int64_t step) override {
    // Update number step + 1 (TensorFlow's beta powers start at beta^1).
    const double t = static_cast<double>(step) + 1;
    lr_t_ = LearningRateAt(config_, step) *
            std::sqrt(1 - std::pow(double{config_.beta2()}, t)) /
            (1 - std::pow(double{config_.beta1()}, t));
  }
  void ApplyTo(absl::Span<const float> grad, float* values,
               const SlotPointers& slots) const override {
    Run(grad.size(), functor::AdamUpdate{lr_t_, config_.beta1(), config_.beta2(),
                                         config_.epsilon(), grad.data(), slots[0], slots[1],
                                         values});
  }

 private:
  const proto::TrainingConfig config_;
  Tensor m_;
  Tensor v_;
  float lr_t_ = 0;
};

}  // namespace

void Optimizer::AddSlot(std::string name, Tensor* slot, float initial_value) {
  CHECK_LT(slots_.size(), static_cast<size_t>(kMaxSlots));
  if (initial_value != 0.0f) std::fill_n(slot->data(), slot->num_elements(), initial_value);
  slots_.emplace_back(std::move(name), slot);
  slot_initial_values_.push_back(initial_value);
}

void Optimizer::ApplyRow(absl::Span<const float> grad, float* values,
                         absl::Span<float* const> slots) const {
  CHECK_EQ(slots.size(), slots_.size());
  SlotPointers at{};
  std::copy(slots.begin(), slots.end(), at.begin());
  ApplyTo(grad, values, at);
}

void Optimizer::Apply(int64_t begin, absl::Span<const float> grad,
                      absl::Span<float> values) {
  SlotPointers at{};
  for (size_t i = 0; i < slots_.size(); ++i) at[i] = slots_[i].second->data() + begin;
  ApplyTo(grad, values.data(), at);
}

bool Optimizer::UpdateIsFinite(int64_t begin, absl::Span<const float> grad,
                               absl::Span<const float> values) {
  // The rule runs on copies, a cache-sized piece at a time.
  // On the heap, not in static TLS (which every thread's stack must hold).
  constexpr size_t kPiece = 4096;
  thread_local std::vector<float> buffer((1 + kMaxSlots) * kPiece);
  float* scratch[1 + kMaxSlots];
  for (int i = 0; i <= kMaxSlots; ++i) scratch[i] = buffer.data() + i * kPiece;
  for (size_t done = 0; done < grad.size(); done += kPiece) {
    const size_t n = std::min(kPiece, grad.size() - done);
    std::memcpy(scratch[0], values.data() + done, n * sizeof(float));
    SlotPointers at{};
    for (size_t i = 0; i < slots_.size(); ++i) {
      std::memcpy(scratch[1 + i], slots_[i].second->data() + begin + done, n * sizeof(float));
      at[i] = scratch[1 + i];
    }
    ApplyTo(grad.subspan(done, n), scratch[0], at);
    for (size_t i = 0; i <= slots_.size(); ++i) {
      if (kernels::FirstNonFinite({scratch[i], n}) >= 0) return false;
    }
  }
  return true;
}

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
    case proto::FTRL:
      return std::make_unique<FtrlOptimizer>(config, num_elements);
    default:  // ValidateTrainingConfig refuses the others.
      LOG(FATAL) << "unreachable";
  }
}

}  // namespace psrt
