#include "models/net.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "kernels/device.h"
#include "models/net_graph.h"

namespace psrt {

using kernels::Padding;


NetBuilder::NetBuilder(const ModelOptions& options)
    : options_(options), graph_(std::make_unique<Graph>()) {
  Graph::Node input;
  input.dims = Dims{options.input_height, options.input_width, options.input_channels};
  input.what = "input";
  graph_->nodes.push_back(std::move(input));
}

NetBuilder::~NetBuilder() = default;

Dims NetBuilder::dims(int node) const { return graph_->nodes.at(node).dims; }

int NetBuilder::Add(std::unique_ptr<Layer> layer, std::vector<int> inputs, Dims dims,
                    const std::string& what) {
  for (int in : inputs) {
    CHECK(in >= 0 && in < static_cast<int>(graph_->nodes.size()))
        << what << " reads node " << in << ", which does not exist";
    ++graph_->nodes[in].consumers;
  }
  if (status_.ok() && (dims.height <= 0 || dims.width <= 0)) {
    const Dims in = graph_->nodes[inputs[0]].dims;
    status_ = absl::InvalidArgumentError(
        absl::StrCat(what, " does not fit its ", in.height, "x", in.width, " input"));
  }
  Graph::Node node;
  node.var_begin = graph_->nodes.back().var_end;
  node.var_end = static_cast<int>(graph_->variables.size());
  node.layer = std::move(layer);
  node.inputs = std::move(inputs);
  node.dims = dims;
  node.what = what;
  graph_->nodes.push_back(std::move(node));
  return static_cast<int>(graph_->nodes.size()) - 1;
}

void NetBuilder::AddVariable(const std::string& name, Shape shape, VariableInit init) {
  graph_->variables.push_back({name, std::move(shape)});
  graph_->inits.push_back(init);
}

void NetBuilder::AddMovingStatistics(const std::string& scope, int64_t channels) {
  AddVariable(scope + "/moving_mean", {channels}, {0, 0});
  AddVariable(scope + "/moving_variance", {channels}, {0, 1});
}

int NetBuilder::Conv(const std::string& scope, int input, const ConvSpec& spec) {
  const Dims in = dims(input);
  const int first_var = static_cast<int>(graph_->variables.size());
  const int64_t fan_in = spec.filter_height * spec.filter_width * in.channels;
  AddVariable(
      scope + "/weights", {spec.filter_height, spec.filter_width, in.channels, spec.out_channels},
      spec.weights_init.random() ? spec.weights_init
                                 : VariableInit{std::sqrt((spec.relu ? 2.0 : 1.0) / fan_in), 0});
  if (spec.bias) AddVariable(scope + "/biases", {spec.out_channels}, spec.bias_init);
  if (spec.batch_norm) {
    AddVariable(scope + "/BatchNorm/gamma", {spec.out_channels}, {0, 1});
    AddVariable(scope + "/BatchNorm/beta", {spec.out_channels}, {0, 0});
    AddMovingStatistics(scope + "/BatchNorm", spec.out_channels);
  }
  const Dims out{
      kernels::WindowOutputSize(in.height, spec.filter_height, spec.stride, spec.padding),
      kernels::WindowOutputSize(in.width, spec.filter_width, spec.stride, spec.padding),
      spec.out_channels};
  return Add(NewConvLayer(spec, in, first_var), {input}, out, scope);
}

int NetBuilder::FullyConnected(const std::string& scope, int input, int64_t units, bool relu,
                               VariableInit weights_init, VariableInit bias_init, bool bias) {
  const Dims in = dims(input);
  const int first_var = static_cast<int>(graph_->variables.size());
  if (!weights_init.random()) {
    weights_init = VariableInit{std::sqrt((relu ? 2.0 : 1.0) / in.size()), 0};
  }
  AddVariable(scope + "/weights", {in.size(), units}, weights_init);
  if (bias) AddVariable(scope + "/biases", {units}, bias_init);
  return Add(NewFullyConnectedLayer(in, units, bias, relu, first_var), {input},
             Dims{1, 1, units}, scope);
}

int NetBuilder::BatchNorm(const std::string& scope, int input, BatchNormSpec spec) {
  const Dims in = dims(input);
  spec.channels = in.channels;
  const int first_var = static_cast<int>(graph_->variables.size());
  if (spec.scale) AddVariable(scope + "/gamma", {in.channels}, {0, 1});
  if (spec.center) AddVariable(scope + "/beta", {in.channels}, {0, 0});
  AddMovingStatistics(scope, in.channels);
  return Add(NewBatchNormLayer(spec, in, first_var), {input}, in, scope);
}

int NetBuilder::LayerNorm(const std::string& scope, int input, float epsilon) {
  const Dims in = dims(input);
  const int first_var = static_cast<int>(graph_->variables.size());
  AddVariable(scope + "/gamma", {in.channels}, {0, 1});
  AddVariable(scope + "/beta", {in.channels}, {0, 0});
  return Add(NewLayerNormLayer(epsilon, in, first_var), {input}, in, scope);
}

int NetBuilder::ChannelScale(const std::string& scope, int input, VariableInit init) {
  const Dims in = dims(input);
  const int first_var = static_cast<int>(graph_->variables.size());
  AddVariable(scope + "/gamma", {in.channels}, init);
  return Add(NewChannelScaleLayer(in, first_var), {input}, in, scope);
}

int NetBuilder::DepthwiseConv(const std::string& scope, int input, const DepthwiseConvSpec& spec) {
  const Dims in = dims(input);
  const int first_var = static_cast<int>(graph_->variables.size());
  const int64_t out_channels = in.channels * spec.multiplier;
  const int64_t fan_in = spec.filter_height * spec.filter_width;  // Per output channel.
  AddVariable(scope + "/depthwise_weights",
              {spec.filter_height, spec.filter_width, in.channels, spec.multiplier},
              spec.weights_init.random() ? spec.weights_init
                                         : VariableInit{std::sqrt(2.0 / fan_in), 0});
  if (spec.bias) AddVariable(scope + "/biases", {out_channels}, spec.bias_init);
  const int64_t window_h = (spec.filter_height - 1) * spec.dilation + 1;
  const int64_t window_w = (spec.filter_width - 1) * spec.dilation + 1;
  const Dims out{kernels::WindowOutputSize(in.height, window_h, spec.stride, spec.padding),
                 kernels::WindowOutputSize(in.width, window_w, spec.stride, spec.padding),
                 out_channels};
  return Add(NewDepthwiseConvLayer(spec, in, first_var), {input}, out, scope);
}

int NetBuilder::ZeroPad(int input, const ZeroPadSpec& spec) {
  const Dims in = dims(input);
  const Dims out{in.height + spec.top + spec.bottom, in.width + spec.left + spec.right,
                 in.channels};
  return Add(NewZeroPadLayer(spec, in), {input}, out,
             absl::StrCat("zero padding after ", graph_->nodes[input].what));
}

int NetBuilder::MaxPool(int input, int64_t window, int64_t stride, Padding padding) {
  const Dims in = dims(input);
  const Dims out{kernels::WindowOutputSize(in.height, window, stride, padding),
                 kernels::WindowOutputSize(in.width, window, stride, padding), in.channels};
  return Add(NewPoolLayer(true, window, stride, padding, in), {input}, out,
             absl::StrCat("max pool after ", graph_->nodes[input].what));
}

int NetBuilder::AvgPool(int input, int64_t window, int64_t stride, Padding padding) {
  const Dims in = dims(input);
  const Dims out{kernels::WindowOutputSize(in.height, window, stride, padding),
                 kernels::WindowOutputSize(in.width, window, stride, padding), in.channels};
  return Add(NewPoolLayer(false, window, stride, padding, in), {input}, out,
             absl::StrCat("avg pool after ", graph_->nodes[input].what));
}

int NetBuilder::GlobalAvgPool(int input) {
  const Dims in = dims(input);
  return Add(NewGlobalAvgPoolLayer(in), {input}, Dims{1, 1, in.channels}, "global avg pool");
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
        << "concat of " << first.height << "x" << first.width << " and " << d.height << "x"
        << d.width << " activations";
    channels.push_back(d.channels);
    out.channels += d.channels;
  }
  return Add(NewConcatLayer(std::move(channels), out), inputs, out,
             absl::StrCat("concat after ", graph_->nodes[inputs[0]].what));
}

