#include "models/net.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "kernels/cpu_context.h"
#include "kernels/elementwise.h"
#include "kernels/ops.h"
#include "kernels/workspace.h"
#include "models/initializers.h"

namespace psrt {

using kernels::Padding;

struct NetBuilder::Graph {
  struct Node {
    std::unique_ptr<Layer> layer;  // Null for the input.
    std::vector<int> inputs;
    Dims dims;
    std::string what;  // For error messages.
    int consumers = 0;
  };
  std::vector<Node> nodes;
  std::vector<VariableDef> variables;
  std::vector<VariableInit> inits;
};

namespace {

// Gives t the shape [rows, cols], keeping its storage (and shape vector)
// when it has that shape already.
void EnsureMatrix(Tensor* t, int64_t rows, int64_t cols) {
  if (t->rank() != 2 || t->dim(0) != rows || t->dim(1) != cols) {
    t->Resize({rows, cols});
  }
}

// The model built by NetBuilder: runs its graph's layers forward in node
// order and backward in reverse.
class NetModel : public Model {
 public:
  NetModel(const ModelOptions& options, NetBuilder::Graph graph)
      : graph_(std::move(graph)),
        ctx_(options.intra_op_threads),
        num_classes_(options.num_classes) {
    const size_t n = graph_.nodes.size();
    outputs_.resize(n);
    grads_.resize(n);
    grad_ready_.resize(n);
    in_ptrs_.resize(n);
    din_ptrs_.resize(n);
    for (size_t i = 1; i < n; ++i) {
      in_ptrs_[i].resize(graph_.nodes[i].inputs.size());
      din_ptrs_[i].resize(graph_.nodes[i].inputs.size());
    }
    temps_.resize(n);
  }

  const std::vector<VariableDef>& variables() const override {
    return graph_.variables;
  }

  void Initialize(uint64_t seed, std::vector<Tensor>* params) const override {
    // A truncated normal cut at 2 sigma has 0.8796 of its sigma.
    constexpr double kTruncatedStddev = 0.87962566103423978;
    std::mt19937_64 rng(seed);
    params->resize(graph_.variables.size());
    for (size_t v = 0; v < graph_.variables.size(); ++v) {
      Tensor& t = (*params)[v];
      t.Resize(graph_.variables[v].shape);
      const VariableInit& init = graph_.inits[v];
      for (float& x : t.flat()) {
        x = init.stddev > 0
                ? init::TruncatedNormal(rng, init.stddev / kTruncatedStddev)
                : init.value;
      }
    }
  }

  float ComputeGradients(const std::vector<Tensor>& params,
                         const Tensor& images, absl::Span<const int32_t> labels,
                         std::vector<Tensor>* grads) override {
    CheckInputs(params, images, labels);
    const int64_t batch = images.dim(0);
    const StepContext step{ctx_, &workspace_, /*training=*/true, step_++};
    Forward(step, params, images);
    const int last = static_cast<int>(graph_.nodes.size()) - 1;
    const float* logits = outputs_[last].data();
    const float loss = kernels::SoftmaxCrossEntropyForward(
        ctx_, logits, labels.data(), batch, num_classes_);

    grads->resize(params.size());
    for (size_t v = 0; v < params.size(); ++v) {
      if ((*grads)[v].shape() != params[v].shape()) {
        (*grads)[v].Resize(params[v].shape());
      }
    }
    std::fill(grad_ready_.begin(), grad_ready_.end(), false);
    EnsureMatrix(&grads_[last], batch, num_classes_);
    kernels::SoftmaxCrossEntropyBackward(ctx_, logits, labels.data(), batch,
                                         num_classes_, grads_[last].data());
    grad_ready_[last] = true;
    for (int i = last; i >= 1; --i) {
      const NetBuilder::Graph::Node& node = graph_.nodes[i];
      CHECK(grad_ready_[i]) << node.what << " does not reach the logits";
      bool accumulate[8] = {};
      CHECK_LE(node.inputs.size(), 8u);
      for (size_t j = 0; j < node.inputs.size(); ++j) {
        const int in = node.inputs[j];
        Tensor* din = nullptr;
        if (in != NetBuilder::kInput) {
          const int64_t size = graph_.nodes[in].dims.size();
          if (!grad_ready_[in]) {
            din = &grads_[in];
            grad_ready_[in] = true;
          } else {
            din = &temps_[in];
            accumulate[j] = true;
          }
          EnsureMatrix(din, batch, size);
        }
        din_ptrs_[i][j] = din;
      }
      SetInputs(i, images);
      node.layer->Backward(step, params, in_ptrs_[i], outputs_[i], batch,
                           &grads_[i], din_ptrs_[i], grads);
      for (size_t j = 0; j < node.inputs.size(); ++j) {
        if (accumulate[j]) {
          kernels::Accumulate(temps_[node.inputs[j]].flat(),
                              grads_[node.inputs[j]].flat());
        }
      }
    }
    return loss;
  }

