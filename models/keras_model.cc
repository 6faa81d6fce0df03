#include "models/keras_model.h"

#include <cmath>
#include <initializer_list>
#include <map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "models/initializers.h"
#include "models/net.h"

namespace psrt {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;
using kernels::Padding;

// A variable of more elements than this is refused (the file is then
// hostile or a mistake; 2^31 floats are 8 GiB).
constexpr double kMaxVariableElements = 2147483648.0;

// A value's field, or null.
const Value* Field(const Struct& s, const std::string& key) {
  auto it = s.fields().find(key);
  return it == s.fields().end() ? nullptr : &it->second;
}

bool IsNull(const Value* v) { return v == nullptr || v->has_null_value(); }

// One layer of the file.
struct KerasLayer {
  std::string name;
  std::string class_name;
  const Struct* config = nullptr;
  std::vector<std::string> inputs;  // The layers it reads, in order.
  std::vector<int> consumers;       // The layers that read it.
};

class KerasImporter {
 public:
  KerasImporter(std::string source) : source_(std::move(source)) {}

  absl::Status Parse(absl::string_view json);
  // Adds the layers to `net` (made with shape()'s input); returns the node
  // of the logits.
  absl::StatusOr<int> Build(NetBuilder* net);

  const KerasModelShape& shape() const { return shape_; }

 private:
  absl::Status FileError(absl::string_view message) const {
    return absl::InvalidArgumentError(absl::StrCat("model file ", source_, ": ", message));
  }
  absl::Status LayerError(const KerasLayer& layer, absl::string_view message) const {
    return absl::InvalidArgumentError(absl::StrCat("model file ", source_, ": layer \"", layer.name,
                                                   "\" (", layer.class_name, "): ", message));
  }

  absl::Status ParseSequential(const Struct& config);
  absl::Status ParseFunctional(const Struct& config);
  absl::Status ParseInputShape(const Value& shape, const std::string& what);
  absl::StatusOr<int> OnlyLayerName(const Value* names, const char* what);

  // Typed config fields of `layer`, or an error naming it.
  absl::StatusOr<std::string> String(const KerasLayer& layer, const std::string& key,
                                     const std::string& fallback) const;
  absl::StatusOr<double> Number(const KerasLayer& layer, const std::string& key,
                                double fallback) const;
  // An int or a list of equal ints ("strides": [2, 2]); `fallback` when
  // absent or null.
  absl::StatusOr<int64_t> SquareInt(const KerasLayer& layer, const std::string& key,
                                    int64_t fallback) const;
  // The (height, width) of "kernel_size": an int or a list of two.
  absl::StatusOr<std::pair<int64_t, int64_t>> KernelSize(const KerasLayer& layer) const;
  absl::StatusOr<bool> Bool(const KerasLayer& layer, const std::string& key, bool fallback) const;
  // Whether the layer's "axis" (a number, or a list of one) is the
  // channels' (-1 or 3).
  bool OnChannels(const KerasLayer& layer) const;
  // The initializer at `key` for a weight of fan_in, fan_out.
  absl::StatusOr<VariableInit> Initializer(const KerasLayer& layer, const std::string& key,
                                           double fan_in, double fan_out) const;
  absl::StatusOr<Padding> PaddingOf(const KerasLayer& layer) const;
  // The activation of a layer: "relu", "linear" or "softmax".
  absl::StatusOr<std::string> Activation(const KerasLayer& layer) const;

  // Whether layer i is a plain ReLU (Activation "relu", or ReLU with its
  // defaults) of one input.
  bool IsRelu(int i) const;
  // An error naming the first of `keys` that the layer sets to anything but
  // null, false or "channels_last" (a regularizer, a constraint, ...: what
  // psrt does not do, and would otherwise ignore).
  absl::Status RequireDefaults(const KerasLayer& layer,
                               std::initializer_list<const char*> keys) const;
  // An error when two of a layer's inputs are one node (x + x, or x and an
  // identity of x): not supported.
  absl::Status DistinctInputs(const KerasLayer& layer, const std::vector<int>& in) const {
    for (size_t a = 0; a < in.size(); ++a) {
      for (size_t b = 0; b < a; ++b) {
        if (in[a] == in[b]) {
          return LayerError(layer,
                            "reads one tensor twice (directly, or through an identity "
                            "such as Flatten or a linear Activation): not supported");
        }
      }
    }
    return absl::OkStatus();
  }
  // Whether every input of `layer` is a vector.
  bool AllFlat(const KerasLayer& layer, const std::vector<bool>& flat) const {
    for (const std::string& name : layer.inputs) {
      if (!flat[index_.at(name)]) return false;
    }
    return true;
  }
  // The one consumer of layer i, or -1.
  int OnlyConsumer(int i) const {
    return layers_[i].consumers.size() == 1 ? layers_[i].consumers[0] : -1;
  }

