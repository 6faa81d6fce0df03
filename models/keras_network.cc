#include "models/keras_network.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace psrt {
namespace {

using kernels::Padding;

// A variable of more elements than this is refused (the file is then
// hostile or a mistake; 2^31 floats are 8 GiB).
constexpr double kMaxVariableElements = 2147483648.0;

}  // namespace

bool KerasNetwork::OfAConstant(const Step& step) {
  return step.layer->operation && step.in.size() == 1 && step.layer->constants.size() == 1;
}

absl::Status KerasNetwork::OneInput(const Step& step) const {
  if (step.x >= 0) return absl::OkStatus();
  return file_.LayerError(*step.layer, absl::StrCat("has ", step.in.size(), " inputs, want 1"));
}

absl::Status KerasNetwork::NotOfAVector(const Step& step, absl::string_view what) const {
  if (!step.x_flat || step.x == NetBuilder::kInput) return absl::OkStatus();
  return file_.LayerError(*step.layer, absl::StrCat(what, " of a vector (after Flatten or Dense)"));
}

KerasNetwork::Added KerasNetwork::SumAndRelu(const Step& step, const std::vector<int>& inputs,
                                             NetBuilder* net) const {
  const int relu = file_.OnlyConsumer(step.index);
  const bool fuse = relu >= 0 && file_.IsRelu(relu);
  Added added;
  added.out = net->Sum(inputs, fuse);
  added.flat = AllFlat(*step.layer);
  if (fuse) added.folded.push_back(relu);
  return added;
}

int KerasNetwork::Activated(int out, const std::string& activation, NetBuilder* net) const {
  if (activation == "relu") return net->Relu(out);
  if (activation == "linear") return out;
  return net->Activate(out, file_.ActivationSpecOf(activation));
}

absl::Status KerasNetwork::DistinctInputs(const KerasLayer& layer,
                                          const std::vector<int>& in) const {
  for (size_t a = 0; a < in.size(); ++a) {
    for (size_t b = 0; b < a; ++b) {
      if (in[a] == in[b]) {
        return file_.LayerError(layer,
                                "reads one tensor twice (directly, or through an identity "
                                "such as Flatten or a linear Activation): not supported");
      }
    }
  }
  return absl::OkStatus();
}

absl::Status KerasNetwork::SameDims(const Step& step, bool channels, absl::string_view what,
                                    NetBuilder* net) const {
  const Dims d0 = net->dims(step.in[0]);
  for (int a : step.in) {
    const Dims da = net->dims(a);
    if (da.height != d0.height || da.width != d0.width ||
        (channels && da.channels != d0.channels)) {
      return file_.LayerError(*step.layer, what);
    }
  }
  return absl::OkStatus();
}

bool KerasNetwork::IsLossActivation(const std::string& activation, int layer, int64_t units) const {
  return layer == file_.output() &&
         (activation == "softmax" || (activation == "sigmoid" && units == 1));
}

bool KerasNetwork::AllFlat(const KerasLayer& layer) const {
  for (const std::string& name : layer.inputs) {
    if (!flat_[file_.index(name)]) return false;
  }
  return true;
}

absl::Status KerasNetwork::ReadDepthwiseWindow(const KerasLayer& layer,
                                               DepthwiseConvSpec* spec) const {
  ASSIGN_OR_RETURN(const auto kernel, file_.KernelSize(layer));
  spec->filter_height = kernel.first;
  spec->filter_width = kernel.second;
  ASSIGN_OR_RETURN(spec->stride, file_.SquareInt(layer, "strides", 1));
  ASSIGN_OR_RETURN(spec->dilation, file_.SquareInt(layer, "dilation_rate", 1));
  if (spec->stride < 1 || spec->dilation < 1) {
    return file_.LayerError(layer, "strides and dilation_rate must be positive");
  }
  if (spec->stride > 1 && spec->dilation > 1) {
    return file_.LayerError(layer, "strides and dilation_rate both above 1 (Keras refuses it)");
  }
  ASSIGN_OR_RETURN(spec->padding, file_.PaddingOf(layer));
  return absl::OkStatus();
}

