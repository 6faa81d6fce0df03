#include "models/keras_weights.h"

#include <cstring>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "models/keras_file.h"
#include "models/keras_model.h"
#include "models/keras_weights_file.h"

namespace psrt {
namespace {

// One weight of a layer in Keras's weights file: a psrt variable, or (for
// a Normalization's adapt() statistics) a constant of psrt's.
struct KerasWeight {
  int variable = -1;  // In the model's variables(); -1: `constant`.
  Shape shape;        // Keras's.
  float constant = 0;
};

// A saveable of the weights file: its path, name and weights.
struct Saveable {
  std::string path;
  std::string name;
  const KerasLayer* layer = nullptr;  // Null for a model.
  std::vector<KerasWeight> weights;
};

// The model file's saveables, tied to the variables of psrt's model of it.
class WeightsLayout {
 public:
  static absl::StatusOr<WeightsLayout> Of(absl::string_view json, const std::string& source) {
    WeightsLayout layout(source);
    RETURN_IF_ERROR(layout.file_->Parse(json));
    ModelOptions options;
    options.intra_op_threads = 1;
    ASSIGN_OR_RETURN(const std::unique_ptr<Model> model, NewKerasModel(json, source, options));
    layout.variables_ = model->variables();
    for (size_t v = 0; v < layout.variables_.size(); ++v) {
      layout.index_[layout.variables_[v].name] = static_cast<int>(v);
    }
    RETURN_IF_ERROR(layout.Build());
    return layout;
  }

  const std::vector<Saveable>& saveables() const { return saveables_; }
  const std::vector<VariableDef>& variables() const { return variables_; }
  const KerasFile& file() const { return *file_; }

 private:
  explicit WeightsLayout(const std::string& source)
      : source_(source), file_(std::make_unique<KerasFile>(source)) {}

  absl::Status Build() {
    for (const KerasContainer& model : file_->containers()) {
      saveables_.push_back({model.weights_path, model.name, nullptr, {}});
    }
    std::vector<int> places(variables_.size(), 0);
    for (const KerasLayer& layer : file_->layers()) {
      if (layer.weights_path.empty()) continue;
      Saveable& saveable = saveables_.emplace_back();
      saveable.path = layer.weights_path;
      saveable.name = layer.name;
      saveable.layer = &layer;
      RETURN_IF_ERROR(AddWeights(layer, &saveable.weights));
      for (const KerasWeight& w : saveable.weights) {
        if (w.variable >= 0) ++places[w.variable];
      }
    }
    for (size_t v = 0; v < variables_.size(); ++v) {
      if (places[v] != 1) {
        return absl::InternalError(absl::StrCat(
            "model file ", source(), ": variable \"", variables_[v].name, "\" has ", places[v],
            " places in Keras's weights file; want 1"));
      }
    }
    return absl::OkStatus();
  }

  const std::string& source() const { return source_; }

  // The variable `name` in Keras's shape `shape` (same element count), or
  // psrt's own shape when `shape` is empty.
  absl::Status Add(const KerasLayer& layer, const std::string& name, Shape shape,
                   std::vector<KerasWeight>* weights) const {
    auto it = index_.find(name);
    if (it == index_.end()) {
      return file_->LayerError(layer, absl::StrCat("psrt's model has no variable \"", name,
                                                   "\" for this layer's weights"));
    }
    const Shape& own = variables_[it->second].shape;
    if (shape.empty()) shape = own;
    if (NumElements(shape) != NumElements(own)) {
      return file_->LayerError(layer, absl::StrCat("Keras's shape ", ShapeToString(shape),
                                                   " does not fit variable \"", name, "\" ",
                                                   ShapeToString(own)));
    }
    weights->push_back({it->second, std::move(shape)});
    return absl::OkStatus();
  }