  const std::string source_;
  Struct root_;
  std::vector<KerasLayer> layers_;
  std::map<std::string, int> index_;
  int input_ = -1;   // The InputLayer, or -1 (a Sequential without one).
  int output_ = -1;  // The last layer.
  KerasModelShape shape_;
};

absl::Status KerasImporter::Parse(absl::string_view json) {
  google::protobuf::util::JsonParseOptions parse_options;
  const auto parsed = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &root_, parse_options);
  if (!parsed.ok()) {
    return FileError(absl::StrCat("not JSON, or not a JSON object: ", parsed.ToString()));
  }
  const Value* class_name = Field(root_, "class_name");
  const Value* config = Field(root_, "config");
  if (class_name == nullptr || !class_name->has_string_value() || config == nullptr ||
      !config->has_struct_value()) {
    return FileError(
        "no \"class_name\" and \"config\" at the top: not a Keras model file (model.to_json())");
  }
  const std::string& kind = class_name->string_value();
  absl::Status status;
  if (kind == "Sequential") {
    status = ParseSequential(config->struct_value());
  } else if (kind == "Functional" || kind == "Model") {
    status = ParseFunctional(config->struct_value());
  } else {
    return FileError(absl::StrCat("a model of class ", kind,
                                  "; only Sequential and Functional models are read"));
  }
  if (!status.ok()) return status;
  for (size_t i = 0; i < layers_.size(); ++i) {
    for (const std::string& in : layers_[i].inputs) {
      auto it = index_.find(in);
      if (it == index_.end() || it->second >= static_cast<int>(i)) {
        return LayerError(layers_[i], absl::StrCat("reads \"", in, "\", which is ",
                                                   it == index_.end() ? "no layer of the model"
                                                                      : "not an earlier layer"));
      }
      layers_[it->second].consumers.push_back(static_cast<int>(i));
    }
  }
  if (output_ < 0) return FileError("no layers");
  for (int i = 0; i < output_; ++i) {
    if (layers_[i].consumers.empty()) {
      return LayerError(layers_[i], "read by no layer: every layer must lead to the output");
    }
  }
  return absl::OkStatus();
}

absl::Status KerasImporter::ParseInputShape(const Value& shape, const std::string& what) {
  if (!shape.has_list_value()) return FileError(absl::StrCat(what, " is not a list"));
  std::vector<int> dims;
  for (int i = 1; i < shape.list_value().values_size(); ++i) {
    const Value& d = shape.list_value().values(i);
    if (!d.has_number_value() || d.number_value() < 1 || d.number_value() > (1 << 24) ||
        d.number_value() != std::floor(d.number_value())) {
      return FileError(absl::StrCat(what,
                                    " has a dimension that is not a positive number "
                                    "(inputs of variable size are not supported)"));
    }
    dims.push_back(static_cast<int>(d.number_value()));
  }
  if (dims.empty() || dims.size() > 3) {
    return FileError(absl::StrCat(what, " has ", dims.size(),
                                  " dimensions besides the batch; want (features), "
                                  "(height, width) or (height, width, channels)"));
  }
  if (dims.size() == 1) dims = {1, 1, dims[0]};
  if (dims.size() == 2) dims.push_back(1);
  if (int64_t{dims[0]} * dims[1] * dims[2] > (int64_t{1} << 30)) {
    return FileError(absl::StrCat(what, " is over 2^30 values an example"));
  }
  shape_.input_height = dims[0];
  shape_.input_width = dims[1];
  shape_.input_channels = dims[2];
  return absl::OkStatus();
}

absl::Status KerasImporter::ParseSequential(const Struct& config) {
  const Value* layers = Field(config, "layers");
  if (layers == nullptr || !layers->has_list_value()) return FileError("no \"layers\" list");
  const Value* shape = nullptr;
  std::string shape_what;
  for (const Value& entry : layers->list_value().values()) {
    const Value* class_name =
        entry.has_struct_value() ? Field(entry.struct_value(), "class_name") : nullptr;
    const Value* layer_config =
        entry.has_struct_value() ? Field(entry.struct_value(), "config") : nullptr;
    if (class_name == nullptr || !class_name->has_string_value() || layer_config == nullptr ||
        !layer_config->has_struct_value()) {
      return FileError("a layer without \"class_name\" and \"config\"");
    }
    KerasLayer layer;
    layer.class_name = class_name->string_value();
    layer.config = &layer_config->struct_value();
    const Value* name = Field(*layer.config, "name");
    layer.name = name != nullptr && name->has_string_value()
                     ? name->string_value()
                     : absl::StrCat("layer_", layers_.size());
    // Keras 2 puts the input shape on the first layer, Keras 3 on an
    // InputLayer (batch_shape) or the model (build_input_shape).
    for (const char* key : {"batch_shape", "batch_input_shape"}) {
      if (shape == nullptr && !IsNull(Field(*layer.config, key))) {
        shape = Field(*layer.config, key);
        shape_what = absl::StrCat("the \"", key, "\" of layer \"", layer.name, "\"");
      }
    }
    if (layer.class_name == "InputLayer") {
      if (!layers_.empty()) return LayerError(layer, "an InputLayer that is not the first");
      input_ = 0;
    } else if (!layers_.empty()) {
      layer.inputs.push_back(layers_.back().name);
    }
    index_[layer.name] = static_cast<int>(layers_.size());
    layers_.push_back(std::move(layer));
  }
  if (shape == nullptr && !IsNull(Field(config, "build_input_shape"))) {
    shape = Field(config, "build_input_shape");
    shape_what = "the model's \"build_input_shape\"";
  }
  if (shape == nullptr) {
    return FileError("no input shape (an InputLayer, or the first layer's batch_input_shape)");
  }
  if (index_.size() != layers_.size()) return FileError("two layers of the same name");
  output_ = static_cast<int>(layers_.size()) - 1;
  return ParseInputShape(*shape, shape_what);
}

