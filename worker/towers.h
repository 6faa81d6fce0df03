// Towers: in-graph replication inside one worker, as in TensorFlow's
// multi-GPU examples. A batch is split into N slices; tower i computes the
// gradients of slice i on its own device context (its own Model instance);
// the towers' gradients are averaged, weighted by slice size, into one
// gradient for the whole batch, which the worker pushes once.
//
// With CPU contexts (no GPU here) the towers run one per thread; the average
// then equals the gradient of the whole batch on one device (tested), which
// is the property the GPU version relies on.
//
// Thread safety: not thread-safe; one trainer drives it.
#ifndef PSRT_WORKER_TOWERS_H_
#define PSRT_WORKER_TOWERS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "common/tensor.h"
#include "models/model.h"

namespace psrt {

class Towers {
 public:
  // REQUIRES: towers is non-empty; every model has the same variables.
  explicit Towers(std::vector<std::unique_ptr<Model>> towers);

  int size() const { return static_cast<int>(towers_.size()); }
  Model* tower(int i) { return towers_[i].get(); }

  // Splits the batch (the first batch % N towers get one extra example),
  // computes every tower's gradients and writes their size-weighted mean
  // into `grads`; returns the mean loss over the batch.
  // REQUIRES: images has at least size() rows.
  float ComputeGradients(const std::vector<Tensor>& params, const Tensor& images,
                         absl::Span<const int32_t> labels, std::vector<Tensor>* grads);

 private:
  std::vector<std::unique_ptr<Model>> towers_;
  std::vector<Tensor> slices_;                  // Per tower, reused.
  std::vector<std::vector<Tensor>> tower_grads_;  // Per tower, reused.
};

}  // namespace psrt

#endif  // PSRT_WORKER_TOWERS_H_