absl::StatusOr<BatchNormSpec> KerasNetwork::BatchNormOf(const KerasLayer& norm) const {
  RETURN_IF_ERROR(file_.RequireDefaults(
      norm, {"beta_regularizer", "gamma_regularizer", "beta_constraint", "gamma_constraint",
             "renorm", "virtual_batch_size", "adjustment", "synchronized"}));
  BatchNormSpec spec;
  ASSIGN_OR_RETURN(spec.center, file_.Bool(norm, "center", true));
  ASSIGN_OR_RETURN(spec.scale, file_.Bool(norm, "scale", true));
  if (!file_.OnChannels(norm)) {
    return file_.LayerError(norm, "only batch norm over the channels is supported");
  }
  for (const char* key : {"gamma_initializer", "beta_initializer", "moving_mean_initializer",
                          "moving_variance_initializer"}) {
    ASSIGN_OR_RETURN(const VariableInit init, file_.Initializer(norm, key, 1, 1));
    const bool ones = std::string(key) == "gamma_initializer" ||
                      std::string(key) == "moving_variance_initializer";
    if (init.random() || init.value != (ones ? 1.0f : 0.0f)) {
      return file_.LayerError(norm, absl::StrCat(key, " other than its default"));
    }
  }
  ASSIGN_OR_RETURN(const double epsilon, file_.Number(norm, "epsilon", 1e-3));
  ASSIGN_OR_RETURN(const double momentum, file_.Number(norm, "momentum", 0.99));
  if (!(epsilon > 0) || !(momentum >= 0 && momentum <= 1)) {
    return file_.LayerError(norm, "epsilon must be positive and momentum in [0, 1]");
  }
  spec.epsilon = static_cast<float>(epsilon);
  spec.momentum = static_cast<float>(momentum);
  // Keras 2's moving variance follows the batch's with Bessel's
  // correction (TensorFlow's fused batch norm), Keras 3's without.
  spec.bessel = file_.keras2();
  return spec;
}

const std::vector<std::pair<const char*, KerasNetwork::ClassBuilder>>& KerasNetwork::Builders() {
  static const auto* const builders = new std::vector<std::pair<const char*, ClassBuilder>>{
      {"Conv2D", &KerasNetwork::Conv2D},
      {"DepthwiseConv2D", &KerasNetwork::DepthwiseOrSeparableConv2D},
      {"SeparableConv2D", &KerasNetwork::DepthwiseOrSeparableConv2D},
      {"BatchNormalization", &KerasNetwork::BatchNormalization},
      {"ZeroPadding2D", &KerasNetwork::ZeroPadding2D},
      {"Rescaling", &KerasNetwork::Rescaling},
      {"Normalization", &KerasNetwork::Normalization},
      {"Reshape", &KerasNetwork::Reshape},
      {"Multiply", &KerasNetwork::Multiply},
      {"Dense", &KerasNetwork::Dense},
      {"MaxPooling2D", &KerasNetwork::Pooling2D},
      {"AveragePooling2D", &KerasNetwork::Pooling2D},
      {"GlobalAveragePooling2D", &KerasNetwork::GlobalPooling2D},
      {"GlobalMaxPooling2D", &KerasNetwork::GlobalPooling2D},
      {"Flatten", &KerasNetwork::Flatten},
      {"Dropout", &KerasNetwork::Dropout},
      {"SpatialDropout2D", &KerasNetwork::Dropout},
      {"Activation", &KerasNetwork::Activation},
      {"ReLU", &KerasNetwork::Activation},
      {"Add", &KerasNetwork::Add},
      {"LayerNormalization", &KerasNetwork::LayerNormalization},
      {"LayerScale", &KerasNetwork::LayerScale},
      {"CustomScaleLayer", &KerasNetwork::CustomScaleLayer},
      {"Concatenate", &KerasNetwork::Concatenate},
  };
  return *builders;
}

absl::StatusOr<int> KerasNetwork::Build(NetBuilder* net) {
  const int n = static_cast<int>(file_.layers().size());
  node_.assign(n, -1);
  flat_.assign(n, false);
  const bool input_flat =
      file_.input_shape().input_height == 1 && file_.input_shape().input_width == 1;
  std::vector<bool> done(n, false);
  for (int i = 0; i < n; ++i) {
    if (done[i]) continue;
    const KerasLayer& layer = file_.layers()[i];
    Step step;
    step.index = i;
    step.layer = &layer;
    for (const std::string& name : layer.inputs) step.in.push_back(node_[file_.index(name)]);
    Added added;
    if (layer.class_name == "InputLayer") {
      if (!step.in.empty()) return file_.LayerError(layer, "an InputLayer that reads a layer");
      added.out = NetBuilder::kInput;
      added.flat = input_flat;
    } else {
      if (i != file_.input() && step.in.empty()) {
        if (file_.input() >= 0 || i != 0) return file_.LayerError(layer, "reads nothing");
        step.in.push_back(NetBuilder::kInput);  // A Sequential without InputLayer.
      }
      if (step.in.size() == 1) {
        step.x = step.in[0];
        // The model's input of (features), or a layer that made a vector.
        step.x_flat = layer.inputs.empty() ? input_flat : flat_[file_.index(layer.inputs[0])];
      }
      ClassBuilder build = nullptr;
      for (const auto& [name, builder] : Builders()) {
        if (layer.class_name == name) build = builder;
      }
      if (build == nullptr) return file_.LayerError(layer, "this layer class is not supported");
      ASSIGN_OR_RETURN(added, (this->*build)(step, net));
      if (!net->status().ok()) return file_.LayerError(layer, net->status().message());
    }
    added.folded.push_back(i);
    for (int f : added.folded) {
      node_[f] = added.out;
      flat_[f] = added.flat;
      done[f] = true;
    }
  }
  const int logits = node_[file_.output()];
  const Dims d = net->dims(logits);
  if (logits == NetBuilder::kInput || d.pixels() != 1) {
    return file_.LayerError(file_.layers()[file_.output()],
                            "the model's output is not a vector of class scores");
  }
  if (logits != net->num_nodes() - 1) {
    return file_.LayerError(file_.layers()[file_.output()],
                            "the model's output is not the last layer computed");
  }
  if (d.channels > (1 << 24))
    return file_.LayerError(file_.layers()[file_.output()], "over 2^24 classes");
  if (d.channels == 1) {
    // One unit: a binary classifier, trained as Keras's
    // BinaryCrossentropy(from_logits=True) of labels 0 and 1 trains it.
    // That is the softmax cross-entropy of the scores (0, z), so the model
    // gets them, and two classes: z > 0 predicts class 1.
    const int zero = net->ChannelAffine("binary_logits", logits, {0.0f}, {0.0f});
    net->Concat({zero, logits});
    return 2;
  }
  return static_cast<int>(d.channels);
}

