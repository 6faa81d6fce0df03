#include "models/keras_file.h"

#include <algorithm>
#include <cmath>
#include <regex>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "models/keras_json.h"

namespace psrt {

using google::protobuf::Struct;
using google::protobuf::Value;
using keras_json::Field;
using keras_json::IsNull;

KerasFile::KerasFile(std::string source)
    : source_(std::move(source)), root_(std::make_unique<Struct>()) {}

KerasFile::~KerasFile() = default;

absl::Status KerasFile::Parse(absl::string_view json) {
  google::protobuf::util::JsonParseOptions parse_options;
  const auto parsed = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &*root_, parse_options);
  if (!parsed.ok()) {
    return FileError(absl::StrCat("not JSON, or not a JSON object: ", parsed.ToString()));
  }
  const Value* class_name = Field(*root_, "class_name");
  const Value* config = Field(*root_, "config");
  if (class_name == nullptr || !class_name->has_string_value() || config == nullptr ||
      !config->has_struct_value()) {
    return FileError(
        "no \"class_name\" and \"config\" at the top: not a Keras model file (model.to_json())");
  }
  const std::string& kind = class_name->string_value();
  const Value* model_name = Field(config->struct_value(), "name");
  containers_.push_back(
      {"", model_name != nullptr && model_name->has_string_value() ? model_name->string_value()
                                                                   : ""});
  // Keras 2 writes its version at the top, Keras 3 does not.
  const Value* version = Field(*root_, "keras_version");
  keras2_ = version != nullptr && version->has_string_value() &&
            absl::StartsWith(version->string_value(), "2.");
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

absl::Status KerasFile::ParseInputShape(const Value& shape, const std::string& what) {
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

// Keras's naming.to_snake_case, which the weights file's paths use:
// "BatchNormalization" -> "batch_normalization", "ReLU" -> "re_lu".
static std::string ToSnakeCase(const std::string& name) {
  static const std::regex kNonWord("\\W+"), kWord("(.)([A-Z][a-z]+)"), kCase("([a-z])([A-Z])");
  std::string s = std::regex_replace(name, kNonWord, "");
  s = std::regex_replace(s, kWord, "$1_$2");
  s = std::regex_replace(s, kCase, "$1_$2");
  return absl::AsciiStrToLower(s);
}

std::string KerasFile::NextWeightsPath(const std::string& container,
                                       const std::string& class_name,
                                       std::map<std::string, int>* used) {
  const std::string base = ToSnakeCase(class_name);
  auto [it, first] = used->emplace(base, 0);
  const std::string name = first ? base : absl::StrCat(base, "_", ++it->second);
  return absl::StrCat(container.empty() ? "" : container + "/", "layers/", name);
}

absl::Status KerasFile::ParseSequential(const Struct& config) {
  const Value* layers = Field(config, "layers");
  if (layers == nullptr || !layers->has_list_value()) return FileError("no \"layers\" list");
  std::map<std::string, int> used;  // For weights_path.
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
    } else {
      // Sequential.layers, which Keras saves, leaves its InputLayer out.
      layer.weights_path = NextWeightsPath("", layer.class_name, &used);
      if (!layers_.empty()) layer.inputs.push_back(layers_.back().name);
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
static void CollectHistories(const Value& v, std::vector<std::string>* names) {
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

absl::StatusOr<int> KerasFile::OnlyLayerName(const Value* names, const char* what) {
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

absl::Status KerasFile::ParseFunctional(const Struct& config) {
  const Value* layers = Field(config, "layers");
  if (layers == nullptr || !layers->has_list_value()) return FileError("no \"layers\" list");
  std::map<std::string, int> used;  // For weights_path.
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
    const Value* module = Field(e, "module");
    if (module != nullptr && module->has_string_value()) layer.module = module->string_value();
    layer.operation = absl::StartsWith(layer.module, "keras.src.ops");
    // Operations are no layers: the weights file has no place for them.
    if (!layer.operation) layer.weights_path = NextWeightsPath("", layer.class_name, &used);
    const Value* nodes = Field(e, "inbound_nodes");
    if (nodes != nullptr && nodes->has_list_value() && nodes->list_value().values_size() > 0) {
      if (nodes->list_value().values_size() > 1) {
        return LayerError(layer, "called more than once (shared layers are not supported)");
      }
      const Value& node = nodes->list_value().values(0);
      if (node.has_struct_value()) {  // Keras 3: {"args": [...], "kwargs": {...}}.
        const Value* args = Field(node.struct_value(), "args");
        if (args != nullptr) CollectHistories(*args, &layer.inputs);
        if (args != nullptr && args->has_list_value()) {
          for (const Value& arg : args->list_value().values()) {
            if (arg.has_number_value()) layer.constants.push_back(arg.number_value());
          }
        }
      } else if (node.has_list_value()) {  // Keras 2: [["name", 0, 0, {}], ...].
        for (const Value& in : node.list_value().values()) {
          if (in.has_list_value() && in.list_value().values_size() > 0 &&
              in.list_value().values(0).has_string_value()) {
            layer.inputs.push_back(in.list_value().values(0).string_value());
          }
        }
      }
    }
    if (layer.class_name == "Sequential") {
      RETURN_IF_ERROR(InlineSequential(layer));
    } else {
      RETURN_IF_ERROR(AddLayer(std::move(layer)));
    }
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

absl::Status KerasFile::AddLayer(KerasLayer layer) {
  if (index_.count(layer.name) > 0) return LayerError(layer, "a second layer of this name");
  index_[layer.name] = static_cast<int>(layers_.size());
  layers_.push_back(std::move(layer));
  return absl::OkStatus();
}

absl::Status KerasFile::InlineSequential(const KerasLayer& outer) {
  const Value* inner = Field(*outer.config, "layers");
  if (inner == nullptr || !inner->has_list_value()) {
    return LayerError(outer, "a nested Sequential without a \"layers\" list");
  }
  if (outer.inputs.size() != 1) {
    return LayerError(outer, absl::StrCat("a nested Sequential of ", outer.inputs.size(),
                                          " inputs; want 1"));
  }
  std::string previous = outer.inputs[0];
  containers_.push_back({outer.weights_path, outer.name});
  std::map<std::string, int> used;  // For weights_path.
  for (const Value& entry : inner->list_value().values()) {
    const Value* class_name =
        entry.has_struct_value() ? Field(entry.struct_value(), "class_name") : nullptr;
    const Value* config = entry.has_struct_value() ? Field(entry.struct_value(), "config") : nullptr;
    const Value* name =
        config != nullptr && config->has_struct_value() ? Field(config->struct_value(), "name")
                                                        : nullptr;
    if (class_name == nullptr || !class_name->has_string_value() || config == nullptr ||
        !config->has_struct_value() || name == nullptr || !name->has_string_value()) {
      return LayerError(outer, "a layer without \"class_name\" and a \"config\" with a \"name\"");
    }
    KerasLayer layer;
    layer.class_name = class_name->string_value();
    layer.config = &config->struct_value();
    layer.name = name->string_value();
    const Value* module = Field(entry.struct_value(), "module");
    if (module != nullptr && module->has_string_value()) layer.module = module->string_value();
    if (layer.class_name == "InputLayer") continue;  // The outer input stands for it.
    layer.weights_path = NextWeightsPath(outer.weights_path, layer.class_name, &used);
    layer.inputs = {previous};
    previous = layer.name;
    if (layer.class_name == "Sequential") {
      RETURN_IF_ERROR(InlineSequential(layer));
    } else {
      RETURN_IF_ERROR(AddLayer(std::move(layer)));
    }
  }
  if (previous == outer.inputs[0]) return LayerError(outer, "an empty nested Sequential");
  if (index_.count(outer.name) > 0) return LayerError(outer, "a second layer of this name");
  index_[outer.name] = index_.at(previous);
  return absl::OkStatus();
}

}  // namespace psrt