// Collects the layer names of the Keras 3 tensors ("keras_history") in a
// node's arguments, in order.
void CollectHistories(const Value& v, std::vector<std::string>* names) {
  if (v.has_list_value()) {
    for (const Value& item : v.list_value().values()) CollectHistories(item, names);
    return;
  }
  if (!v.has_struct_value()) return;
  const Value* class_name = Field(v.struct_value(), "class_name");
  const Value* config = Field(v.struct_value(), "config");
  if (class_name != nullptr && class_name->string_value() == "__keras_tensor__" &&
      config != nullptr && config->has_struct_value()) {
    const Value* history = Field(config->struct_value(), "keras_history");
    if (history != nullptr && history->has_list_value() &&
        history->list_value().values_size() > 0 &&
        history->list_value().values(0).has_string_value()) {
      names->push_back(history->list_value().values(0).string_value());
    }
  }
}

absl::StatusOr<int> KerasImporter::OnlyLayerName(const Value* names, const char* what) {
  // Keras 3: ["name", 0, 0] or [["name", 0, 0], ...]; Keras 2: [["name", 0, 0]].
  if (names == nullptr || !names->has_list_value() || names->list_value().values_size() == 0) {
    return FileError(absl::StrCat("no \"", what, "\""));
  }
  const Value* first = &names->list_value().values(0);
  if (first->has_list_value()) {
    if (names->list_value().values_size() != 1) {
      return FileError(absl::StrCat(names->list_value().values_size(), " ", what,
                                    "; a model with one input and one output is read"));
    }
    if (first->list_value().values_size() == 0) return FileError(absl::StrCat("empty ", what));
    first = &first->list_value().values(0);
  }
  if (!first->has_string_value()) return FileError(absl::StrCat("bad \"", what, "\""));
  auto it = index_.find(first->string_value());
  if (it == index_.end()) {
    return FileError(
        absl::StrCat("\"", what, "\" names \"", first->string_value(), "\", no layer"));
  }
  return it->second;
}

absl::Status KerasImporter::ParseFunctional(const Struct& config) {
  const Value* layers = Field(config, "layers");
  if (layers == nullptr || !layers->has_list_value()) return FileError("no \"layers\" list");
  for (const Value& entry : layers->list_value().values()) {
    if (!entry.has_struct_value()) return FileError("a layer that is not an object");
    const Struct& e = entry.struct_value();
    const Value* class_name = Field(e, "class_name");
    const Value* layer_config = Field(e, "config");
    const Value* name = Field(e, "name");
    if (class_name == nullptr || !class_name->has_string_value() || layer_config == nullptr ||
        !layer_config->has_struct_value() || name == nullptr || !name->has_string_value()) {
      return FileError("a layer without \"class_name\", \"config\" and \"name\"");
    }
    KerasLayer layer;
    layer.class_name = class_name->string_value();
    layer.config = &layer_config->struct_value();
    layer.name = name->string_value();
    const Value* nodes = Field(e, "inbound_nodes");
    if (nodes != nullptr && nodes->has_list_value() && nodes->list_value().values_size() > 0) {
      if (nodes->list_value().values_size() > 1) {
        return LayerError(layer, "called more than once (shared layers are not supported)");
      }
      const Value& node = nodes->list_value().values(0);
      if (node.has_struct_value()) {  // Keras 3: {"args": [...], "kwargs": {...}}.
        const Value* args = Field(node.struct_value(), "args");
        if (args != nullptr) CollectHistories(*args, &layer.inputs);
      } else if (node.has_list_value()) {  // Keras 2: [["name", 0, 0, {}], ...].
        for (const Value& in : node.list_value().values()) {
          if (in.has_list_value() && in.list_value().values_size() > 0 &&
              in.list_value().values(0).has_string_value()) {
            layer.inputs.push_back(in.list_value().values(0).string_value());
          }
        }
      }
    }
    if (index_.count(layer.name) > 0) return LayerError(layer, "a second layer of this name");
    index_[layer.name] = static_cast<int>(layers_.size());
    layers_.push_back(std::move(layer));
  }
  absl::StatusOr<int> input = OnlyLayerName(Field(config, "input_layers"), "input_layers");
  if (!input.ok()) return input.status();
  absl::StatusOr<int> output = OnlyLayerName(Field(config, "output_layers"), "output_layers");
  if (!output.ok()) return output.status();
  input_ = *input;
  output_ = *output;
  if (layers_[input_].class_name != "InputLayer") {
    return LayerError(layers_[input_], "the model's input is not an InputLayer");
  }
  if (output_ != static_cast<int>(layers_.size()) - 1) {
    return LayerError(layers_[output_], "the model's output must be its last layer");
  }
  for (const char* key : {"batch_shape", "batch_input_shape"}) {
    const Value* shape = Field(*layers_[input_].config, key);
    if (!IsNull(shape)) {
      return ParseInputShape(*shape,
                             absl::StrCat("the \"", key, "\" of \"", layers_[input_].name, "\""));
    }
  }
  return LayerError(layers_[input_], "no batch_shape");
}