absl::StatusOr<KerasNetwork::Added> KerasNetwork::Conv2D(const Step& step, NetBuilder* net) {
  const KerasLayer& layer = *step.layer;
  // A Conv2D whose groups are its input's channels is a depthwise
  // convolution (ConvNeXt's); a bad "groups" is named below.
  const absl::StatusOr<int64_t> grouped = file_.SquareInt(layer, "groups", 1);
  if (grouped.ok() && *grouped != 1) return GroupedConv2D(step, net);
  RETURN_IF_ERROR(OneInput(step));
  RETURN_IF_ERROR(NotOfAVector(step, "a convolution"));
  ConvSpec spec;
  ASSIGN_OR_RETURN(const int64_t filters, file_.SquareInt(layer, "filters", 0));
  ASSIGN_OR_RETURN(const auto kernel, file_.KernelSize(layer));
  ASSIGN_OR_RETURN(spec.stride, file_.SquareInt(layer, "strides", 1));
  ASSIGN_OR_RETURN(const int64_t dilation, file_.SquareInt(layer, "dilation_rate", 1));
  ASSIGN_OR_RETURN(const int64_t groups, file_.SquareInt(layer, "groups", 1));
  ASSIGN_OR_RETURN(const std::string format, file_.String(layer, "data_format", "channels_last"));
  if (dilation != 1 || groups != 1 || format != "channels_last") {
    return file_.LayerError(layer, "dilation, groups and channels_first are not supported");
  }
  RETURN_IF_ERROR(file_.RequireDefaults(
      layer, {"kernel_regularizer", "bias_regularizer", "activity_regularizer", "kernel_constraint",
              "bias_constraint", "lora_rank"}));
  ASSIGN_OR_RETURN(spec.padding, file_.PaddingOf(layer));
  ASSIGN_OR_RETURN(spec.bias, file_.Bool(layer, "use_bias", true));
  ASSIGN_OR_RETURN(const std::string activation, file_.Activation(layer));
  if (activation == "softmax") return file_.LayerError(layer, "a softmax convolution");
  spec.filter_height = kernel.first;
  spec.filter_width = kernel.second;
  spec.out_channels = filters;
  spec.relu = activation == "relu";
  const double in_channels = net->dims(step.x).channels;
  const double taps = static_cast<double>(kernel.first) * kernel.second;
  if (taps * in_channels * filters > kMaxVariableElements) {
    return file_.LayerError(layer, "a kernel of over 2^31 weights");
  }
  ASSIGN_OR_RETURN(spec.weights_init, file_.Initializer(layer, "kernel_initializer",
                                                        taps * in_channels, taps * filters));
  if (spec.bias) {
    ASSIGN_OR_RETURN(spec.bias_init,
                     file_.Initializer(layer, "bias_initializer", filters, filters));
  }
  if (!spec.weights_init.random()) {
    return file_.LayerError(layer, "a constant kernel_initializer (the layer could not learn)");
  }
  // Conv2D > BatchNormalization (> ReLU): one fused layer, when the conv
  // has no bias or activation and the batch norm centers and scales;
  // otherwise the batch norm is a layer of its own.
  Added added;
  const int bn = file_.OnlyConsumer(step.index);
  if (!spec.bias && activation == "linear" && bn >= 0 &&
      file_.layers()[bn].class_name == "BatchNormalization" &&
      file_.layers()[bn].inputs.size() == 1) {
    ASSIGN_OR_RETURN(const BatchNormSpec norm, BatchNormOf(file_.layers()[bn]));
    if (norm.center && norm.scale) {
      spec.batch_norm = true;
      spec.bn_epsilon = norm.epsilon;
      spec.bn_momentum = norm.momentum;
      spec.bn_bessel = norm.bessel;
      added.folded.push_back(bn);
      const int relu = file_.OnlyConsumer(bn);
      if (relu >= 0 && file_.IsRelu(relu)) {
        spec.relu = true;
        added.folded.push_back(relu);
      }
    }
  }
  added.out = net->Conv(layer.name, step.x, spec);
  // Another activation than ReLU (or none) is a layer after the conv.
  if (activation != "relu") added.out = Activated(added.out, activation, net);
  return added;
}