  // The layer's weights in Keras's order (see keras_weights.h's table).
  absl::Status AddWeights(const KerasLayer& layer, std::vector<KerasWeight>* weights) {
    const std::string& n = layer.name;
    const std::string& kind = layer.class_name;
    auto bias = [&](const std::string& name) -> absl::Status {
      ASSIGN_OR_RETURN(const bool use_bias, file_->Bool(layer, "use_bias", true));
      return use_bias ? Add(layer, name, {}, weights) : absl::OkStatus();
    };
    auto shape_of = [&](const std::string& name) {
      auto it = index_.find(name);
      return it == index_.end() ? Shape() : variables_[it->second].shape;
    };
    if (kind == "Conv2D") {
      ASSIGN_OR_RETURN(const int64_t groups, file_->SquareInt(layer, "groups", 1));
      if (groups > 1) {  // psrt's depthwise filter [h, w, C, 1] is Keras's [h, w, 1, C].
        const Shape s = shape_of(n + "/depthwise_weights");
        RETURN_IF_ERROR(Add(layer, n + "/depthwise_weights",
                            s.size() == 4 ? Shape{s[0], s[1], 1, s[2]} : Shape(), weights));
      } else {
        RETURN_IF_ERROR(Add(layer, n + "/weights", {}, weights));
      }
      return bias(n + "/biases");
    }
    if (kind == "Dense") {  // Per pixel, psrt's 1x1 convolution [1, 1, in, units].
      const Shape s = shape_of(n + "/weights");
      RETURN_IF_ERROR(
          Add(layer, n + "/weights", s.size() == 4 ? Shape{s[2], s[3]} : Shape(), weights));
      return bias(n + "/biases");
    }
    if (kind == "DepthwiseConv2D") {
      RETURN_IF_ERROR(Add(layer, n + "/depthwise_weights", {}, weights));
      return bias(n + "/biases");
    }
    if (kind == "SeparableConv2D") {
      RETURN_IF_ERROR(Add(layer, n + "/depthwise_weights", {}, weights));
      const Shape s = shape_of(n + "/pointwise/weights");  // [1, 1, in, out] in both.
      RETURN_IF_ERROR(Add(layer, n + "/pointwise/weights", s, weights));
      return bias(n + "/pointwise/biases");
    }
    if (kind == "BatchNormalization") {
      // Its own variables, or those of the conv it is fused into.
      std::string scope = n;
      if (index_.count(n + "/moving_mean") == 0 && !layer.inputs.empty()) {
        // (A nested Sequential's name stands for its last layer.)
        scope = file_->layers()[file_->index(layer.inputs[0])].name + "/BatchNorm";
      }
      ASSIGN_OR_RETURN(const bool scale, file_->Bool(layer, "scale", true));
      ASSIGN_OR_RETURN(const bool center, file_->Bool(layer, "center", true));
      if (scale) RETURN_IF_ERROR(Add(layer, scope + "/gamma", {}, weights));
      if (center) RETURN_IF_ERROR(Add(layer, scope + "/beta", {}, weights));
      RETURN_IF_ERROR(Add(layer, scope + "/moving_mean", {}, weights));
      return Add(layer, scope + "/moving_variance", {}, weights);
    }
    if (kind == "LayerNormalization") {  // psrt reads only centered and scaled ones.
      RETURN_IF_ERROR(Add(layer, n + "/gamma", {}, weights));
      return Add(layer, n + "/beta", {}, weights);
    }
    if (kind == "LayerScale") return Add(layer, n + "/gamma", {}, weights);
    if (kind == "Normalization" && file_->IsNullField(layer, "mean")) {
      // adapt()'s mean, variance and count; psrt's constants are the
      // initial ones (keras_network.cc).
      ASSIGN_OR_RETURN(const int64_t channels, ImageChannels(layer));
      weights->push_back({-1, {channels}, 0.0f});
      weights->push_back({-1, {channels}, 1.0f});
      weights->push_back({-1, {}, 0.0f});
    }
    return absl::OkStatus();
  }

  // The channels of a layer that reads the images, through Rescaling and
  // Normalization layers only (EfficientNet's input Normalization).
  absl::StatusOr<int64_t> ImageChannels(const KerasLayer& layer) const {
    const KerasLayer* at = &layer;
    while (at->inputs.size() == 1) {
      const int in = file_->index(at->inputs[0]);
      if (in == file_->input()) return file_->input_shape().input_channels;
      at = &file_->layers()[in];
      if (at->class_name != "Rescaling" && at->class_name != "Normalization") break;
    }
    return file_->LayerError(layer,
                             "a Normalization that adapt() fills, away from the input: not "
                             "supported in Keras weights files");
  }