absl::StatusOr<std::string> KerasImporter::String(const KerasLayer& layer, const std::string& key,
                                                  const std::string& fallback) const {
  const Value* v = Field(*layer.config, key);
  if (IsNull(v)) return fallback;
  if (!v->has_string_value()) return LayerError(layer, absl::StrCat("\"", key, "\" is no string"));
  return v->string_value();
}

absl::StatusOr<double> KerasImporter::Number(const KerasLayer& layer, const std::string& key,
                                             double fallback) const {
  const Value* v = Field(*layer.config, key);
  if (IsNull(v)) return fallback;
  if (!v->has_number_value()) return LayerError(layer, absl::StrCat("\"", key, "\" is no number"));
  return v->number_value();
}

absl::StatusOr<bool> KerasImporter::Bool(const KerasLayer& layer, const std::string& key,
                                         bool fallback) const {
  const Value* v = Field(*layer.config, key);
  if (IsNull(v)) return fallback;
  if (!v->has_bool_value()) return LayerError(layer, absl::StrCat("\"", key, "\" is no boolean"));
  return v->bool_value();
}

bool KerasImporter::OnChannels(const KerasLayer& layer) const {
  const Value* v = Field(*layer.config, "axis");
  if (IsNull(v)) return true;
  if (v->has_list_value() && v->list_value().values_size() == 1) v = &v->list_value().values(0);
  return v->has_number_value() && (v->number_value() == -1 || v->number_value() == 3);
}

absl::StatusOr<int64_t> KerasImporter::SquareInt(const KerasLayer& layer, const std::string& key,
                                                 int64_t fallback) const {
  const Value* v = Field(*layer.config, key);
  if (IsNull(v)) return fallback;
  std::vector<double> values;
  if (v->has_number_value()) values.push_back(v->number_value());
  if (v->has_list_value()) {
    for (const Value& item : v->list_value().values()) {
      if (!item.has_number_value()) break;
      values.push_back(item.number_value());
    }
    if (values.size() != static_cast<size_t>(v->list_value().values_size())) values.clear();
  }
  for (double x : values) {
    if (x != std::floor(x)) values.clear();
  }
  if (values.empty() || values[0] < 1 || values[0] > (1 << 20)) {
    return LayerError(layer,
                      absl::StrCat("\"", key, "\" is not a positive number or a list of them"));
  }
  for (double x : values) {
    if (x != values[0]) {
      return LayerError(
          layer, absl::StrCat("\"", key, "\" differs along the axes (", absl::StrJoin(values, ", "),
                              "); only square windows and equal strides are supported"));
    }
  }
  return static_cast<int64_t>(values[0]);
}

absl::StatusOr<std::pair<int64_t, int64_t>> KerasImporter::KernelSize(
    const KerasLayer& layer) const {
  const Value* v = Field(*layer.config, "kernel_size");
  if (v != nullptr && v->has_list_value() && v->list_value().values_size() == 2) {
    const Value& h = v->list_value().values(0);
    const Value& w = v->list_value().values(1);
    if (h.has_number_value() && w.has_number_value() && h.number_value() >= 1 &&
        w.number_value() >= 1 && h.number_value() <= (1 << 20) && w.number_value() <= (1 << 20)) {
      return std::make_pair(static_cast<int64_t>(h.number_value()),
                            static_cast<int64_t>(w.number_value()));
    }
    return LayerError(layer, "\"kernel_size\" is not two positive numbers");
  }
  ASSIGN_OR_RETURN(const int64_t size, SquareInt(layer, "kernel_size", 0));
  return std::make_pair(size, size);
}

absl::StatusOr<Padding> KerasImporter::PaddingOf(const KerasLayer& layer) const {
  absl::StatusOr<std::string> padding = String(layer, "padding", "valid");
  if (!padding.ok()) return padding.status();
  if (*padding == "same") return Padding::kSame;
  if (*padding == "valid") return Padding::kValid;
  return LayerError(layer, absl::StrCat("padding \"", *padding, "\"; want same or valid"));
}