absl::StatusOr<KerasNetwork::Added> KerasNetwork::GroupedConv2D(const Step& step, NetBuilder* net) {
  const KerasLayer& layer = *step.layer;
  RETURN_IF_ERROR(OneInput(step));
  RETURN_IF_ERROR(NotOfAVector(step, "a convolution"));
  ASSIGN_OR_RETURN(const int64_t groups, file_.SquareInt(layer, "groups", 1));
  const int64_t channels = net->dims(step.x).channels;
  ASSIGN_OR_RETURN(const int64_t filters, file_.SquareInt(layer, "filters", 0));
  if (groups != channels || filters != channels) {
    return file_.LayerError(
        layer, absl::StrCat("groups=", groups, " over ", channels, " channels into ", filters,
                            " filters: only a depthwise convolution (groups, filters and the "
                            "input's channels equal) is supported"));
  }
  RETURN_IF_ERROR(file_.RequireDefaults(
      layer, {"data_format", "kernel_regularizer", "bias_regularizer", "activity_regularizer",
              "kernel_constraint", "bias_constraint", "lora_rank"}));
  DepthwiseConvSpec spec;
  RETURN_IF_ERROR(ReadDepthwiseWindow(layer, &spec));
  ASSIGN_OR_RETURN(spec.bias, file_.Bool(layer, "use_bias", true));
  ASSIGN_OR_RETURN(const std::string activation, file_.Activation(layer));
  if (activation == "softmax") return file_.LayerError(layer, "a softmax convolution");
  // Keras's fans of the grouped kernel [h, w, 1, filters].
  const double taps = static_cast<double>(spec.filter_height) * spec.filter_width;
  ASSIGN_OR_RETURN(spec.weights_init,
                   file_.Initializer(layer, "kernel_initializer", taps, taps * filters));
  if (!spec.weights_init.random()) {
    return file_.LayerError(layer, "a constant kernel_initializer (the layer could not learn)");
  }
  if (spec.bias) {
    ASSIGN_OR_RETURN(spec.bias_init,
                     file_.Initializer(layer, "bias_initializer", filters, filters));
  }
  Added added;
  added.out = Activated(net->DepthwiseConv(layer.name, step.x, spec), activation, net);
  return added;
}

absl::StatusOr<KerasNetwork::Added> KerasNetwork::DepthwiseOrSeparableConv2D(const Step& step,
                                                                             NetBuilder* net) {
  const KerasLayer& layer = *step.layer;
  RETURN_IF_ERROR(OneInput(step));
  RETURN_IF_ERROR(NotOfAVector(step, "a convolution"));
  const bool separable = layer.class_name == "SeparableConv2D";
  RETURN_IF_ERROR(file_.RequireDefaults(
      layer,
      {"data_format", "depthwise_regularizer", "pointwise_regularizer", "bias_regularizer",
       "activity_regularizer", "depthwise_constraint", "pointwise_constraint", "bias_constraint"}));
  DepthwiseConvSpec spec;
  RETURN_IF_ERROR(ReadDepthwiseWindow(layer, &spec));
  ASSIGN_OR_RETURN(spec.multiplier, file_.SquareInt(layer, "depth_multiplier", 1));
  if (spec.multiplier < 1) return file_.LayerError(layer, "depth_multiplier must be positive");
  ASSIGN_OR_RETURN(const bool bias, file_.Bool(layer, "use_bias", true));
  ASSIGN_OR_RETURN(const std::string activation, file_.Activation(layer));
  if (activation == "softmax") return file_.LayerError(layer, "a softmax convolution");
  const double channels = net->dims(step.x).channels;
  const double taps = static_cast<double>(spec.filter_height) * spec.filter_width;
  const double depthwise_out = channels * spec.multiplier;
  if (taps * depthwise_out > kMaxVariableElements) {
    return file_.LayerError(layer, "a kernel of over 2^31 weights");
  }
  // Keras's fans of a [h, w, channels, multiplier] kernel.
  ASSIGN_OR_RETURN(spec.weights_init, file_.Initializer(layer, "depthwise_initializer",
                                                        taps * channels, taps * spec.multiplier));
  if (!spec.weights_init.random()) {
    return file_.LayerError(layer, "a constant depthwise_initializer (the layer could not learn)");
  }
  // A SeparableConv2D is the depthwise convolution, then a 1x1 one
  // ("<layer>/pointwise") with the layer's bias.
  spec.bias = bias && !separable;
  if (spec.bias) {
    ASSIGN_OR_RETURN(spec.bias_init,
                     file_.Initializer(layer, "bias_initializer", depthwise_out, depthwise_out));
  }
  int out = net->DepthwiseConv(layer.name, step.x, spec);
  if (separable) {
    ConvSpec pointwise;
    ASSIGN_OR_RETURN(pointwise.out_channels, file_.SquareInt(layer, "filters", 0));
    if (pointwise.out_channels < 1) return file_.LayerError(layer, "filters must be positive");
    if (depthwise_out * pointwise.out_channels > kMaxVariableElements) {
      return file_.LayerError(layer, "a pointwise kernel of over 2^31 weights");
    }
    pointwise.filter_height = pointwise.filter_width = 1;
    pointwise.bias = bias;
    pointwise.relu = false;
    ASSIGN_OR_RETURN(
        pointwise.weights_init,
        file_.Initializer(layer, "pointwise_initializer", depthwise_out, pointwise.out_channels));
    if (bias) {
      ASSIGN_OR_RETURN(pointwise.bias_init,
                       file_.Initializer(layer, "bias_initializer", pointwise.out_channels,
                                         pointwise.out_channels));
    }
    if (!pointwise.weights_init.random()) {
      return file_.LayerError(layer,
                              "a constant pointwise_initializer (the layer could not learn)");
    }
    out = net->Conv(layer.name + "/pointwise", out, pointwise);
  }
  Added added;
  added.out = Activated(out, activation, net);
  return added;
}

