// KerasFile's typed reads of a layer's config fields (the class's contract
// is in keras_file.h): strings, numbers, lists, kernel sizes, padding,
// activations and initializers, each refused by name when malformed.
#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "google/protobuf/struct.pb.h"
#include "models/initializers.h"
#include "models/keras_file.h"
#include "models/keras_json.h"

namespace psrt {

using google::protobuf::Struct;
using google::protobuf::Value;
using keras_json::Field;
using keras_json::IsNull;
using kernels::Padding;

absl::StatusOr<std::string> KerasFile::String(const KerasLayer& layer, const std::string& key,
                                              const std::string& fallback) const {
  const Value* v = Field(*layer.config, key);
  if (IsNull(v)) return fallback;
  if (!v->has_string_value()) return LayerError(layer, absl::StrCat("\"", key, "\" is no string"));
  return v->string_value();
}

absl::StatusOr<double> KerasFile::Number(const KerasLayer& layer, const std::string& key,
                                         double fallback) const {
  const Value* v = Field(*layer.config, key);
  if (IsNull(v)) return fallback;
  if (!v->has_number_value()) return LayerError(layer, absl::StrCat("\"", key, "\" is no number"));
  return v->number_value();
}

absl::StatusOr<std::vector<float>> KerasFile::PerChannel(const KerasLayer& layer,
                                                          const std::string& key,
                                                          int64_t channels, float fallback) const {
  const Value* v = Field(*layer.config, key);
  std::vector<float> values(channels, fallback);
  if (IsNull(v)) return values;
  if (v->has_number_value() && std::isfinite(v->number_value())) {
    std::fill(values.begin(), values.end(), static_cast<float>(v->number_value()));
    return values;
  }
  if (v->has_list_value() && v->list_value().values_size() == channels) {
    for (int64_t c = 0; c < channels; ++c) {
      const Value& n = v->list_value().values(c);
      if (!n.has_number_value() || !std::isfinite(n.number_value())) break;
      values[c] = static_cast<float>(n.number_value());
      if (c + 1 == channels) return values;
    }
  }
  return LayerError(layer, absl::StrCat("\"", key, "\" is not a number or a list of ", channels,
                                        " numbers (one per channel)"));
}

absl::StatusOr<bool> KerasFile::NoiseShapePerExample(const KerasLayer& layer) const {
  const Value* v = Field(*layer.config, "noise_shape");
  bool per_example = v != nullptr && v->has_list_value() && v->list_value().values_size() >= 2 &&
                     IsNull(&v->list_value().values(0));
  for (int i = 1; per_example && i < v->list_value().values_size(); ++i) {
    const Value& d = v->list_value().values(i);
    per_example = d.has_number_value() && d.number_value() == 1;
  }
  if (!per_example) {
    return LayerError(layer, "a noise_shape other than (None, 1, ..., 1), a draw per example, "
                             "is not supported");
  }
  return true;
}

bool KerasFile::IsNullField(const KerasLayer& layer, const std::string& key) const {
  return IsNull(Field(*layer.config, key));
}

absl::StatusOr<std::vector<int64_t>> KerasFile::Ints(const KerasLayer& layer,
                                                     const std::string& key) const {
  const Value* v = Field(*layer.config, key);
  std::vector<int64_t> ints;
  if (v != nullptr && v->has_list_value()) {
    for (const Value& n : v->list_value().values()) {
      if (!n.has_number_value() || !(n.number_value() >= 1) || n.number_value() > (1 << 30) ||
          n.number_value() != static_cast<int64_t>(n.number_value())) {
        ints.clear();
        break;
      }
      ints.push_back(static_cast<int64_t>(n.number_value()));
    }
  }
  if (ints.empty()) {
    return LayerError(layer, absl::StrCat("\"", key, "\" is not a list of positive whole numbers"));
  }
  return ints;
}

absl::StatusOr<bool> KerasFile::Bool(const KerasLayer& layer, const std::string& key,
                                     bool fallback) const {
  const Value* v = Field(*layer.config, key);
  if (IsNull(v)) return fallback;
  if (!v->has_bool_value()) return LayerError(layer, absl::StrCat("\"", key, "\" is no boolean"));
  return v->bool_value();
}

bool KerasFile::OnChannels(const KerasLayer& layer) const {
  const Value* v = Field(*layer.config, "axis");
  if (IsNull(v)) return true;
  if (v->has_list_value() && v->list_value().values_size() == 1) v = &v->list_value().values(0);
  return v->has_number_value() && (v->number_value() == -1 || v->number_value() == 3);
}

absl::StatusOr<int64_t> KerasFile::SquareInt(const KerasLayer& layer, const std::string& key,
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

absl::StatusOr<std::pair<int64_t, int64_t>> KerasFile::KernelSize(const KerasLayer& layer) const {
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

absl::StatusOr<Padding> KerasFile::PaddingOf(const KerasLayer& layer) const {
  absl::StatusOr<std::string> padding = String(layer, "padding", "valid");
  if (!padding.ok()) return padding.status();
  if (*padding == "same") return Padding::kSame;
  if (*padding == "valid") return Padding::kValid;
  return LayerError(layer, absl::StrCat("padding \"", *padding, "\"; want same or valid"));
}

absl::StatusOr<std::array<int64_t, 4>> KerasFile::ZeroPadding(const KerasLayer& layer) const {
  const Value* v = Field(*layer.config, "padding");
  // A padding amount of at most 2^20 (a larger one is a mistake).
  auto amount = [](const Value& n, int64_t* out) {
    if (!n.has_number_value() || !(n.number_value() >= 0) || n.number_value() > (1 << 20) ||
        n.number_value() != static_cast<int64_t>(n.number_value())) {
      return false;
    }
    *out = static_cast<int64_t>(n.number_value());
    return true;
  };
  std::array<int64_t, 4> sides{};
  if (v != nullptr && amount(*v, &sides[0])) return std::array<int64_t, 4>{sides[0], sides[0],
                                                                          sides[0], sides[0]};
  if (v != nullptr && v->has_list_value() && v->list_value().values_size() == 2) {
    bool ok = true;
    for (int axis = 0; axis < 2 && ok; ++axis) {
      const Value& pair = v->list_value().values(axis);
      if (amount(pair, &sides[2 * axis])) {
        sides[2 * axis + 1] = sides[2 * axis];
      } else {
        ok = pair.has_list_value() && pair.list_value().values_size() == 2 &&
             amount(pair.list_value().values(0), &sides[2 * axis]) &&
             amount(pair.list_value().values(1), &sides[2 * axis + 1]);
      }
    }
    if (ok) return sides;
  }
  return LayerError(layer,
                    "\"padding\" is not a number, two numbers or two pairs of numbers "
                    "(non-negative whole numbers)");
}

namespace {

// The activations psrt computes, by Keras's names (aliases included).
const std::map<std::string, kernels::Activation>& ActivationNames() {
  using kernels::Activation;
  static const auto* names = new std::map<std::string, Activation>{
      {"relu", Activation::kRelu},          {"relu6", Activation::kRelu},
      {"sigmoid", Activation::kSigmoid},    {"tanh", Activation::kTanh},
      {"swish", Activation::kSwish},        {"silu", Activation::kSwish},
      {"hard_sigmoid", Activation::kHardSigmoid}, {"hard_swish", Activation::kHardSwish},
      {"hard_silu", Activation::kHardSwish}, {"gelu", Activation::kGelu}};
  return *names;
}

}  // namespace

absl::StatusOr<std::string> KerasFile::Activation(const KerasLayer& layer) const {
  absl::StatusOr<std::string> activation = String(layer, "activation", "linear");
  if (!activation.ok()) return activation.status();
  if (*activation == "linear" || *activation == "softmax" ||
      ActivationNames().count(*activation) > 0) {
    return activation;
  }
  std::string known;
  for (const auto& [name, kind] : ActivationNames()) absl::StrAppend(&known, name, ", ");
  return LayerError(layer, absl::StrCat("activation \"", *activation, "\"; supported: ", known,
                                        "linear, and softmax last"));
}

kernels::ActivationSpec KerasFile::ActivationSpecOf(const std::string& name) const {
  kernels::ActivationSpec spec;
  spec.kind = ActivationNames().at(name);
  if (name == "relu6") spec.max_value = 6;
  // Keras 2's hard sigmoid is 0.2 x + 0.5, Keras 3's relu6(x + 3) / 6.
  if (keras2_ && name == "hard_sigmoid") spec.hard_slope = 0.2f;
  return spec;
}

absl::StatusOr<kernels::ActivationSpec> KerasFile::ReluLayerSpec(const KerasLayer& layer) const {
  kernels::ActivationSpec spec;
  const Value* cap = Field(*layer.config, "max_value");
  if (!IsNull(cap)) {
    if (!cap->has_number_value() || !(cap->number_value() >= 0)) {
      return LayerError(layer, "max_value is not a non-negative number");
    }
    spec.max_value = static_cast<float>(cap->number_value());
  }
  ASSIGN_OR_RETURN(const double slope, Number(layer, "negative_slope", 0));
  ASSIGN_OR_RETURN(const double threshold, Number(layer, "threshold", 0));
  if (!(slope >= 0) || !std::isfinite(threshold)) {
    return LayerError(layer, "negative_slope must be non-negative and threshold a number");
  }
  spec.negative_slope = static_cast<float>(slope);
  spec.threshold = static_cast<float>(threshold);
  if (spec.threshold > spec.max_value) {
    return LayerError(layer, "threshold above max_value");
  }
  return spec;
}

absl::StatusOr<VariableInit> KerasFile::Initializer(const KerasLayer& layer, const std::string& key,
                                                    double fan_in, double fan_out) const {
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
  if (kind == "VarianceScaling" || kind == "variance_scaling") {
    // Keras's general form: scale / n for n the fan in, out or their mean.
    auto text = [&](const char* name, const char* fallback) {
      const Value* x = config == nullptr ? nullptr : Field(*config, name);
      return x != nullptr && x->has_string_value() ? x->string_value() : std::string(fallback);
    };
    const std::string mode = text("mode", "fan_in");
    const std::string distribution = text("distribution", "truncated_normal");
    const double scale = number("scale", 1.0);
    const double n = mode == "fan_in" ? fan_in : mode == "fan_out" ? fan_out
                     : mode == "fan_avg" ? (fan_in + fan_out) / 2 : 0;
    if (n > 0 && scale > 0) {
      // Keras 2 calls the truncated normal "normal".
      if (distribution == "truncated_normal" || distribution == "normal") {
        return VariableInit{std::sqrt(scale / n), 0};
      }
      if (distribution == "uniform") return VariableInit{0, 0, std::sqrt(3 * scale / n)};
    }
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
                                 "VarianceScaling (truncated normal or uniform), "
                                 "TruncatedNormal (mean 0), RandomUniform (symmetric), Zeros, "
                                 "Ones, Constant"));
}

absl::Status KerasFile::RequireDefaults(const KerasLayer& layer,
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

bool KerasFile::IsRelu(int i) const {
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

}  // namespace psrt