absl::StatusOr<std::string> KerasImporter::Activation(const KerasLayer& layer) const {
  absl::StatusOr<std::string> activation = String(layer, "activation", "linear");
  if (!activation.ok()) return activation.status();
  if (*activation == "relu" || *activation == "linear" || *activation == "softmax") {
    return activation;
  }
  return LayerError(layer, absl::StrCat("activation \"", *activation,
                                        "\"; supported: relu, linear, and softmax last"));
}

absl::StatusOr<VariableInit> KerasImporter::Initializer(const KerasLayer& layer,
                                                        const std::string& key, double fan_in,
                                                        double fan_out) const {
  const Value* v = Field(*layer.config, key);
  std::string kind;
  const Struct* config = nullptr;
  if (v != nullptr && v->has_string_value()) kind = v->string_value();
  if (v != nullptr && v->has_struct_value()) {
    const Value* class_name = Field(v->struct_value(), "class_name");
    if (class_name != nullptr && class_name->has_string_value()) kind = class_name->string_value();
    const Value* c = Field(v->struct_value(), "config");
    if (c != nullptr && c->has_struct_value()) config = &c->struct_value();
  }
  auto number = [&](const char* name, double fallback) {
    const Value* x = config == nullptr ? nullptr : Field(*config, name);
    return x != nullptr && x->has_number_value() ? x->number_value() : fallback;
  };
  // Keras's truncated normals are cut at 2 standard deviations of the
  // untruncated one, whose standard deviation init::TruncatedNormal
  // takes; VariableInit::stddev is the truncated one's.
  const double truncated = init::kTruncatedNormalStddev;
  if (kind == "GlorotUniform" || kind == "glorot_uniform") {
    return VariableInit{0, 0, std::sqrt(6.0 / (fan_in + fan_out))};
  }
  if (kind == "GlorotNormal" || kind == "glorot_normal") {
    return VariableInit{std::sqrt(2.0 / (fan_in + fan_out)), 0};
  }
  if (kind == "HeNormal" || kind == "he_normal") return VariableInit{std::sqrt(2.0 / fan_in), 0};
  if (kind == "HeUniform" || kind == "he_uniform") {
    return VariableInit{0, 0, std::sqrt(6.0 / fan_in)};
  }
  if (kind == "LecunNormal" || kind == "lecun_normal") {
    return VariableInit{std::sqrt(1.0 / fan_in), 0};
  }
  if (kind == "LecunUniform" || kind == "lecun_uniform") {
    return VariableInit{0, 0, std::sqrt(3.0 / fan_in)};
  }
  if ((kind == "TruncatedNormal" || kind == "truncated_normal") && number("mean", 0) == 0) {
    return VariableInit{number("stddev", 0.05) * truncated, 0};
  }
  if ((kind == "RandomUniform" || kind == "random_uniform") &&
      number("minval", -0.05) == -number("maxval", 0.05)) {
    return VariableInit{0, 0, number("maxval", 0.05)};
  }
  if (kind == "Zeros" || kind == "zeros") return VariableInit{0, 0};
  if (kind == "Ones" || kind == "ones") return VariableInit{0, 1};
  if (kind == "Constant" || kind == "constant") {
    return VariableInit{0, static_cast<float>(number("value", 0))};
  }
  return LayerError(layer,
                    absl::StrCat(key, " ", kind.empty() ? "(none)" : kind,
                                 " is not supported; supported: GlorotUniform, GlorotNormal, "
                                 "HeNormal, HeUniform, LecunNormal, LecunUniform, "
                                 "TruncatedNormal (mean 0), RandomUniform (symmetric), Zeros, "
                                 "Ones, Constant"));
}

absl::Status KerasImporter::RequireDefaults(const KerasLayer& layer,
                                            std::initializer_list<const char*> keys) const {
  for (const char* key : keys) {
    const Value* v = Field(*layer.config, key);
    if (IsNull(v) || (v->has_bool_value() && !v->bool_value()) ||
        (v->has_string_value() && v->string_value() == "channels_last")) {
      continue;
    }
    return LayerError(layer, absl::StrCat("\"", key, "\" is set; psrt does not support it"));
  }
  return absl::OkStatus();
}

bool KerasImporter::IsRelu(int i) const {
  const KerasLayer& layer = layers_[i];
  if (layer.inputs.size() != 1) return false;
  if (layer.class_name == "Activation") {
    const Value* a = Field(*layer.config, "activation");
    return a != nullptr && a->has_string_value() && a->string_value() == "relu";
  }
  if (layer.class_name != "ReLU") return false;
  for (const char* key : {"max_value", "negative_slope", "threshold"}) {
    const Value* v = Field(*layer.config, key);
    if (!IsNull(v) && !(v->has_number_value() && v->number_value() == 0)) return false;
  }
  return true;
}