  int64_t CountCorrect(const std::vector<Tensor>& params, const Tensor& images,
                       absl::Span<const int32_t> labels) override {
    CheckInputs(params, images, labels);
    const StepContext step{ctx_, &workspace_, /*training=*/false, step_};
    Forward(step, params, images);
    const float* logits = outputs_.back().data();
    int64_t correct = 0;
    for (int64_t r = 0; r < images.dim(0); ++r) {
      const float* row = logits + r * num_classes_;
      int64_t best = 0;
      for (int64_t c = 1; c < num_classes_; ++c) {
        if (row[c] > row[best]) best = c;
      }
      if (best == labels[r]) ++correct;
    }
    return correct;
  }

 private:
  void SetInputs(int i, const Tensor& images) {
    const std::vector<int>& inputs = graph_.nodes[i].inputs;
    for (size_t j = 0; j < inputs.size(); ++j) {
      in_ptrs_[i][j] =
          inputs[j] == NetBuilder::kInput ? &images : &outputs_[inputs[j]];
    }
  }

  void Forward(const StepContext& step, const std::vector<Tensor>& params,
               const Tensor& images) {
    const int64_t batch = images.dim(0);
    for (size_t i = 1; i < graph_.nodes.size(); ++i) {
      const NetBuilder::Graph::Node& node = graph_.nodes[i];
      SetInputs(i, images);
      EnsureMatrix(&outputs_[i], batch, node.dims.size());
      node.layer->Forward(step, params, in_ptrs_[i], batch, &outputs_[i]);
    }
  }

  // The inputs must match the variables; a mismatch is a bug in the caller
  // (the trainer builds both from variables()).
  void CheckInputs(const std::vector<Tensor>& params, const Tensor& images,
                   absl::Span<const int32_t> labels) const {
    CHECK_EQ(params.size(), graph_.variables.size())
        << "wrong number of parameters";
    for (size_t i = 0; i < params.size(); ++i) {
      CHECK(params[i].shape() == graph_.variables[i].shape)
          << graph_.variables[i].name << " has shape "
          << ShapeToString(params[i].shape()) << ", want "
          << ShapeToString(graph_.variables[i].shape);
    }
    const int64_t size = graph_.nodes[0].dims.size();
    CHECK(images.rank() == 2 && images.dim(0) >= 1 && images.dim(1) == size)
        << "images have shape " << ShapeToString(images.shape())
        << ", want [batch >= 1, " << size << "]";
    CHECK_EQ(static_cast<int64_t>(labels.size()), images.dim(0))
        << "one label per image";
  }