  std::string source_;
  std::unique_ptr<KerasFile> file_;
  std::vector<VariableDef> variables_;
  std::map<std::string, int> index_;
  std::vector<Saveable> saveables_;
};

}  // namespace

absl::Status WriteKerasWeightsOfModel(
    absl::string_view json, const std::string& source,
    const std::function<const Tensor*(const std::string& name)>& value, const std::string& out) {
  ASSIGN_OR_RETURN(const WeightsLayout layout, WeightsLayout::Of(json, source));
  std::vector<KerasWeightsEntry> entries;
  for (const Saveable& saveable : layout.saveables()) {
    KerasWeightsEntry& entry = entries.emplace_back();
    entry.path = saveable.path;
    entry.name = saveable.name;
    for (const KerasWeight& w : saveable.weights) {
      Tensor& t = entry.vars.emplace_back(w.shape);
      if (w.variable < 0) {
        for (float& x : t.flat()) x = w.constant;
        continue;
      }
      const VariableDef& def = layout.variables()[w.variable];
      const Tensor* v = value(def.name);
      if (v == nullptr) {
        return absl::NotFoundError(absl::StrCat("no values of variable \"", def.name,
                                                "\" (layer \"", saveable.name, "\" of model file ",
                                                source, ")"));
      }
      if (v->shape() != def.shape) {
        return absl::InvalidArgumentError(absl::StrCat(
            "variable \"", def.name, "\" has shape ", ShapeToString(v->shape()),
            "; model file ", source, " gives it ", ShapeToString(def.shape)));
      }
      std::memcpy(t.data(), v->data(), v->num_bytes());
    }
  }
  return WriteKerasWeights(out, entries);
}

absl::StatusOr<std::vector<Tensor>> ReadKerasWeightsOfModel(absl::string_view json,
                                                            const std::string& source,
                                                            const std::string& weights) {
  ASSIGN_OR_RETURN(const WeightsLayout layout, WeightsLayout::Of(json, source));
  ASSIGN_OR_RETURN(std::vector<KerasWeightsEntry> entries, ReadKerasWeights(weights));
  std::map<std::string, KerasWeightsEntry*> by_path;
  for (KerasWeightsEntry& entry : entries) by_path[entry.path] = &entry;
  const std::string what = absl::StrCat("Keras weights file ", weights, ": ");
  auto layer_error = [&](const Saveable& s, const std::string& message) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "layer \"", s.name, "\" (",
                     s.layer != nullptr ? s.layer->class_name : "model", ", ", s.path,
                     ") of model file ", source, ": ", message));
  };
  std::vector<Tensor> values(layout.variables().size());
  for (const Saveable& saveable : layout.saveables()) {
    auto it = by_path.find(saveable.path);
    const size_t held = it == by_path.end() ? 0 : it->second->vars.size();
    if (held != saveable.weights.size()) {
      return layer_error(saveable, it == by_path.end() && !saveable.weights.empty()
                                       ? "not in the weights file"
                                       : absl::StrCat("the weights file holds ", held,
                                                      " weights for it; want ",
                                                      saveable.weights.size()));
    }
    if (it == by_path.end()) continue;
    for (size_t k = 0; k < saveable.weights.size(); ++k) {
      const KerasWeight& w = saveable.weights[k];
      const Tensor& got = it->second->vars[k];
      if (got.shape() != w.shape) {
        return layer_error(saveable, absl::StrCat("weight ", k, " has shape ",
                                                  ShapeToString(got.shape()), "; want ",
                                                  ShapeToString(w.shape)));
      }
      if (w.variable < 0) {
        const bool count = w.shape.empty();  // adapt()'s count: any.
        for (float x : got.flat()) {
          if (!count && x != w.constant) {
            return layer_error(saveable,
                               "adapted statistics, which psrt keeps as constants of the model "
                               "file: put them in the layer's \"mean\" and \"variance\"");
          }
        }
        continue;
      }
      Tensor& v = values[w.variable];
      v = Tensor(layout.variables()[w.variable].shape);
      std::memcpy(v.data(), got.data(), got.num_bytes());
    }
    by_path.erase(it);
  }
  // The model's layers only: a compiled model's file also holds its
  // optimizer's variables ("optimizer/vars"), which a fresh job has no use for.
  for (const auto& [path, entry] : by_path) {
    if (!entry->vars.empty() && absl::StartsWith(path, "layers/")) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, path, " (\"", entry->name, "\") holds ", entry->vars.size(),
          " weights, but model file ", source, " has no layer with weights there"));
    }
  }
  return values;
}

}  // namespace psrt