absl::StatusOr<KerasNetwork::Added> KerasNetwork::BatchNormalization(const Step& step,
                                                                     NetBuilder* net) {
  RETURN_IF_ERROR(OneInput(step));
  ASSIGN_OR_RETURN(const BatchNormSpec norm, BatchNormOf(*step.layer));
  return Added{net->BatchNorm(step.layer->name, step.x, norm), step.x_flat};
}

absl::StatusOr<KerasNetwork::Added> KerasNetwork::ZeroPadding2D(const Step& step, NetBuilder* net) {
  RETURN_IF_ERROR(OneInput(step));
  RETURN_IF_ERROR(file_.RequireDefaults(*step.layer, {"data_format"}));
  RETURN_IF_ERROR(NotOfAVector(step, "a padding"));
  ASSIGN_OR_RETURN(const auto sides, file_.ZeroPadding(*step.layer));
  return Added{net->ZeroPad(step.x, ZeroPadSpec{sides[0], sides[1], sides[2], sides[3]})};
}

absl::StatusOr<KerasNetwork::Added> KerasNetwork::ConstantArithmetic(const Step& step,
                                                                     NetBuilder* net) {
  // Keras 3's x + c and x * c (MobileNetV3's hard sigmoid).
  const KerasLayer& layer = *step.layer;
  const bool add = layer.class_name == "Add";
  const int64_t channels = net->dims(step.x).channels;
  const float c = static_cast<float>(layer.constants[0]);
  return Added{net->ChannelAffine(layer.name, step.x, std::vector<float>(channels, add ? 1 : c),
                                  std::vector<float>(channels, add ? c : 0)),
               step.x_flat};
}

absl::StatusOr<KerasNetwork::Added> KerasNetwork::Rescaling(const Step& step, NetBuilder* net) {
  RETURN_IF_ERROR(OneInput(step));
  const int64_t channels = net->dims(step.x).channels;
  ASSIGN_OR_RETURN(std::vector<float> scale, file_.PerChannel(*step.layer, "scale", channels, 1));
  ASSIGN_OR_RETURN(std::vector<float> offset, file_.PerChannel(*step.layer, "offset", channels, 0));
  return Added{net->ChannelAffine(step.layer->name, step.x, std::move(scale), std::move(offset)),
               step.x_flat};
}

absl::StatusOr<KerasNetwork::Added> KerasNetwork::Normalization(const Step& step, NetBuilder* net) {
  const KerasLayer& layer = *step.layer;
  RETURN_IF_ERROR(OneInput(step));
  ASSIGN_OR_RETURN(const bool invert, file_.Bool(layer, "invert", false));
  if (invert || !file_.OnChannels(layer)) {
    return file_.LayerError(layer,
                            "only a normalization over the channels, not inverted, is supported");
  }
  const int64_t channels = net->dims(step.x).channels;
  // Without "mean" and "variance" the layer keeps them as weights that
  // adapt() or a weights file fills (Keras counts them, and a count):
  // until then mean 0 and variance 1.
  const bool given = !file_.IsNullField(layer, "mean");
  ASSIGN_OR_RETURN(const std::vector<float> mean, file_.PerChannel(layer, "mean", channels, 0));
  ASSIGN_OR_RETURN(const std::vector<float> variance,
                   file_.PerChannel(layer, "variance", channels, 1));
  // Keras: (x - mean) / max(sqrt(variance), 1e-7).
  std::vector<float> scale(channels), offset(channels);
  for (int64_t c = 0; c < channels; ++c) {
    if (!(variance[c] >= 0)) return file_.LayerError(layer, "a negative variance");
    scale[c] = 1.0f / std::max(std::sqrt(variance[c]), 1e-7f);
    offset[c] = -mean[c] * scale[c];
  }
  return Added{net->ChannelAffine(layer.name, step.x, std::move(scale), std::move(offset),
                                  given ? 0 : 2 * channels + 1),
               step.x_flat};
}