absl::StatusOr<int> KerasImporter::Build(NetBuilder* net) {
  const int n = static_cast<int>(layers_.size());
  std::vector<int> node(n, -1);
  std::vector<bool> done(n, false);
  // Whether a layer's output is a vector (features), which Dense needs.
  std::vector<bool> flat(n, false);
  for (int i = 0; i < n; ++i) {
    if (done[i]) continue;
    const KerasLayer& layer = layers_[i];
    std::vector<int> in;
    for (const std::string& name : layer.inputs) in.push_back(node[index_.at(name)]);
    const bool is_input = layer.class_name == "InputLayer";
    if (is_input && !in.empty()) return LayerError(layer, "an InputLayer that reads a layer");
    if (!is_input && i != input_ && in.empty()) {
      if (input_ < 0 && i == 0) {
        in.push_back(NetBuilder::kInput);  // A Sequential without InputLayer.
      } else {
        return LayerError(layer, "reads nothing");
      }
    }
    const bool single = in.size() == 1;
    const int x = single ? in[0] : -1;
    // Whether the one input is a vector: the model's input of (features),
    // or a layer that made one.
    bool x_flat = false;
    if (single) {
      x_flat = layer.inputs.empty() ? shape_.input_height == 1 && shape_.input_width == 1
                                    : flat[index_.at(layer.inputs[0])];
    }
    auto need_one_input = [&]() -> absl::Status {
      if (!single) return LayerError(layer, absl::StrCat("has ", in.size(), " inputs, want 1"));
      return absl::OkStatus();
    };
    const std::string& kind = layer.class_name;
    int out = -1;
    bool out_flat = false;
    if (is_input) {
      out = NetBuilder::kInput;
      out_flat = shape_.input_height == 1 && shape_.input_width == 1;
    } else if (kind == "Conv2D") {
      RETURN_IF_ERROR(need_one_input());
      if (x_flat && x != NetBuilder::kInput) {
        return LayerError(layer, "a convolution of a vector (after Flatten or Dense)");
      }
      ConvSpec spec;
      ASSIGN_OR_RETURN(const int64_t filters, SquareInt(layer, "filters", 0));
      ASSIGN_OR_RETURN(const auto kernel, KernelSize(layer));
      ASSIGN_OR_RETURN(spec.stride, SquareInt(layer, "strides", 1));
      ASSIGN_OR_RETURN(const int64_t dilation, SquareInt(layer, "dilation_rate", 1));
      ASSIGN_OR_RETURN(const int64_t groups, SquareInt(layer, "groups", 1));
      ASSIGN_OR_RETURN(const std::string format, String(layer, "data_format", "channels_last"));
      if (dilation != 1 || groups != 1 || format != "channels_last") {
        return LayerError(layer, "dilation, groups and channels_first are not supported");
      }
      RETURN_IF_ERROR(
          RequireDefaults(layer, {"kernel_regularizer", "bias_regularizer", "activity_regularizer",
                                  "kernel_constraint", "bias_constraint", "lora_rank"}));
      ASSIGN_OR_RETURN(spec.padding, PaddingOf(layer));
      ASSIGN_OR_RETURN(spec.bias, Bool(layer, "use_bias", true));
      ASSIGN_OR_RETURN(const std::string activation, Activation(layer));
      if (activation == "softmax") return LayerError(layer, "a softmax convolution");
      spec.filter_height = kernel.first;
      spec.filter_width = kernel.second;
      spec.out_channels = filters;
      spec.relu = activation == "relu";
      const double in_channels = net->dims(x).channels;
      const double taps = static_cast<double>(kernel.first) * kernel.second;
      if (taps * in_channels * filters > kMaxVariableElements) {
        return LayerError(layer, "a kernel of over 2^31 weights");
      }
      ASSIGN_OR_RETURN(spec.weights_init, Initializer(layer, "kernel_initializer",
                                                      taps * in_channels, taps * filters));
      if (spec.bias) {
        ASSIGN_OR_RETURN(spec.bias_init, Initializer(layer, "bias_initializer", filters, filters));
      }
      if (!spec.weights_init.random()) {
        return LayerError(layer, "a constant kernel_initializer (the layer could not learn)");
      }
      // Conv2D > BatchNormalization (> ReLU): one fused layer.
      std::vector<int> fused = {i};
      const int bn = OnlyConsumer(i);
      if (!spec.bias && !spec.relu && bn >= 0 && layers_[bn].class_name == "BatchNormalization" &&
          layers_[bn].inputs.size() == 1) {
        const KerasLayer& norm = layers_[bn];
        RETURN_IF_ERROR(RequireDefaults(
            norm, {"beta_regularizer", "gamma_regularizer", "beta_constraint", "gamma_constraint",
                   "renorm", "virtual_batch_size", "adjustment", "synchronized"}));
        ASSIGN_OR_RETURN(const bool center, Bool(norm, "center", true));
        ASSIGN_OR_RETURN(const bool scale, Bool(norm, "scale", true));
        if (!center || !scale || !OnChannels(norm)) {
          return LayerError(norm,
                            "only batch norm over the channels with center and scale is "
                            "supported");
        }
        for (const char* key : {"gamma_initializer", "beta_initializer", "moving_mean_initializer",
                                "moving_variance_initializer"}) {
          ASSIGN_OR_RETURN(const VariableInit init, Initializer(norm, key, 1, 1));
          const bool ones = std::string(key) == "gamma_initializer" ||
                            std::string(key) == "moving_variance_initializer";
          if (init.random() || init.value != (ones ? 1.0f : 0.0f)) {
            return LayerError(norm, absl::StrCat(key, " other than its default"));
          }
        }
        ASSIGN_OR_RETURN(const double epsilon, Number(norm, "epsilon", 1e-3));
        ASSIGN_OR_RETURN(const double momentum, Number(norm, "momentum", 0.99));
        if (!(epsilon > 0) || !(momentum >= 0 && momentum <= 1)) {
          return LayerError(norm, "epsilon must be positive and momentum in [0, 1]");
        }
        spec.batch_norm = true;
        spec.bn_epsilon = static_cast<float>(epsilon);
        spec.bn_momentum = static_cast<float>(momentum);
        fused.push_back(bn);
        const int relu = OnlyConsumer(bn);
        if (relu >= 0 && IsRelu(relu)) {
          spec.relu = true;
          fused.push_back(relu);
        }
      }
      out = net->Conv(layer.name, x, spec);
      if (!net->status().ok()) return LayerError(layer, net->status().message());
      for (int f : fused) {
        node[f] = out;
        done[f] = true;
      }
      continue;
    } else if (kind == "BatchNormalization") {
      return LayerError(layer,
                        "batch norm is supported only directly after a Conv2D without "
                        "bias or activation, which alone reads it");
    } else if (kind == "Dense") {
      RETURN_IF_ERROR(need_one_input());
      const Dims d = net->dims(x);
      if (!x_flat && d.pixels() > 1) {
        return LayerError(layer,
                          absl::StrCat("Dense on a ", d.height, "x", d.width, "x", d.channels,
                                       " input (Keras applies it per "
                                       "pixel): put a Flatten or a pooling before it"));
      }
      ASSIGN_OR_RETURN(const int64_t units, SquareInt(layer, "units", 0));
      RETURN_IF_ERROR(
          RequireDefaults(layer, {"kernel_regularizer", "bias_regularizer", "activity_regularizer",
                                  "kernel_constraint", "bias_constraint", "lora_rank"}));
      if (static_cast<double>(d.size()) * units > kMaxVariableElements) {
        return LayerError(layer, "over 2^31 weights");
      }
      ASSIGN_OR_RETURN(const bool bias, Bool(layer, "use_bias", true));
      if (!bias) return LayerError(layer, "use_bias false is not supported");
      ASSIGN_OR_RETURN(const std::string activation, Activation(layer));
      if (activation == "softmax" && i != output_) {
        return LayerError(layer, "softmax is supported only in the last layer");
      }
      ASSIGN_OR_RETURN(const VariableInit weights,
                       Initializer(layer, "kernel_initializer", d.size(), units));
      ASSIGN_OR_RETURN(const VariableInit biases,
                       Initializer(layer, "bias_initializer", units, units));
      if (!weights.random()) {
        return LayerError(layer, "a constant kernel_initializer (the layer could not learn)");
      }
      out = net->FullyConnected(layer.name, x, units, activation == "relu", weights, biases);
      out_flat = true;
    } else if (kind == "MaxPooling2D" || kind == "AveragePooling2D") {
      RETURN_IF_ERROR(need_one_input());
      RETURN_IF_ERROR(RequireDefaults(layer, {"data_format"}));
      ASSIGN_OR_RETURN(const int64_t window, SquareInt(layer, "pool_size", 2));
      ASSIGN_OR_RETURN(const int64_t stride, SquareInt(layer, "strides", window));
      ASSIGN_OR_RETURN(const Padding padding, PaddingOf(layer));
      out = kind == "MaxPooling2D" ? net->MaxPool(x, window, stride, padding)
                                   : net->AvgPool(x, window, stride, padding);
    } else if (kind == "GlobalAveragePooling2D") {
      RETURN_IF_ERROR(need_one_input());
      RETURN_IF_ERROR(RequireDefaults(layer, {"data_format"}));
      ASSIGN_OR_RETURN(const bool keepdims, Bool(layer, "keepdims", false));
      out = net->GlobalAvgPool(x);
      out_flat = !keepdims;  // With keepdims a 1x1 map, which a Conv2D may read.
    } else if (kind == "Flatten") {
      RETURN_IF_ERROR(need_one_input());
      RETURN_IF_ERROR(RequireDefaults(layer, {"data_format"}));
      out = x;  // Dense reads its input flattened, in the same (NHWC) order.
      out_flat = true;
    } else if (kind == "Dropout") {
      RETURN_IF_ERROR(need_one_input());
      RETURN_IF_ERROR(RequireDefaults(layer, {"noise_shape"}));
      ASSIGN_OR_RETURN(const double rate, Number(layer, "rate", 0));
      if (rate < 0 || rate >= 1) return LayerError(layer, "rate outside [0, 1)");
      out = rate == 0 ? x : net->Dropout(x, static_cast<float>(1 - rate));
      out_flat = x_flat;
    } else if (kind == "Activation" || kind == "ReLU") {
      RETURN_IF_ERROR(need_one_input());
      std::string activation = "relu";
      if (kind == "Activation") {
        ASSIGN_OR_RETURN(activation, Activation(layer));
      }
      if (kind == "ReLU" && !IsRelu(i)) {
        return LayerError(layer, "max_value, negative_slope and threshold are not supported");
      }
      if (activation == "softmax" && i != output_) {
        return LayerError(layer, "softmax is supported only in the last layer");
      }
      out = activation == "relu" ? net->Relu(x) : x;  // softmax: the loss's.
      out_flat = x_flat;
    } else if (kind == "Add") {
      if (in.size() < 2) return LayerError(layer, "an Add of fewer than 2 inputs");
      RETURN_IF_ERROR(DistinctInputs(layer, in));
      const int relu = OnlyConsumer(i);
      const bool fuse = relu >= 0 && IsRelu(relu);
      for (int a : in) {
        const Dims da = net->dims(a), d0 = net->dims(in[0]);
        if (da.height != d0.height || da.width != d0.width || da.channels != d0.channels) {
          return LayerError(layer, "inputs of different shapes");
        }
      }
      out = net->Sum(in, fuse);
      out_flat = AllFlat(layer, flat);
      if (fuse) {
        node[relu] = out;
        done[relu] = true;
      }
    } else if (kind == "Concatenate") {
      if (in.size() < 2) return LayerError(layer, "a Concatenate of fewer than 2 inputs");
      RETURN_IF_ERROR(DistinctInputs(layer, in));
      out_flat = AllFlat(layer, flat);
      for (size_t j = 0; j < in.size(); ++j) {
        if (flat[index_.at(layer.inputs[j])] && net->dims(in[j]).pixels() > 1) {
          return LayerError(layer,
                            "a Concatenate of flattened maps (psrt would interleave "
                            "them by pixel): concatenate the maps, then Flatten");
        }
      }
      if (!OnChannels(layer)) return LayerError(layer, "only the channel axis is supported");
      for (int a : in) {
        const Dims da = net->dims(a), d0 = net->dims(in[0]);
        if (da.height != d0.height || da.width != d0.width) {
          return LayerError(layer, "inputs of different heights or widths");
        }
      }
      out = net->Concat(in);
    } else {
      return LayerError(layer, "this layer class is not supported");
    }
    if (!net->status().ok()) return LayerError(layer, net->status().message());
    node[i] = out;
    flat[i] = out_flat;
    done[i] = true;
  }
  const int logits = node[output_];
  const Dims d = net->dims(logits);
  if (logits == NetBuilder::kInput || d.pixels() != 1) {
    return LayerError(layers_[output_], "the model's output is not a vector of class scores");
  }
  if (logits != net->num_nodes() - 1) {
    return LayerError(layers_[output_], "the model's output is not the last layer computed");
  }
  if (d.channels > (1 << 24)) return LayerError(layers_[output_], "over 2^24 classes");
  shape_.num_classes = static_cast<int>(d.channels);
  return logits;
}

