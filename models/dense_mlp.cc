#include "models/dense_mlp.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "kernels/ops.h"
#include "models/initializers.h"

namespace psrt {

int VariableList::Add(std::string name, Shape shape, double stddev) {
  defs_.push_back({std::move(name), std::move(shape)});
  stddevs_.push_back(stddev);
  return size() - 1;
}

void VariableList::Initialize(uint64_t seed, std::vector<Tensor>* params) const {
  std::mt19937_64 rng(seed);
  params->resize(defs_.size());
  for (size_t v = 0; v < defs_.size(); ++v) {
    Tensor& t = (*params)[v];
    t = Tensor(defs_[v].shape);  // Zeros.
    if (stddevs_[v] == 0) continue;
    for (float& x : t.flat()) {
      x = init::TruncatedNormal(rng, stddevs_[v] / init::kTruncatedNormalStddev);
    }
  }
}

DenseMlp::DenseMlp(const std::string& scope, int64_t in, const std::vector<int>& units,
                   bool relu_last, VariableList* vars)
    : in_(in), outputs_(units.size()) {
  CHECK_GE(in, 1) << scope;
  CHECK(!units.empty()) << scope;
  for (size_t l = 0; l < units.size(); ++l) {
    CHECK_GE(units[l], 1) << scope;
    Layer layer;
    layer.in = l == 0 ? in : units[l - 1];
    layer.units = units[l];
    layer.relu = relu_last || l + 1 < units.size();
    const std::string name = absl::StrCat(scope, "/layer", l);
    layer.weights = vars->Add(name + "/weights", {layer.in, layer.units},
                              std::sqrt((layer.relu ? 2.0 : 1.0) / layer.in));
    layer.biases = vars->Add(name + "/biases", {layer.units}, 0);
    layers_.push_back(layer);
  }
}

const float* DenseMlp::Forward(const kernels::CpuContext& ctx,
                               const std::vector<Tensor>& params, const float* x,
                               int64_t batch) {
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& layer = layers_[l];
    float* y = workspace_.Get(static_cast<int>(2 * l), batch * layer.units);
    kernels::MatMulForward(ctx, {batch, layer.units, layer.in}, x,
                           params[layer.weights].data(), y);
    kernels::BiasAddForward(ctx, y, params[layer.biases].data(), batch, layer.units, y);
    if (layer.relu) kernels::ReluForward(ctx, y, batch * layer.units, y);
    outputs_[l] = y;
    x = y;
  }
  return outputs_.back();
}

void DenseMlp::Backward(const kernels::CpuContext& ctx, const std::vector<Tensor>& params,
                        const float* x, int64_t batch, float* dy, float* dx,
                        std::vector<Tensor>* grads) {
  for (size_t l = layers_.size(); l-- > 0;) {
    const Layer& layer = layers_[l];
    const int64_t n = batch * layer.units;
    if (layer.relu) kernels::ReluBackward(ctx, outputs_[l], dy, n, dy);
    kernels::BiasAddBackward(ctx, dy, batch, layer.units, (*grads)[layer.biases].data());
    const float* layer_x = l == 0 ? x : outputs_[l - 1];
    float* layer_dx = l == 0 ? dx : workspace_.Get(static_cast<int>(2 * l + 1), batch * layer.in);
    kernels::MatMulBackward(ctx, {batch, layer.units, layer.in}, layer_x,
                            params[layer.weights].data(), dy, layer_dx,
                            (*grads)[layer.weights].data());
    dy = layer_dx;
  }
}

}  // namespace psrt
