#include "models/mlp.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "kernels/cpu_context.h"
#include "kernels/ops.h"
#include "models/initializers.h"

namespace psrt {
namespace {

using kernels::MatMulShape;

// Gives t the shape [rows, cols], keeping its storage (and its shape vector)
// when it already has that shape.
void EnsureMatrix(Tensor* t, int64_t rows, int64_t cols) {
  if (t->rank() != 2 || t->dim(0) != rows || t->dim(1) != cols) {
    t->Resize({rows, cols});
  }
}

void EnsureShape(Tensor* t, const Shape& shape) {
  if (t->shape() != shape) t->Resize(shape);
}

// The MLP of mlp.h. Layer l (0-based; the last is softmax_linear) maps
// layer_sizes_[l] inputs to layer_sizes_[l + 1] outputs with the variables
// params[2l] (weights) and params[2l + 1] (biases).
//
// Thread safety: not thread-safe (the scratch tensors), as Model says.
class Mlp : public Model {
 public:
  explicit Mlp(const ModelOptions& options) : ctx_(options.intra_op_threads) {
    layer_sizes_.push_back(int64_t{options.input_height} * options.input_width *
                           options.input_channels);
    for (int units : options.hidden_units) layer_sizes_.push_back(units);
    layer_sizes_.push_back(options.num_classes);
    const int layers = num_layers();
    for (int l = 0; l < layers; ++l) {
      const std::string scope = l + 1 < layers ? absl::StrCat("hidden", l + 1)
                                               : std::string("softmax_linear");
      variables_.push_back(
          {scope + "/weights", {layer_sizes_[l], layer_sizes_[l + 1]}});
      variables_.push_back({scope + "/biases", {layer_sizes_[l + 1]}});
    }
    activations_.resize(layers);
    deltas_.resize(layers);
  }

  const std::vector<VariableDef>& variables() const override {
    return variables_;
  }
  std::string device_name() const override {
    return absl::StrCat("cpu (", ctx_.num_threads(), " threads)");
  }
  kernels::DeviceMemoryStats device_memory() const override { return {}; }

  void Initialize(uint64_t seed, std::vector<Tensor>* params) const override {
    std::mt19937_64 rng(seed);
    params->resize(variables_.size());
    for (int l = 0; l < num_layers(); ++l) {
      Tensor& weights = (*params)[2 * l];
      Tensor& biases = (*params)[2 * l + 1];
      weights.Resize(variables_[2 * l].shape);
      biases.Resize(variables_[2 * l + 1].shape);
      const double stddev = 1.0 / std::sqrt(double(layer_sizes_[l]));
      for (float& w : weights.flat()) w = init::TruncatedNormal(rng, stddev);
      biases.SetZero();
    }
  }

  float ComputeGradients(const std::vector<Tensor>& params,
                         const Tensor& images, absl::Span<const int32_t> labels,
                         std::vector<Tensor>* grads) override {
    CheckInputs(params, images, labels);
    const int64_t batch = images.dim(0);
    Forward(params, images);
    const int last = num_layers() - 1;
    const Tensor& logits = activations_[last];
    const float loss = kernels::SoftmaxCrossEntropyForward(
        ctx_, logits.data(), labels.data(), batch, num_classes());
    EnsureMatrix(&deltas_[last], batch, num_classes());
    kernels::SoftmaxCrossEntropyBackward(ctx_, logits.data(), labels.data(),
                                         batch, num_classes(),
                                         deltas_[last].data());

    grads->resize(params.size());
    // deltas_[l] holds d(loss)/d(pre-activation of layer l).
    for (int l = last; l >= 0; --l) {
      const float* input = l == 0 ? images.data() : activations_[l - 1].data();
      Tensor& dweights = (*grads)[2 * l];
      Tensor& dbiases = (*grads)[2 * l + 1];
      EnsureShape(&dweights, variables_[2 * l].shape);
      EnsureShape(&dbiases, variables_[2 * l + 1].shape);
      // The input images need no gradient: skip d(input) of layer 0.
      float* dinput = nullptr;
      if (l > 0) {
        EnsureMatrix(&deltas_[l - 1], batch, layer_sizes_[l]);
        dinput = deltas_[l - 1].data();
      }
      kernels::MatMulBackward(ctx_, LayerShape(l, batch), input,
                              params[2 * l].data(), deltas_[l].data(), dinput,
                              dweights.data());
      kernels::BiasAddBackward(ctx_, deltas_[l].data(), batch,
                               layer_sizes_[l + 1], dbiases.data());
      if (l > 0) {
        kernels::ReluBackward(ctx_, activations_[l - 1].data(), dinput,
                              batch * layer_sizes_[l], dinput);
      }
    }
    return loss;
  }

