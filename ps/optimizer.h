// Optimizer: the update rule a parameter-server shard applies to its values.
//
// A shard keeps all its variables in one flat float buffer; every optimizer
// here is element-wise, so it updates any range of that buffer on its own
// (the shard applies gradients block by block as they come off the wire)
// and keeps its slots (e.g. momentum accumulators) in buffers of the same
// layout. The math
// is the kernels' shared functors (kernels/elementwise.h), the same code the
// CUDA path runs.
//
// Thread safety: Apply may run concurrently on disjoint ranges (the shard's
// threads split one update); nothing else may run concurrently.
#ifndef PSRT_PS_OPTIMIZER_H_
#define PSRT_PS_OPTIMIZER_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/psrt.pb.h"

namespace psrt {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Applies one (already averaged) gradient to elements
  // [begin, begin + grad.size()) of the shard's buffer; `values` are those
  // elements. REQUIRES: grad.size() == values.size() and the range lies
  // within the size given at creation.
  virtual void Apply(int64_t begin, absl::Span<const float> grad,
                     absl::Span<float> values) = 0;
};

// Errors: InvalidArgument for an unknown optimizer or a bad hyperparameter
// (non-positive learning rate, momentum outside [0, 1)).
absl::StatusOr<std::unique_ptr<Optimizer>> NewOptimizer(
    const proto::TrainingConfig& config, int64_t num_elements);

}  // namespace psrt

#endif  // PSRT_PS_OPTIMIZER_H_