int NetBuilder::num_nodes() const { return static_cast<int>(graph_->nodes.size()); }

int NetBuilder::Sum(const std::vector<int>& inputs, bool relu) {
  CHECK_GE(inputs.size(), 2u);
  const Dims first = dims(inputs[0]);
  for (size_t i = 0; i < inputs.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      CHECK_NE(inputs[j], inputs[i]) << "node " << inputs[i] << " summed twice";
    }
    const Dims d = dims(inputs[i]);
    CHECK(d.height == first.height && d.width == first.width && d.channels == first.channels)
        << "sum of " << first.height << "x" << first.width << "x" << first.channels << " and "
        << d.height << "x" << d.width << "x" << d.channels << " activations";
  }
  return Add(NewSumLayer(first.size(), relu), inputs, first,
             absl::StrCat("sum after ", graph_->nodes[inputs[0]].what));
}

int NetBuilder::Relu(int input) {
  const Dims in = dims(input);
  return Add(NewSumLayer(in.size(), /*relu=*/true), {input}, in,
             absl::StrCat("relu after ", graph_->nodes[input].what));
}

int NetBuilder::Activate(int input, const kernels::ActivationSpec& spec) {
  const Dims in = dims(input);
  return Add(NewActivationLayer(spec, in.size()), {input}, in,
             absl::StrCat("activation after ", graph_->nodes[input].what));
}