  const NetBuilder::Graph graph_;
  kernels::CpuContext ctx_;
  const int64_t num_classes_;
  kernels::Workspace workspace_;
  uint64_t step_ = 0;
  // Per node, reused from step to step: its output, d(loss)/d(output),
  // whether that gradient has been written in this backward, and the
  // pointer lists handed to its layer.
  std::vector<Tensor> outputs_;
  std::vector<Tensor> grads_;
  std::vector<bool> grad_ready_;
  std::vector<std::vector<const Tensor*>> in_ptrs_;
  std::vector<std::vector<Tensor*>> din_ptrs_;
  // Per node read by several layers: a later consumer's share of its
  // gradient, added into grads_ after that consumer's backward. (One per
  // node, so that each keeps its shape from step to step.)
  std::vector<Tensor> temps_;
};

}  // namespace

NetBuilder::NetBuilder(const ModelOptions& options)
    : options_(options), graph_(std::make_unique<Graph>()) {
  Graph::Node input;
  input.dims =
      Dims{options.input_height, options.input_width, options.input_channels};
  input.what = "input";
  graph_->nodes.push_back(std::move(input));
}

NetBuilder::~NetBuilder() = default;

Dims NetBuilder::dims(int node) const { return graph_->nodes.at(node).dims; }

int NetBuilder::Add(std::unique_ptr<Layer> layer, std::vector<int> inputs,
                    Dims dims, const std::string& what) {
  for (int in : inputs) {
    CHECK(in >= 0 && in < static_cast<int>(graph_->nodes.size()))
        << what << " reads node " << in << ", which does not exist";
    ++graph_->nodes[in].consumers;
  }
  if (status_.ok() && (dims.height <= 0 || dims.width <= 0)) {
    const Dims in = graph_->nodes[inputs[0]].dims;
    status_ = absl::InvalidArgumentError(absl::StrCat(
        what, " does not fit its ", in.height, "x", in.width, " input"));
  }
  Graph::Node node;
  node.layer = std::move(layer);
  node.inputs = std::move(inputs);
  node.dims = dims;
  node.what = what;
  graph_->nodes.push_back(std::move(node));
  return static_cast<int>(graph_->nodes.size()) - 1;
}

void NetBuilder::AddVariable(const std::string& name, Shape shape,
                             VariableInit init) {
  graph_->variables.push_back({name, std::move(shape)});
  graph_->inits.push_back(init);
}

int NetBuilder::Conv(const std::string& scope, int input,
                     const ConvSpec& spec) {
  const Dims in = dims(input);
  const int first_var = static_cast<int>(graph_->variables.size());
  const int64_t fan_in = spec.filter_height * spec.filter_width * in.channels;
  AddVariable(
      scope + "/weights",
      {spec.filter_height, spec.filter_width, in.channels, spec.out_channels},
      {std::sqrt((spec.relu ? 2.0 : 1.0) / fan_in), 0});
  if (spec.bias) AddVariable(scope + "/biases", {spec.out_channels}, {0, 0});
  if (spec.batch_norm) {
    AddVariable(scope + "/BatchNorm/gamma", {spec.out_channels}, {0, 1});
    AddVariable(scope + "/BatchNorm/beta", {spec.out_channels}, {0, 0});
  }
  const Dims out{kernels::WindowOutputSize(in.height, spec.filter_height,
                                           spec.stride, spec.padding),
                 kernels::WindowOutputSize(in.width, spec.filter_width,
                                           spec.stride, spec.padding),
                 spec.out_channels};
  return Add(NewConvLayer(spec, in, first_var), {input}, out, scope);
}

int NetBuilder::FullyConnected(const std::string& scope, int input,
                               int64_t units, bool relu) {
  const Dims in = dims(input);
  const int first_var = static_cast<int>(graph_->variables.size());
  AddVariable(scope + "/weights", {in.size(), units},
              {std::sqrt((relu ? 2.0 : 1.0) / in.size()), 0});
  AddVariable(scope + "/biases", {units}, {0, 0});
  return Add(NewFullyConnectedLayer(in, units, relu, first_var), {input},
             Dims{1, 1, units}, scope);
}

int NetBuilder::MaxPool(int input, int64_t window, int64_t stride,
                        Padding padding) {
  const Dims in = dims(input);
  const Dims out{kernels::WindowOutputSize(in.height, window, stride, padding),
                 kernels::WindowOutputSize(in.width, window, stride, padding),
                 in.channels};
  return Add(NewPoolLayer(true, window, stride, padding, in), {input}, out,
             absl::StrCat("max pool after ", graph_->nodes[input].what));
}

int NetBuilder::AvgPool(int input, int64_t window, int64_t stride,
                        Padding padding) {
  const Dims in = dims(input);
  const Dims out{kernels::WindowOutputSize(in.height, window, stride, padding),
                 kernels::WindowOutputSize(in.width, window, stride, padding),
                 in.channels};
  return Add(NewPoolLayer(false, window, stride, padding, in), {input}, out,
             absl::StrCat("avg pool after ", graph_->nodes[input].what));
}

int NetBuilder::GlobalAvgPool(int input) {
  const Dims in = dims(input);
  return Add(NewGlobalAvgPoolLayer(in), {input}, Dims{1, 1, in.channels},
             "global avg pool");
}

int NetBuilder::Concat(const std::vector<int>& inputs) {
  CHECK(!inputs.empty());
  const Dims first = dims(inputs[0]);
  std::vector<int64_t> channels;
  Dims out{first.height, first.width, 0};
  for (size_t i = 0; i < inputs.size(); ++i) {
    const int in = inputs[i];
    for (size_t j = 0; j < i; ++j) {
      CHECK_NE(inputs[j], in) << "node " << in << " concatenated twice";
    }
    const Dims d = dims(in);
    CHECK(d.height == first.height && d.width == first.width)
        << "concat of " << first.height << "x" << first.width << " and "
        << d.height << "x" << d.width << " activations";
    channels.push_back(d.channels);
    out.channels += d.channels;
  }
  return Add(NewConcatLayer(std::move(channels), out), inputs, out,
             absl::StrCat("concat after ", graph_->nodes[inputs[0]].what));
}

int NetBuilder::Dropout(int input, float keep_prob) {
  const Dims in = dims(input);
  return Add(NewDropoutLayer(keep_prob, in.size(), graph_->nodes.size()),
             {input}, in, "dropout");
}

absl::StatusOr<std::unique_ptr<Model>> NetBuilder::Build(
    const std::string& model_name) {
  if (!status_.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_name, ": ", status_.message()));
  }
  const Graph::Node& last = graph_->nodes.back();
  if (last.dims.size() != options_.num_classes) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_name, ": the last layer has ", last.dims.size(),
                     " outputs for ", options_.num_classes, " classes"));
  }
  for (size_t i = 1; i + 1 < graph_->nodes.size(); ++i) {
    CHECK_GT(graph_->nodes[i].consumers, 0)
        << model_name << ": " << graph_->nodes[i].what << " is not used";
  }
  return std::unique_ptr<Model>(new NetModel(options_, std::move(*graph_)));
}

}  // namespace psrt
