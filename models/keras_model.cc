#include "models/keras_model.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "models/keras_file.h"
#include "models/net.h"

namespace psrt {
namespace {

using kernels::Padding;

// A variable of more elements than this is refused (the file is then
// hostile or a mistake; 2^31 floats are 8 GiB).
constexpr double kMaxVariableElements = 2147483648.0;

// The network of a KerasFile: its layers as NetBuilder's (a Conv2D with the
// BatchNormalization and ReLU that alone follow it as one fused layer; an
// Add with the ReLU after it), checking what NetBuilder would refuse or
// compute otherwise than Keras.
class KerasNetwork {
 public:
  explicit KerasNetwork(const KerasFile& file) : file_(file) {}

  // Adds the layers to `net` (made with the file's input shape); returns
  // the class count (the logits are the last node).
  absl::StatusOr<int> Build(NetBuilder* net);

 private:
  // An error when two of a layer's inputs are one node (x + x, or x and an
  // identity of x): not supported.
  absl::Status DistinctInputs(const KerasLayer& layer, const std::vector<int>& in) const {
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
  // Whether the output layer's `activation` over `units` is the loss's
  // (left out of the network): softmax, or a sigmoid over one unit (a
  // binary classifier; see Build).
  bool IsLossActivation(const std::string& activation, int layer, int64_t units) const {
    return layer == file_.output() &&
           (activation == "softmax" || (activation == "sigmoid" && units == 1));
  }
  // A depthwise convolution's window (kernel_size, strides, dilation_rate,
  // padding), refusing what Keras refuses.
  absl::Status ReadDepthwiseWindow(const KerasLayer& layer, DepthwiseConvSpec* spec) const {
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
  // A BatchNormalization's options, refusing what psrt would compute
  // otherwise than Keras (regularizers, constraints, renorm, other axes or
  // initial values).
  absl::StatusOr<BatchNormSpec> BatchNormOf(const KerasLayer& norm) const {
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
  // Whether every input of `layer` is a vector.
  bool AllFlat(const KerasLayer& layer, const std::vector<bool>& flat) const {
    for (const std::string& name : layer.inputs) {
      if (!flat[file_.index(name)]) return false;
    }
    return true;
  }

  const KerasFile& file_;
};

absl::StatusOr<int> KerasNetwork::Build(NetBuilder* net) {
  const int n = static_cast<int>(file_.layers().size());
  std::vector<int> node(n, -1);
  std::vector<bool> done(n, false);
  // Whether a layer's output is a vector (features), which Dense needs.
  std::vector<bool> flat(n, false);
  for (int i = 0; i < n; ++i) {
    if (done[i]) continue;
    const KerasLayer& layer = file_.layers()[i];
    std::vector<int> in;
    for (const std::string& name : layer.inputs) in.push_back(node[file_.index(name)]);
    const bool is_input = layer.class_name == "InputLayer";
    if (is_input && !in.empty()) return file_.LayerError(layer, "an InputLayer that reads a layer");
    if (!is_input && i != file_.input() && in.empty()) {
      if (file_.input() < 0 && i == 0) {
        in.push_back(NetBuilder::kInput);  // A Sequential without InputLayer.
      } else {
        return file_.LayerError(layer, "reads nothing");
      }
    }
    const bool single = in.size() == 1;
    const int x = single ? in[0] : -1;
    // Whether the one input is a vector: the model's input of (features),
    // or a layer that made one.
    bool x_flat = false;
    if (single) {
      x_flat = layer.inputs.empty()
                   ? file_.input_shape().input_height == 1 && file_.input_shape().input_width == 1
                   : flat[file_.index(layer.inputs[0])];
    }
    auto need_one_input = [&]() -> absl::Status {
      if (!single)
        return file_.LayerError(layer, absl::StrCat("has ", in.size(), " inputs, want 1"));
      return absl::OkStatus();
    };
    // The sum of `inputs` (of equal dims), with the ReLU layer that alone
    // reads this one fused into it.
    auto sum_and_relu = [&](const std::vector<int>& inputs) {
      const int relu = file_.OnlyConsumer(i);
      const bool fuse = relu >= 0 && file_.IsRelu(relu);
      const int sum = net->Sum(inputs, fuse);
      if (fuse) {
        node[relu] = sum;
        done[relu] = true;
      }
      return sum;
    };
    const std::string& kind = layer.class_name;
    // A Conv2D whose groups are its input's channels is a depthwise
    // convolution (ConvNeXt's); a bad "groups" is the Conv2D branch's to name.
    const absl::StatusOr<int64_t> groups =
        kind == "Conv2D" ? file_.SquareInt(layer, "groups", 1) : int64_t{1};
    int out = -1;
    bool out_flat = false;
    if (is_input) {
      out = NetBuilder::kInput;
      out_flat = file_.input_shape().input_height == 1 && file_.input_shape().input_width == 1;
    } else if (kind == "Conv2D" && groups.ok() && *groups != 1) {
      RETURN_IF_ERROR(need_one_input());
      if (x_flat && x != NetBuilder::kInput) {
        return file_.LayerError(layer, "a convolution of a vector (after Flatten or Dense)");
      }
      const int64_t channels = net->dims(x).channels;
      ASSIGN_OR_RETURN(const int64_t filters, file_.SquareInt(layer, "filters", 0));
      if (*groups != channels || filters != channels) {
        return file_.LayerError(
            layer, absl::StrCat("groups=", *groups, " over ", channels, " channels into ", filters,
                                " filters: only a depthwise convolution (groups, filters and "
                                "the input's channels equal) is supported"));
      }
      RETURN_IF_ERROR(file_.RequireDefaults(
          layer, {"data_format", "kernel_regularizer", "bias_regularizer",
                  "activity_regularizer", "kernel_constraint", "bias_constraint", "lora_rank"}));
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
      out = net->DepthwiseConv(layer.name, x, spec);
      if (activation == "relu") {
        out = net->Relu(out);
      } else if (activation != "linear") {
        out = net->Activate(out, file_.ActivationSpecOf(activation));
      }
    } else if (kind == "Conv2D") {
      RETURN_IF_ERROR(need_one_input());
      if (x_flat && x != NetBuilder::kInput) {
        return file_.LayerError(layer, "a convolution of a vector (after Flatten or Dense)");
      }
      ConvSpec spec;
      ASSIGN_OR_RETURN(const int64_t filters, file_.SquareInt(layer, "filters", 0));
      ASSIGN_OR_RETURN(const auto kernel, file_.KernelSize(layer));
      ASSIGN_OR_RETURN(spec.stride, file_.SquareInt(layer, "strides", 1));
      ASSIGN_OR_RETURN(const int64_t dilation, file_.SquareInt(layer, "dilation_rate", 1));
      ASSIGN_OR_RETURN(const int64_t groups, file_.SquareInt(layer, "groups", 1));
      ASSIGN_OR_RETURN(const std::string format,
                       file_.String(layer, "data_format", "channels_last"));
      if (dilation != 1 || groups != 1 || format != "channels_last") {
        return file_.LayerError(layer, "dilation, groups and channels_first are not supported");
      }
      RETURN_IF_ERROR(file_.RequireDefaults(
          layer, {"kernel_regularizer", "bias_regularizer", "activity_regularizer",
                  "kernel_constraint", "bias_constraint", "lora_rank"}));
      ASSIGN_OR_RETURN(spec.padding, file_.PaddingOf(layer));
      ASSIGN_OR_RETURN(spec.bias, file_.Bool(layer, "use_bias", true));
      ASSIGN_OR_RETURN(const std::string activation, file_.Activation(layer));
      if (activation == "softmax") return file_.LayerError(layer, "a softmax convolution");
      spec.filter_height = kernel.first;
      spec.filter_width = kernel.second;
      spec.out_channels = filters;
      spec.relu = activation == "relu";
      // Another activation than ReLU (or none) is a layer after the conv.
      const bool activated = activation != "relu" && activation != "linear";
      const double in_channels = net->dims(x).channels;
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
      // Conv2D > BatchNormalization (> ReLU): one fused layer, when the
      // conv has no bias or activation and the batch norm centers and
      // scales; otherwise the batch norm is a layer of its own.
      std::vector<int> fused = {i};
      const int bn = file_.OnlyConsumer(i);
      if (!spec.bias && activation == "linear" && bn >= 0 &&
          file_.layers()[bn].class_name == "BatchNormalization" &&
          file_.layers()[bn].inputs.size() == 1) {
        ASSIGN_OR_RETURN(const BatchNormSpec norm, BatchNormOf(file_.layers()[bn]));
        if (norm.center && norm.scale) {
          spec.batch_norm = true;
          spec.bn_epsilon = norm.epsilon;
          spec.bn_momentum = norm.momentum;
          spec.bn_bessel = norm.bessel;
          fused.push_back(bn);
          const int relu = file_.OnlyConsumer(bn);
          if (relu >= 0 && file_.IsRelu(relu)) {
            spec.relu = true;
            fused.push_back(relu);
          }
        }
      }
      out = net->Conv(layer.name, x, spec);
      if (activated) out = net->Activate(out, file_.ActivationSpecOf(activation));
      if (!net->status().ok()) return file_.LayerError(layer, net->status().message());
      for (int f : fused) {
        node[f] = out;
        done[f] = true;
      }
      continue;
    } else if (kind == "DepthwiseConv2D" || kind == "SeparableConv2D") {
      RETURN_IF_ERROR(need_one_input());
      if (x_flat && x != NetBuilder::kInput) {
        return file_.LayerError(layer, "a convolution of a vector (after Flatten or Dense)");
      }
      const bool separable = kind == "SeparableConv2D";
      RETURN_IF_ERROR(file_.RequireDefaults(
          layer, {"data_format", "depthwise_regularizer", "pointwise_regularizer",
                  "bias_regularizer", "activity_regularizer", "depthwise_constraint",
                  "pointwise_constraint", "bias_constraint"}));
      DepthwiseConvSpec spec;
      RETURN_IF_ERROR(ReadDepthwiseWindow(layer, &spec));
      ASSIGN_OR_RETURN(spec.multiplier, file_.SquareInt(layer, "depth_multiplier", 1));
      if (spec.multiplier < 1) return file_.LayerError(layer, "depth_multiplier must be positive");
      ASSIGN_OR_RETURN(const bool bias, file_.Bool(layer, "use_bias", true));
      ASSIGN_OR_RETURN(const std::string activation, file_.Activation(layer));
      if (activation == "softmax") return file_.LayerError(layer, "a softmax convolution");
      const double channels = net->dims(x).channels;
      const double taps = static_cast<double>(spec.filter_height) * spec.filter_width;
      const double depthwise_out = channels * spec.multiplier;
      if (taps * depthwise_out > kMaxVariableElements) {
        return file_.LayerError(layer, "a kernel of over 2^31 weights");
      }
      // Keras's fans of a [h, w, channels, multiplier] kernel.
      ASSIGN_OR_RETURN(spec.weights_init,
                       file_.Initializer(layer, "depthwise_initializer", taps * channels,
                                         taps * spec.multiplier));
      if (!spec.weights_init.random()) {
        return file_.LayerError(layer,
                                "a constant depthwise_initializer (the layer could not learn)");
      }
      // A SeparableConv2D is the depthwise convolution, then a 1x1 one
      // ("<layer>/pointwise") with the layer's bias.
      spec.bias = bias && !separable;
      if (spec.bias) {
        ASSIGN_OR_RETURN(spec.bias_init,
                         file_.Initializer(layer, "bias_initializer", depthwise_out, depthwise_out));
      }
      out = net->DepthwiseConv(layer.name, x, spec);
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
        ASSIGN_OR_RETURN(pointwise.weights_init,
                         file_.Initializer(layer, "pointwise_initializer", depthwise_out,
                                           pointwise.out_channels));
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
      if (activation == "relu") {
        out = net->Relu(out);
      } else if (activation != "linear") {
        out = net->Activate(out, file_.ActivationSpecOf(activation));
      }
    } else if (kind == "BatchNormalization") {
      RETURN_IF_ERROR(need_one_input());
      ASSIGN_OR_RETURN(const BatchNormSpec norm, BatchNormOf(layer));
      out = net->BatchNorm(layer.name, x, norm);
      out_flat = x_flat;
    } else if (kind == "ZeroPadding2D") {
      RETURN_IF_ERROR(need_one_input());
      RETURN_IF_ERROR(file_.RequireDefaults(layer, {"data_format"}));
      if (x_flat && x != NetBuilder::kInput) {
        return file_.LayerError(layer, "a padding of a vector (after Flatten or Dense)");
      }
      ASSIGN_OR_RETURN(const auto sides, file_.ZeroPadding(layer));
      out = net->ZeroPad(x, ZeroPadSpec{sides[0], sides[1], sides[2], sides[3]});
    } else if ((kind == "Add" || kind == "Multiply") && layer.operation && in.size() == 1 &&
               layer.constants.size() == 1) {
      // Keras 3's x + c and x * c (MobileNetV3's hard sigmoid).
      const int64_t channels = net->dims(x).channels;
      const float c = static_cast<float>(layer.constants[0]);
      out = net->ChannelAffine(layer.name, in[0], std::vector<float>(channels, kind == "Add" ? 1 : c),
                               std::vector<float>(channels, kind == "Add" ? c : 0));
      out_flat = flat[file_.index(layer.inputs[0])];
    } else if (kind == "Rescaling") {
      RETURN_IF_ERROR(need_one_input());
      const int64_t channels = net->dims(x).channels;
      ASSIGN_OR_RETURN(std::vector<float> scale, file_.PerChannel(layer, "scale", channels, 1));
      ASSIGN_OR_RETURN(std::vector<float> offset, file_.PerChannel(layer, "offset", channels, 0));
      out = net->ChannelAffine(layer.name, x, std::move(scale), std::move(offset));
      out_flat = x_flat;
    } else if (kind == "Normalization") {
      RETURN_IF_ERROR(need_one_input());
      ASSIGN_OR_RETURN(const bool invert, file_.Bool(layer, "invert", false));
      if (invert || !file_.OnChannels(layer)) {
        return file_.LayerError(layer, "only a normalization over the channels, not inverted, "
                                       "is supported");
      }
      const int64_t channels = net->dims(x).channels;
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
      out = net->ChannelAffine(layer.name, x, std::move(scale), std::move(offset),
                               given ? 0 : 2 * channels + 1);
      out_flat = x_flat;
    } else if (kind == "Reshape") {
      RETURN_IF_ERROR(need_one_input());
      ASSIGN_OR_RETURN(const std::vector<int64_t> target, file_.Ints(layer, "target_shape"));
      const Dims d = net->dims(x);
      Dims to;
      if (target.size() == 1) {
        to = Dims{1, 1, target[0]};
      } else if (target.size() == 3) {
        to = Dims{target[0], target[1], target[2]};
      } else {
        return file_.LayerError(layer, "a target_shape of other than 1 or 3 dimensions");
      }
      if (to.size() != d.size()) {
        return file_.LayerError(layer, absl::StrCat("a reshape of ", d.size(), " values into ",
                                                    to.size()));
      }
      out = net->Reshape(x, to);
      out_flat = target.size() == 1;
    } else if (kind == "Multiply") {
      if (in.size() != 2) {
        return file_.LayerError(layer, absl::StrCat(
            "a Multiply of ", in.size(), " tensors; want 2, or one and a constant"));
      }
      RETURN_IF_ERROR(DistinctInputs(layer, in));
      const Dims a = net->dims(in[0]), b = net->dims(in[1]);
      const bool alike = a.height == b.height && a.width == b.width;
      if (a.channels != b.channels || (!alike && a.pixels() != 1 && b.pixels() != 1)) {
        return file_.LayerError(layer, absl::StrCat(
            "a product of ", a.height, "x", a.width, "x", a.channels, " and ", b.height, "x",
            b.width, "x", b.channels, " (want equal shapes, or one 1x1 of the other's channels)"));
      }
      out = net->Multiply(in[0], in[1]);
      out_flat = AllFlat(layer, flat);
    } else if (kind == "Dense") {
      RETURN_IF_ERROR(need_one_input());
      const Dims d = net->dims(x);
      // On a map Keras applies it to each pixel's channels (ConvNeXt's
      // pointwise layers): a 1x1 convolution.
      const bool per_pixel = !x_flat && d.pixels() > 1;
      const int64_t fan_in = per_pixel ? d.channels : d.size();
      ASSIGN_OR_RETURN(const int64_t units, file_.SquareInt(layer, "units", 0));
      RETURN_IF_ERROR(file_.RequireDefaults(
          layer, {"kernel_regularizer", "bias_regularizer", "activity_regularizer",
                  "kernel_constraint", "bias_constraint", "lora_rank"}));
      if (static_cast<double>(fan_in) * units > kMaxVariableElements) {
        return file_.LayerError(layer, "over 2^31 weights");
      }
      ASSIGN_OR_RETURN(const bool bias, file_.Bool(layer, "use_bias", true));
      ASSIGN_OR_RETURN(const std::string activation, file_.Activation(layer));
      if (activation == "softmax" && per_pixel) {
        return file_.LayerError(
            layer, absl::StrCat("a softmax of Dense on a ", d.height, "x", d.width, "x",
                                d.channels, " map (Keras applies it per pixel): put a Flatten or "
                                "a pooling before it"));
      }
      if (activation == "softmax" && i != file_.output()) {
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
      if (per_pixel) {
        ConvSpec pointwise;
        pointwise.filter_height = pointwise.filter_width = 1;
        pointwise.out_channels = units;
        pointwise.bias = bias;
        pointwise.relu = activation == "relu";
        pointwise.weights_init = weights;
        pointwise.bias_init = biases;
        out = net->Conv(layer.name, x, pointwise);
      } else {
        out = net->FullyConnected(layer.name, x, units, activation == "relu", weights, biases,
                                  bias);
      }
      if (activation != "relu" && activation != "linear" &&
          !IsLossActivation(activation, i, units)) {
        out = net->Activate(out, file_.ActivationSpecOf(activation));
      }
      out_flat = !per_pixel;
    } else if (kind == "MaxPooling2D" || kind == "AveragePooling2D") {
      RETURN_IF_ERROR(need_one_input());
      RETURN_IF_ERROR(file_.RequireDefaults(layer, {"data_format"}));
      ASSIGN_OR_RETURN(const int64_t window, file_.SquareInt(layer, "pool_size", 2));
      ASSIGN_OR_RETURN(const int64_t stride, file_.SquareInt(layer, "strides", window));
      ASSIGN_OR_RETURN(const Padding padding, file_.PaddingOf(layer));
      out = kind == "MaxPooling2D" ? net->MaxPool(x, window, stride, padding)
                                   : net->AvgPool(x, window, stride, padding);
    } else if (kind == "GlobalAveragePooling2D" || kind == "GlobalMaxPooling2D") {
      RETURN_IF_ERROR(need_one_input());
      RETURN_IF_ERROR(file_.RequireDefaults(layer, {"data_format"}));
      if (x_flat && x != NetBuilder::kInput) {
        return file_.LayerError(layer, "a pooling of a vector (after Flatten or Dense)");
      }
      ASSIGN_OR_RETURN(const bool keepdims, file_.Bool(layer, "keepdims", false));
      if (kind == "GlobalAveragePooling2D") {
        out = net->GlobalAvgPool(x);
      } else {
        // One window over the whole map: SAME padding (which max pooling
        // never picks) squares a map of other height than width.
        const Dims d = net->dims(x);
        const int64_t side = std::max(d.height, d.width);
        out = net->MaxPool(x, side, side, Padding::kSame);
      }
      out_flat = !keepdims;  // With keepdims a 1x1 map, which a Conv2D may read.
    } else if (kind == "Flatten") {
      RETURN_IF_ERROR(need_one_input());
      RETURN_IF_ERROR(file_.RequireDefaults(layer, {"data_format"}));
      out = x;  // Dense reads its input flattened, in the same (NHWC) order.
      out_flat = true;
    } else if (kind == "Dropout" || kind == "SpatialDropout2D") {
      RETURN_IF_ERROR(need_one_input());
      ASSIGN_OR_RETURN(const double rate, file_.Number(layer, "rate", 0));
      if (rate < 0 || rate >= 1) return file_.LayerError(layer, "rate outside [0, 1)");
      // A noise_shape of (None, 1, 1, 1) draws per example (stochastic
      // depth), SpatialDropout2D per channel of an example.
      bool per_example = false;
      if (kind == "Dropout" && !file_.IsNullField(layer, "noise_shape")) {
        ASSIGN_OR_RETURN(per_example, file_.NoiseShapePerExample(layer));
      }
      if (kind == "SpatialDropout2D") RETURN_IF_ERROR(file_.RequireDefaults(layer, {"data_format"}));
      out = rate == 0 ? x
                      : net->Dropout(x, static_cast<float>(1 - rate), per_example,
                                     kind == "SpatialDropout2D");
      out_flat = x_flat;
    } else if (kind == "Activation" || kind == "ReLU") {
      RETURN_IF_ERROR(need_one_input());
      std::string activation = "relu";
      if (kind == "Activation") {
        ASSIGN_OR_RETURN(activation, file_.Activation(layer));
      }
      if (activation == "softmax" && i != file_.output()) {
        return file_.LayerError(layer, "softmax is supported only in the last layer");
      }
      if (kind == "ReLU" && !file_.IsRelu(i)) {  // A cap, a slope or a threshold.
        ASSIGN_OR_RETURN(const kernels::ActivationSpec relu, file_.ReluLayerSpec(layer));
        out = net->Activate(x, relu);
      } else if (activation == "relu") {
        out = net->Relu(x);
      } else if (activation == "linear" ||
                 IsLossActivation(activation, i, net->dims(x).channels)) {
        out = x;
      } else {
        out = net->Activate(x, file_.ActivationSpecOf(activation));
      }
      out_flat = x_flat;
    } else if (kind == "Add") {
      if (in.size() < 2) return file_.LayerError(layer, "an Add of fewer than 2 inputs");
      RETURN_IF_ERROR(DistinctInputs(layer, in));
      for (int a : in) {
        const Dims da = net->dims(a), d0 = net->dims(in[0]);
        if (da.height != d0.height || da.width != d0.width || da.channels != d0.channels) {
          return file_.LayerError(layer, "inputs of different shapes");
        }
      }
      out = sum_and_relu(in);
      out_flat = AllFlat(layer, flat);
    } else if (kind == "LayerNormalization") {
      RETURN_IF_ERROR(need_one_input());
      ASSIGN_OR_RETURN(const double epsilon, file_.Number(layer, "epsilon", 1e-3));
      ASSIGN_OR_RETURN(const bool center, file_.Bool(layer, "center", true));
      ASSIGN_OR_RETURN(const bool scale, file_.Bool(layer, "scale", true));
      ASSIGN_OR_RETURN(const bool rms, file_.Bool(layer, "rms_scaling", false));
      if (!file_.OnChannels(layer) || !center || !scale || rms || !(epsilon > 0)) {
        return file_.LayerError(layer, "only a layer normalization over the channels (axis -1), "
                                       "centered and scaled, with a positive epsilon, is "
                                       "supported");
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
      const Dims d = net->dims(x);
      const int normalized = x_flat && d.pixels() > 1 ? net->Reshape(x, Dims{1, 1, d.size()}) : x;
      out = net->LayerNorm(layer.name, normalized, static_cast<float>(epsilon));
      out_flat = x_flat;
    } else if (kind == "LayerScale" && layer.module == "keras.src.applications.convnext") {
      // ConvNeXt's x * gamma, gamma [channels] starting at init_values.
      RETURN_IF_ERROR(need_one_input());
      ASSIGN_OR_RETURN(const double init, file_.Number(layer, "init_values", 0));
      ASSIGN_OR_RETURN(const double dim, file_.Number(layer, "projection_dim", 0));
      if (dim != net->dims(x).channels) {
        return file_.LayerError(layer, absl::StrCat("a projection_dim of ", dim, " over ",
                                                    net->dims(x).channels, " channels"));
      }
      out = net->ChannelScale(layer.name, x, VariableInit{0, static_cast<float>(init)});
      out_flat = x_flat;
    } else if (kind == "CustomScaleLayer" &&
               (layer.module == "keras.src.applications.inception_resnet_v2" ||
                layer.module == "tf_keras.src.applications.inception_resnet_v2")) {
      // InceptionResNetV2's residual: inputs[0] + inputs[1] * scale.
      if (in.size() != 2) return file_.LayerError(layer, "a scaled sum of other than 2 inputs");
      RETURN_IF_ERROR(DistinctInputs(layer, in));
      const Dims a = net->dims(in[0]), b = net->dims(in[1]);
      if (a.height != b.height || a.width != b.width || a.channels != b.channels) {
        return file_.LayerError(layer, "inputs of different shapes");
      }
      ASSIGN_OR_RETURN(const double scale, file_.Number(layer, "scale", 1));
      const int scaled = net->ChannelAffine(layer.name, in[1],
                                            std::vector<float>(b.channels, scale),
                                            std::vector<float>(b.channels, 0));
      out = sum_and_relu({in[0], scaled});
      out_flat = AllFlat(layer, flat);
    } else if (kind == "Concatenate") {
      if (in.size() < 2) return file_.LayerError(layer, "a Concatenate of fewer than 2 inputs");
      RETURN_IF_ERROR(DistinctInputs(layer, in));
      out_flat = AllFlat(layer, flat);
      for (size_t j = 0; j < in.size(); ++j) {
        if (flat[file_.index(layer.inputs[j])] && net->dims(in[j]).pixels() > 1) {
          return file_.LayerError(layer,
                                  "a Concatenate of flattened maps (psrt would interleave "
                                  "them by pixel): concatenate the maps, then Flatten");
        }
      }
      if (!file_.OnChannels(layer))
        return file_.LayerError(layer, "only the channel axis is supported");
      for (int a : in) {
        const Dims da = net->dims(a), d0 = net->dims(in[0]);
        if (da.height != d0.height || da.width != d0.width) {
          return file_.LayerError(layer, "inputs of different heights or widths");
        }
      }
      out = net->Concat(in);
    } else {
      return file_.LayerError(layer, "this layer class is not supported");
    }
    if (!net->status().ok()) return file_.LayerError(layer, net->status().message());
    node[i] = out;
    flat[i] = out_flat;
    done[i] = true;
  }
  const int logits = node[file_.output()];
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

ModelOptions WithShape(ModelOptions options, const KerasModelShape& shape, int classes) {
  options.input_height = shape.input_height;
  options.input_width = shape.input_width;
  options.input_channels = shape.input_channels;
  options.num_classes = classes;
  return options;
}

}  // namespace

absl::StatusOr<KerasModelShape> ReadKerasModelShape(absl::string_view json,
                                                    const std::string& source) {
  KerasFile file(source);
  RETURN_IF_ERROR(file.Parse(json));
  NetBuilder net(WithShape(ModelOptions(), file.input_shape(), 1));
  ASSIGN_OR_RETURN(const int classes, KerasNetwork(file).Build(&net));
  KerasModelShape shape = file.input_shape();
  shape.num_classes = classes;
  return shape;
}

absl::StatusOr<std::unique_ptr<Model>> NewKerasModel(absl::string_view json,
                                                     const std::string& source,
                                                     const ModelOptions& options) {
  ASSIGN_OR_RETURN(const KerasModelShape shape, ReadKerasModelShape(json, source));
  KerasFile file(source);
  RETURN_IF_ERROR(file.Parse(json));
  NetBuilder net(WithShape(options, shape, shape.num_classes));
  RETURN_IF_ERROR(KerasNetwork(file).Build(&net).status());
  return net.Build(absl::StrCat("model file ", source));
}

}  // namespace psrt
