// Optimizer: the update rule a parameter-server shard applies to its values,
// with TensorFlow's semantics and default hyperparameters:
//
//   SGD       var -= lr * g
//   MOMENTUM  accum = m * accum + g; var -= lr * accum
//             (Nesterov: var -= lr * (g + m * accum))     m: momentum = 0.9
//   ADAGRAD   accum += g^2; var -= lr * g / sqrt(accum)    accum starts at 0.1
//   RMSPROP   ms = rho * ms + (1 - rho) g^2; mom = m * mom + lr g / sqrt(ms + eps);
//             var -= mom                    rho 0.9, m 0, eps 1e-10, ms starts at 1
//   ADAM      TensorFlow's Adam, beta1 0.9, beta2 0.999, eps 1e-8
//   FTRL      TensorFlow's FtrlOptimizer (FTRL-proximal, learning_rate_power
//             -0.5), accum starts at 0.1, l1 and l2 default 0
//
// lr follows the config's LearningRateSchedule of the global step.
//
// A shard keeps all its variables in one flat float buffer; every rule is
// element-wise, so it updates any range of that buffer on its own (the shard
// applies gradients block by block, on several threads) and keeps its slots
// (accumulators) in buffers of the same layout. The math is the kernels'
// functors (kernels/functors.h, kernels/optimizer_functors.h), the same code
// a CUDA kernel runs.
//
// UpdateIsFinite runs the rule on copies of a range, so that a shard can
// refuse an update that would make a value or a slot NaN or Inf (a huge
// finite gradient overflowing an accumulator) before changing anything.
//
// Thread safety: BeginStep, then Apply and UpdateIsFinite concurrently on
// disjoint ranges, then the next BeginStep; nothing else concurrently.
#ifndef PSRT_PS_OPTIMIZER_H_
#define PSRT_PS_OPTIMIZER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/tensor.h"
#include "proto/psrt.pb.h"

namespace psrt {

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // Prepares the update of global step `step` (learning rate, Adam's bias
  // correction).
  virtual void BeginStep(int64_t step) = 0;

  // Applies one (already averaged) gradient to elements
  // [begin, begin + grad.size()) of the shard's buffer; `values` are those
  // elements. REQUIRES: grad.size() == values.size(), and the range lies
  // within the size given at creation.
  void Apply(int64_t begin, absl::Span<const float> grad, absl::Span<float> values);

  // Whether Apply(begin, grad, values) would leave every element of `values`
  // and of the slots finite. Changes nothing. Same REQUIRES as Apply.
  bool UpdateIsFinite(int64_t begin, absl::Span<const float> grad,
                      absl::Span<const float> values);

  // The slots, named like TensorFlow's ("Momentum", "Adam", "Adam_1", ...),
  // each of the shard's size: checkpoints save and restore them.
  const std::vector<std::pair<std::string, Tensor*>>& slots() const { return slots_; }
  int num_slots() const { return static_cast<int>(slots_.size()); }
  // What slot i holds before the first update (Adagrad's accumulator 0.1,
  // RMSProp's mean square 1, others 0).
  float slot_initial_value(int i) const { return slot_initial_values_[i]; }

  // The rule on memory of the caller's (an embedding table's rows, which
  // hold their own slots): `values` and slots[i] each point at grad.size()
  // elements, updated in place as Apply would. The optimizer's own slots
  // are not used, so one made for 0 elements serves. Between BeginStep and
  // the next, like Apply. REQUIRES: slots.size() == num_slots().
  void ApplyRow(absl::Span<const float> grad, float* values, absl::Span<float* const> slots) const;

 protected:
  static constexpr int kMaxSlots = 2;
  using SlotPointers = std::array<float*, kMaxSlots>;
  // Constructors name their slots, in the order ApplyTo takes them, and
  // fill them with their initial value.
  // REQUIRES: `slot` is a member of the optimizer; at most kMaxSlots.
  void AddSlot(std::string name, Tensor* slot, float initial_value = 0.0f);
  // The rule on one range: `values` and slots[i] (for each of slots()) point
  // at grad.size() elements, in place.
  virtual void ApplyTo(absl::Span<const float> grad, float* values,
                       const SlotPointers& slots) const = 0;

 private:
  std::vector<std::pair<std::string, Tensor*>> slots_;
  std::vector<float> slot_initial_values_;
};

// Errors: those of ValidateTrainingConfig (common/training_config.h).
absl::StatusOr<std::unique_ptr<Optimizer>> NewOptimizer(
    const proto::TrainingConfig& config, int64_t num_elements);

}  // namespace psrt

#endif  // PSRT_PS_OPTIMIZER_H_