int NetBuilder::ChannelAffine(const std::string& scope, int input, std::vector<float> scale,
                              std::vector<float> offset, int64_t non_trainable) {
  const Dims in = dims(input);
  graph_->non_trainable += non_trainable;
  return Add(NewChannelAffineLayer(std::move(scale), std::move(offset), in), {input}, in, scope);
}

int NetBuilder::Multiply(int a, int b) {
  const Dims da = dims(a), db = dims(b);
  return Add(NewMultiplyLayer(da, db), {a, b}, da.pixels() >= db.pixels() ? da : db,
             absl::StrCat("product after ", graph_->nodes[a].what));
}

int NetBuilder::Reshape(int input, Dims out) {
  const Dims in = dims(input);
  CHECK_EQ(in.size(), out.size()) << "a reshape of another size";
  return Add(NewSumLayer(in.size(), /*relu=*/false), {input}, out,
             absl::StrCat("reshape after ", graph_->nodes[input].what));
}

int NetBuilder::Dropout(int input, float keep_prob, bool per_example, bool per_channel) {
  const Dims in = dims(input);
  kernels::DropoutNoise noise;
  if (per_example || per_channel) noise.example = in.size();
  if (per_channel) noise.channels = in.channels;
  return Add(NewDropoutLayer(keep_prob, in.size(), graph_->nodes.size(), noise), {input}, in,
             "dropout");
}

absl::StatusOr<std::unique_ptr<Model>> NetBuilder::Build(const std::string& model_name) {
  if (!status_.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(model_name, ": ", status_.message()));
  }
  const Graph::Node& last = graph_->nodes.back();
  if (last.dims.size() != options_.num_classes) {
    return absl::InvalidArgumentError(absl::StrCat(model_name, ": the last layer has ",
                                                   last.dims.size(), " outputs for ",
                                                   options_.num_classes, " classes"));
  }
  for (size_t i = 1; i + 1 < graph_->nodes.size(); ++i) {
    CHECK_GT(graph_->nodes[i].consumers, 0)
        << model_name << ": " << graph_->nodes[i].what << " is not used";
  }
  // ReLUs move past the max pools that alone consume them (Layer's
  // DropTrailingRelu): the same values and gradients, fewer elements.
  for (Graph::Node& node : graph_->nodes) {
    if (node.layer == nullptr || !node.layer->TakesTrailingRelu()) continue;
    Graph::Node& producer = graph_->nodes[node.inputs[0]];
    if (producer.consumers == 1 && producer.layer != nullptr &&
        producer.layer->DropTrailingRelu()) {
      node.layer->TakeTrailingRelu();
    }
  }
  kernels::DeviceSpec spec = options_.device;
  spec.cpu_threads = options_.intra_op_threads;
  absl::StatusOr<std::unique_ptr<kernels::Device>> device = kernels::NewDevice(spec);
  if (!device.ok()) {
    return absl::Status(device.status().code(),
                        absl::StrCat(model_name, ": ", device.status().message()));
  }
  return NewNetModel(options_, std::move(*graph_), std::move(*device));
}

}  // namespace psrt