  int64_t CountCorrect(const std::vector<Tensor>& params, const Tensor& images,
                       absl::Span<const int32_t> labels) override {
    CheckInputs(params, images, labels);
    Forward(params, images);
    const float* logits = activations_.back().data();
    const int64_t classes = num_classes();
    int64_t correct = 0;
    for (int64_t r = 0; r < images.dim(0); ++r) {
      const float* row = logits + r * classes;
      int64_t best = 0;
      for (int64_t c = 1; c < classes; ++c) {
        if (row[c] > row[best]) best = c;
      }
      if (best == labels[r]) ++correct;
    }
    return correct;
  }

 private:
  int num_layers() const { return static_cast<int>(layer_sizes_.size()) - 1; }
  int64_t num_classes() const { return layer_sizes_.back(); }

  // activations[batch, in] * weights[in, out] for layer l.
  MatMulShape LayerShape(int l, int64_t batch) const {
    return MatMulShape{batch, layer_sizes_[l + 1], layer_sizes_[l]};
  }

  // The model's inputs must match its variables; a mismatch is a bug in the
  // caller (the trainer builds both from variables()).
  void CheckInputs(const std::vector<Tensor>& params, const Tensor& images,
                   absl::Span<const int32_t> labels) const {
    CHECK_EQ(params.size(), variables_.size()) << "wrong number of parameters";
    for (size_t i = 0; i < params.size(); ++i) {
      CHECK(params[i].shape() == variables_[i].shape)
          << variables_[i].name << " has shape "
          << ShapeToString(params[i].shape()) << ", want "
          << ShapeToString(variables_[i].shape);
    }
    CHECK(images.rank() == 2 && images.dim(0) >= 1 &&
          images.dim(1) == layer_sizes_[0])
        << "images have shape " << ShapeToString(images.shape())
        << ", want [batch >= 1, " << layer_sizes_[0] << "]";
    CHECK_EQ(static_cast<int64_t>(labels.size()), images.dim(0))
        << "one label per image";
  }

  // Fills activations_: ReLU outputs of the hidden layers, then the logits.
  void Forward(const std::vector<Tensor>& params, const Tensor& images) {
    const int64_t batch = images.dim(0);
    const int last = num_layers() - 1;
    for (int l = 0; l <= last; ++l) {
      const float* input = l == 0 ? images.data() : activations_[l - 1].data();
      const int64_t out = layer_sizes_[l + 1];
      Tensor& output = activations_[l];
      EnsureMatrix(&output, batch, out);
      kernels::MatMulForward(ctx_, LayerShape(l, batch), input,
                             params[2 * l].data(), output.data());
      kernels::BiasAddForward(ctx_, output.data(), params[2 * l + 1].data(),
                              batch, out, output.data());
      if (l < last) {
        kernels::ReluForward(ctx_, output.data(), batch * out, output.data());
      }
    }
  }

  kernels::CpuContext ctx_;
  std::vector<int64_t> layer_sizes_;  // Input, hidden layers, classes.
  std::vector<VariableDef> variables_;
  // Scratch, reused from call to call: the output of every layer (the last
  // is the logits) and d(loss)/d(pre-activation) of every layer.
  std::vector<Tensor> activations_;
  std::vector<Tensor> deltas_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> NewMlp(const ModelOptions& options) {
  if (options.device.type != kernels::DeviceType::kCpu) {
    return absl::InvalidArgumentError(
        "mlp runs on the CPU only; the models that run on a GPU are lenet, "
        "inception_mini and inception_v3 (or use --device=cpu)");
  }
  if (options.input_height <= 0 || options.input_width <= 0 ||
      options.input_channels <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MLP input size must be positive, got ", options.input_height, "x",
        options.input_width, "x", options.input_channels));
  }
  if (options.num_classes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MLP num_classes must be positive, got ", options.num_classes));
  }
  for (int units : options.hidden_units) {
    if (units <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("MLP hidden_units must be positive, got ", units));
    }
  }
  return std::unique_ptr<Model>(new Mlp(options));
}

}  // namespace psrt