absl::StatusOr<KerasNetwork::Added> KerasNetwork::Reshape(const Step& step, NetBuilder* net) {
  const KerasLayer& layer = *step.layer;
  RETURN_IF_ERROR(OneInput(step));
  ASSIGN_OR_RETURN(const std::vector<int64_t> target, file_.Ints(layer, "target_shape"));
  const Dims d = net->dims(step.x);
  Dims to;
  if (target.size() == 1) {
    to = Dims{1, 1, target[0]};
  } else if (target.size() == 3) {
    to = Dims{target[0], target[1], target[2]};
  } else {
    return file_.LayerError(layer, "a target_shape of other than 1 or 3 dimensions");
  }
  if (to.size() != d.size()) {
    return file_.LayerError(layer,
                            absl::StrCat("a reshape of ", d.size(), " values into ", to.size()));
  }
  return Added{net->Reshape(step.x, to), target.size() == 1};
}

absl::StatusOr<KerasNetwork::Added> KerasNetwork::Multiply(const Step& step, NetBuilder* net) {
  const KerasLayer& layer = *step.layer;
  if (OfAConstant(step)) return ConstantArithmetic(step, net);
  if (step.in.size() != 2) {
    return file_.LayerError(layer, absl::StrCat("a Multiply of ", step.in.size(),
                                                " tensors; want 2, or one and a constant"));
  }
  RETURN_IF_ERROR(DistinctInputs(layer, step.in));
  const Dims a = net->dims(step.in[0]), b = net->dims(step.in[1]);
  const bool alike = a.height == b.height && a.width == b.width;
  if (a.channels != b.channels || (!alike && a.pixels() != 1 && b.pixels() != 1)) {
    return file_.LayerError(
        layer, absl::StrCat("a product of ", a.height, "x", a.width, "x", a.channels, " and ",
                            b.height, "x", b.width, "x", b.channels,
                            " (want equal shapes, or one 1x1 of the other's channels)"));
  }
  return Added{net->Multiply(step.in[0], step.in[1]), AllFlat(layer)};
}

absl::StatusOr<KerasNetwork::Added> KerasNetwork::Dense(const Step& step, NetBuilder* net) {
  const KerasLayer& layer = *step.layer;
  RETURN_IF_ERROR(OneInput(step));
  const Dims d = net->dims(step.x);
  // On a map Keras applies it to each pixel's channels (ConvNeXt's
  // pointwise layers): a 1x1 convolution.
  const bool per_pixel = !step.x_flat && d.pixels() > 1;
  const int64_t fan_in = per_pixel ? d.channels : d.size();
  ASSIGN_OR_RETURN(const int64_t units, file_.SquareInt(layer, "units", 0));
  RETURN_IF_ERROR(file_.RequireDefaults(
      layer, {"kernel_regularizer", "bias_regularizer", "activity_regularizer", "kernel_constraint",
              "bias_constraint", "lora_rank"}));
  if (static_cast<double>(fan_in) * units > kMaxVariableElements) {
    return file_.LayerError(layer, "over 2^31 weights");
  }
  ASSIGN_OR_RETURN(const bool bias, file_.Bool(layer, "use_bias", true));
  ASSIGN_OR_RETURN(const std::string activation, file_.Activation(layer));
  if (activation == "softmax" && per_pixel) {
    return file_.LayerError(
        layer, absl::StrCat("a softmax of Dense on a ", d.height, "x", d.width, "x", d.channels,
                            " map (Keras applies it per pixel): put a Flatten or a pooling "
                            "before it"));
  }
  if (activation == "softmax" && step.index != file_.output()) {
    return file_.LayerError(layer, "softmax is supported only in the last layer");
  }
  ASSIGN_OR_RETURN(const VariableInit weights,
                   file_.Initializer(layer, "kernel_initializer", fan_in, units));
  VariableInit biases;
  if (bias) {
    ASSIGN_OR_RETURN(biases, file_.Initializer(layer, "bias_initializer", units, units));
  }
  if (!weights.random()) {
    return file_.LayerError(layer, "a constant kernel_initializer (the layer could not learn)");
  }
  Added added;
  added.flat = !per_pixel;
  if (per_pixel) {
    ConvSpec pointwise;
    pointwise.filter_height = pointwise.filter_width = 1;
    pointwise.out_channels = units;
    pointwise.bias = bias;
    pointwise.relu = activation == "relu";
    pointwise.weights_init = weights;
    pointwise.bias_init = biases;
    added.out = net->Conv(layer.name, step.x, pointwise);
  } else {
    added.out =
        net->FullyConnected(layer.name, step.x, units, activation == "relu", weights, biases, bias);
  }
  if (activation != "relu" && !IsLossActivation(activation, step.index, units)) {
    added.out = Activated(added.out, activation, net);
  }
  return added;
}

