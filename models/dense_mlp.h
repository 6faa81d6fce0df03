// DenseMlp: a stack of fully connected layers on the CPU, the dense part
// the CTR models (ctr_models.h) are built from: DLRM's bottom and top MLPs
// and Wide & Deep's deep MLP. Internal to models/.
//
// Layer l computes y_l = x_l * W_l + b_l, then max(y_l, 0) for every layer
// but (unless relu_last) the last; x_0 is the input [batch, in]. Its
// variables, declared in a VariableList: "<scope>/layer<l>/weights"
// [in_l, units_l] and "<scope>/layer<l>/biases" [units_l], weights
// truncated normal with stddev sqrt(2 / in_l) before a ReLU, sqrt(1 / in_l)
// otherwise, biases 0 (as net.h's layers).
//
// Memory: the activations and their gradients live in the stack's own
// workspace, so that after the first step at a batch size nothing is
// allocated.
//
// Thread safety: not thread-safe (the workspace); the ops run on the
// CpuContext passed in.
#ifndef PSRT_MODELS_DENSE_MLP_H_
#define PSRT_MODELS_DENSE_MLP_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/tensor.h"
#include "kernels/cpu_context.h"
#include "kernels/workspace.h"

namespace psrt {

// A model's variables in order, each with how it starts: a truncated
// normal of `stddev` (its actual standard deviation, as net.h's
// VariableInit) or, for stddev 0, zeros.
//
// Thread safety: built by one thread, then its const methods may be called
// from several.
class VariableList {
 public:
  // Appends a variable; returns its index.
  int Add(std::string name, Shape shape, double stddev);
  int size() const { return static_cast<int>(defs_.size()); }
  const std::vector<VariableDef>& defs() const { return defs_; }
  // Resizes `params` to one tensor per variable and fills them from `seed`.
  void Initialize(uint64_t seed, std::vector<Tensor>* params) const;

 private:
  std::vector<VariableDef> defs_;
  std::vector<double> stddevs_;
};

class DenseMlp {
 public:
  // Declares the layers' variables in `vars`. REQUIRES: in >= 1, units
  // non-empty and positive.
  DenseMlp(const std::string& scope, int64_t in, const std::vector<int>& units,
           bool relu_last, VariableList* vars);

  int64_t in_size() const { return in_; }
  int64_t out_size() const { return layers_.back().units; }

  // The stack applied to x [batch, in]: [batch, out_size()] in the stack's
  // workspace, valid until the next Forward. `params` holds every variable
  // of the model, in VariableList order.
  const float* Forward(const kernels::CpuContext& ctx, const std::vector<Tensor>& params,
                       const float* x, int64_t batch);

  // The backward of the last Forward, whose x is passed again: from
  // dy = dL/dy [batch, out_size()] (overwritten: used as scratch), overwrites
  // the gradients of the stack's variables in `grads` and dx = dL/dx
  // [batch, in] (null: not needed).
  void Backward(const kernels::CpuContext& ctx, const std::vector<Tensor>& params,
                const float* x, int64_t batch, float* dy, float* dx, std::vector<Tensor>* grads);

  // Floats held by the workspace (for memory reports).
  int64_t workspace_capacity() const { return workspace_.capacity(); }

 private:
  struct Layer {
    int64_t in;
    int64_t units;
    bool relu;
    int weights;  // Variable indices.
    int biases;
  };
  int64_t in_;
  std::vector<Layer> layers_;
  // Workspace slots: 2l holds layer l's output, 2l + 1 the gradient of its
  // input (l >= 1). outputs_[l] points at the last Forward's outputs.
  kernels::Workspace workspace_;
  std::vector<float*> outputs_;
};

}  // namespace psrt

#endif  // PSRT_MODELS_DENSE_MLP_H_
