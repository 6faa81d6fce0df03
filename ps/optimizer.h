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
// Thread safety: BeginStep, then Apply concurrently on disjoint ranges, then
// the next BeginStep; nothing else concurrently.
#ifndef PSRT_PS_OPTIMIZER_H_
#define PSRT_PS_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <string>
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
  virtual void Apply(int64_t begin, absl::Span<const float> grad,
                     absl::Span<float> values) = 0;

  // The slots, named like TensorFlow's ("Momentum", "Adam", "Adam_1", ...),
  // each of the shard's size: checkpoints save and restore them.
  virtual std::vector<std::pair<std::string, Tensor*>> slots() = 0;
};

// Errors: those of ValidateTrainingConfig (common/training_config.h).
absl::StatusOr<std::unique_ptr<Optimizer>> NewOptimizer(
    const proto::TrainingConfig& config, int64_t num_elements);

}  // namespace psrt

#endif  // PSRT_PS_OPTIMIZER_H_