absl::StatusOr<KerasNetwork::Added> KerasNetwork::Pooling2D(const Step& step, NetBuilder* net) {
  const KerasLayer& layer = *step.layer;
  RETURN_IF_ERROR(OneInput(step));
  RETURN_IF_ERROR(file_.RequireDefaults(layer, {"data_format"}));
  ASSIGN_OR_RETURN(const int64_t window, file_.SquareInt(layer, "pool_size", 2));
  ASSIGN_OR_RETURN(const int64_t stride, file_.SquareInt(layer, "strides", window));
  ASSIGN_OR_RETURN(const Padding padding, file_.PaddingOf(layer));
  return Added{layer.class_name == "MaxPooling2D" ? net->MaxPool(step.x, window, stride, padding)
                                                  : net->AvgPool(step.x, window, stride, padding)};
}

absl::StatusOr<KerasNetwork::Added> KerasNetwork::GlobalPooling2D(const Step& step,
                                                                  NetBuilder* net) {
  const KerasLayer& layer = *step.layer;
  RETURN_IF_ERROR(OneInput(step));
  RETURN_IF_ERROR(file_.RequireDefaults(layer, {"data_format"}));
  RETURN_IF_ERROR(NotOfAVector(step, "a pooling"));
  ASSIGN_OR_RETURN(const bool keepdims, file_.Bool(layer, "keepdims", false));
  Added added;
  added.flat = !keepdims;  // With keepdims a 1x1 map, which a Conv2D may read.
  if (layer.class_name == "GlobalAveragePooling2D") {
    added.out = net->GlobalAvgPool(step.x);
  } else {
    // One window over the whole map: SAME padding (which max pooling never
    // picks) squares a map of other height than width.
    const Dims d = net->dims(step.x);
    const int64_t side = std::max(d.height, d.width);
    added.out = net->MaxPool(step.x, side, side, Padding::kSame);
  }
  return added;
}

absl::StatusOr<KerasNetwork::Added> KerasNetwork::Flatten(const Step& step, NetBuilder*) {
  RETURN_IF_ERROR(OneInput(step));
  RETURN_IF_ERROR(file_.RequireDefaults(*step.layer, {"data_format"}));
  return Added{step.x, true};  // Dense reads its input flattened, in the same (NHWC) order.
}

absl::StatusOr<KerasNetwork::Added> KerasNetwork::Dropout(const Step& step, NetBuilder* net) {
  const KerasLayer& layer = *step.layer;
  RETURN_IF_ERROR(OneInput(step));
  const bool spatial = layer.class_name == "SpatialDropout2D";
  ASSIGN_OR_RETURN(const double rate, file_.Number(layer, "rate", 0));
  if (rate < 0 || rate >= 1) return file_.LayerError(layer, "rate outside [0, 1)");
  // A noise_shape of (None, 1, 1, 1) draws per example (stochastic depth),
  // SpatialDropout2D per channel of an example.
  bool per_example = false;
  if (!spatial && !file_.IsNullField(layer, "noise_shape")) {
    ASSIGN_OR_RETURN(per_example, file_.NoiseShapePerExample(layer));
  }
  if (spatial) RETURN_IF_ERROR(file_.RequireDefaults(layer, {"data_format"}));
  return Added{
      rate == 0 ? step.x : net->Dropout(step.x, static_cast<float>(1 - rate), per_example, spatial),
      step.x_flat};
}

absl::StatusOr<KerasNetwork::Added> KerasNetwork::Activation(const Step& step, NetBuilder* net) {
  const KerasLayer& layer = *step.layer;
  RETURN_IF_ERROR(OneInput(step));
  std::string activation = "relu";
  if (layer.class_name == "Activation") {
    ASSIGN_OR_RETURN(activation, file_.Activation(layer));
  }
  if (activation == "softmax" && step.index != file_.output()) {
    return file_.LayerError(layer, "softmax is supported only in the last layer");
  }
  Added added{step.x, step.x_flat};
  if (layer.class_name == "ReLU" && !file_.IsRelu(step.index)) {  // A cap, slope or threshold.
    ASSIGN_OR_RETURN(const kernels::ActivationSpec relu, file_.ReluLayerSpec(layer));
    added.out = net->Activate(step.x, relu);
  } else if (!IsLossActivation(activation, step.index, net->dims(step.x).channels)) {
    added.out = Activated(step.x, activation, net);
  }
  return added;
}

absl::StatusOr<KerasNetwork::Added> KerasNetwork::Add(const Step& step, NetBuilder* net) {
  const KerasLayer& layer = *step.layer;
  if (OfAConstant(step)) return ConstantArithmetic(step, net);
  if (step.in.size() < 2) return file_.LayerError(layer, "an Add of fewer than 2 inputs");
  RETURN_IF_ERROR(DistinctInputs(layer, step.in));
  RETURN_IF_ERROR(SameDims(step, /*channels=*/true, "inputs of different shapes", net));
  return SumAndRelu(step, step.in, net);
}