ModelOptions WithShape(ModelOptions options, const KerasModelShape& shape) {
  options.input_height = shape.input_height;
  options.input_width = shape.input_width;
  options.input_channels = shape.input_channels;
  options.num_classes = shape.num_classes;
  return options;
}

}  // namespace

absl::StatusOr<KerasModelShape> ReadKerasModelShape(absl::string_view json,
                                                    const std::string& source) {
  KerasImporter importer(source);
  RETURN_IF_ERROR(importer.Parse(json));
  KerasModelShape shape = importer.shape();
  shape.num_classes = 1;
  NetBuilder net(WithShape(ModelOptions(), shape));
  RETURN_IF_ERROR(importer.Build(&net).status());
  return importer.shape();
}

absl::StatusOr<std::unique_ptr<Model>> NewKerasModel(absl::string_view json,
                                                     const std::string& source,
                                                     const ModelOptions& options) {
  ASSIGN_OR_RETURN(const KerasModelShape shape, ReadKerasModelShape(json, source));
  KerasImporter importer(source);
  RETURN_IF_ERROR(importer.Parse(json));
  NetBuilder net(WithShape(options, shape));
  RETURN_IF_ERROR(importer.Build(&net).status());
  return net.Build(absl::StrCat("model file ", source));
}

}  // namespace psrt
