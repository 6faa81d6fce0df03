// Towers: in-graph replication inside one worker, as in TensorFlow's
// multi-GPU examples. A batch is split into N slices; tower i computes the
// gradients of slice i on its own device (its own Model instance, on GPU i
// with its own stream), one thread per tower; the towers' gradients, copied
// to the host as each tower's backward produces them, are averaged there,
// weighted by slice size, into one gradient for the whole batch, which the
// worker pushes once. The average equals the gradient of the whole batch on
// one device (tested on CPU towers, and on GPU towers where a GPU is).
//
// Thread safety: not thread-safe; one trainer drives it.
#ifndef PSRT_WORKER_TRAINING_TOWERS_H_
#define PSRT_WORKER_TRAINING_TOWERS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/tensor.h"
#include "kernels/device.h"
#include "models/model.h"

namespace psrt {

// The device of each tower, from the worker's --device (auto, cpu or gpu)
// and --num_gpus (towers, one per GPU), given the GPUs this process sees:
// auto is the GPUs when any is visible, else the CPU. InvalidArgument naming
// the flag for an unknown --device, --device=gpu with no GPU visible, more
// GPUs than are visible, or --num_gpus > 1 on the CPU.
absl::StatusOr<std::vector<kernels::DeviceSpec>> ChooseTowerDevices(
    absl::string_view device, int num_gpus, int visible_gpus);

class Towers {
 public:
  // REQUIRES: towers is non-empty; every model has the same variables.
  explicit Towers(std::vector<std::unique_ptr<Model>> towers);

  int size() const { return static_cast<int>(towers_.size()); }
  Model* tower(int i) { return towers_[i].get(); }

  // Splits the batch (the first batch % N towers get one extra example),
  // computes every tower's gradients and writes their size-weighted mean
  // into `grads`; returns the mean loss over the batch. `hooks` (model.h)
  // see each layer with one tower, and the whole model at once with several.
  // REQUIRES: images has at least size() rows.
  // After a device fault (status()) the result is meaningless and the
  // hooks announce nothing more.
  // Where the batches fed to ComputeGradients are best kept: the one
  // tower's input_allocator (models/model.h); null with several towers,
  // which copy their slices anyway.
  HostAllocator* input_allocator() const;
  float ComputeGradients(const std::vector<Tensor>& params, const Tensor& images,
                         absl::Span<const int32_t> labels, std::vector<Tensor>* grads,
                         const StepHooks& hooks = StepHooks());

  // The first device fault of any tower (Model::status); OK on the CPU.
  absl::Status status() const;

 private:
  std::vector<std::unique_ptr<Model>> towers_;
  std::vector<Tensor> slices_;                  // Per tower, reused.
  std::vector<std::vector<Tensor>> tower_grads_;  // Per tower, reused.
};

}  // namespace psrt

#endif  // PSRT_WORKER_TRAINING_TOWERS_H_