absl::StatusOr<KerasNetwork::Added> KerasNetwork::LayerNormalization(const Step& step,
                                                                     NetBuilder* net) {
  const KerasLayer& layer = *step.layer;
  RETURN_IF_ERROR(OneInput(step));
  ASSIGN_OR_RETURN(const double epsilon, file_.Number(layer, "epsilon", 1e-3));
  ASSIGN_OR_RETURN(const bool center, file_.Bool(layer, "center", true));
  ASSIGN_OR_RETURN(const bool scale, file_.Bool(layer, "scale", true));
  ASSIGN_OR_RETURN(const bool rms, file_.Bool(layer, "rms_scaling", false));
  if (!file_.OnChannels(layer) || !center || !scale || rms || !(epsilon > 0)) {
    return file_.LayerError(layer,
                            "only a layer normalization over the channels (axis -1), "
                            "centered and scaled, with a positive epsilon, is supported");
  }
  RETURN_IF_ERROR(file_.RequireDefaults(
      layer, {"beta_regularizer", "gamma_regularizer", "beta_constraint", "gamma_constraint"}));
  for (const char* key : {"beta_initializer", "gamma_initializer"}) {
    ASSIGN_OR_RETURN(const VariableInit init, file_.Initializer(layer, key, 1, 1));
    if (init.random() || init.value != (key[0] == 'g' ? 1.0f : 0.0f)) {
      return file_.LayerError(layer, absl::StrCat("a ", key, " other than Keras's default"));
    }
  }
  // Over the last axis: a pixel's channels, or a whole vector (after
  // Flatten or Dense).
  const Dims d = net->dims(step.x);
  const int normalized =
      step.x_flat && d.pixels() > 1 ? net->Reshape(step.x, Dims{1, 1, d.size()}) : step.x;
  return Added{net->LayerNorm(layer.name, normalized, static_cast<float>(epsilon)), step.x_flat};
}

absl::StatusOr<KerasNetwork::Added> KerasNetwork::LayerScale(const Step& step, NetBuilder* net) {
  const KerasLayer& layer = *step.layer;
  if (layer.module != "keras.src.applications.convnext") {
    return file_.LayerError(layer, "this layer class is not supported");
  }
  // ConvNeXt's x * gamma, gamma [channels] starting at init_values.
  RETURN_IF_ERROR(OneInput(step));
  ASSIGN_OR_RETURN(const double init, file_.Number(layer, "init_values", 0));
  ASSIGN_OR_RETURN(const double dim, file_.Number(layer, "projection_dim", 0));
  if (dim != net->dims(step.x).channels) {
    return file_.LayerError(layer, absl::StrCat("a projection_dim of ", dim, " over ",
                                                net->dims(step.x).channels, " channels"));
  }
  return Added{net->ChannelScale(layer.name, step.x, VariableInit{0, static_cast<float>(init)}),
               step.x_flat};
}

absl::StatusOr<KerasNetwork::Added> KerasNetwork::CustomScaleLayer(const Step& step,
                                                                   NetBuilder* net) {
  const KerasLayer& layer = *step.layer;
  if (layer.module != "keras.src.applications.inception_resnet_v2" &&
      layer.module != "tf_keras.src.applications.inception_resnet_v2") {
    return file_.LayerError(layer, "this layer class is not supported");
  }
  // InceptionResNetV2's residual: inputs[0] + inputs[1] * scale.
  if (step.in.size() != 2) return file_.LayerError(layer, "a scaled sum of other than 2 inputs");
  RETURN_IF_ERROR(DistinctInputs(layer, step.in));
  RETURN_IF_ERROR(SameDims(step, /*channels=*/true, "inputs of different shapes", net));
  ASSIGN_OR_RETURN(const double scale, file_.Number(layer, "scale", 1));
  const int64_t channels = net->dims(step.in[1]).channels;
  const int scaled = net->ChannelAffine(layer.name, step.in[1], std::vector<float>(channels, scale),
                                        std::vector<float>(channels, 0));
  return SumAndRelu(step, {step.in[0], scaled}, net);
}

absl::StatusOr<KerasNetwork::Added> KerasNetwork::Concatenate(const Step& step, NetBuilder* net) {
  const KerasLayer& layer = *step.layer;
  if (step.in.size() < 2) return file_.LayerError(layer, "a Concatenate of fewer than 2 inputs");
  RETURN_IF_ERROR(DistinctInputs(layer, step.in));
  for (size_t j = 0; j < step.in.size(); ++j) {
    if (flat_[file_.index(layer.inputs[j])] && net->dims(step.in[j]).pixels() > 1) {
      return file_.LayerError(layer,
                              "a Concatenate of flattened maps (psrt would interleave them by "
                              "pixel): concatenate the maps, then Flatten");
    }
  }
  if (!file_.OnChannels(layer))
    return file_.LayerError(layer, "only the channel axis is supported");
  RETURN_IF_ERROR(SameDims(step, /*channels=*/false, "inputs of different heights or widths", net));
  return Added{net->Concat(step.in), AllFlat(layer)};
}

}  // namespace psrt
