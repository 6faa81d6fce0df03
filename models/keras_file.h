// KerasFile: a Keras model file (model.to_json(), Keras 3's format or
// Keras 2's; Sequential or Functional) read into its layers, what each reads
// and is read by, its input shape, and its layers' typed settings, with
// errors that name the file, the layer and its class. Turning the layers
// into a network is keras_network.h's. Internal to models/.
//
// Thread safety: const methods may be called concurrently; Parse once,
// first.
#ifndef PSRT_MODELS_KERAS_FILE_H_
#define PSRT_MODELS_KERAS_FILE_H_

#include <array>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/activation.h"
#include "kernels/window.h"
#include "models/keras_model.h"
#include "models/layers.h"

namespace google::protobuf {
class Struct;
class Value;
}  // namespace google::protobuf

namespace psrt {

// One layer of the file.
struct KerasLayer {
  std::string name;
  std::string class_name;
  const google::protobuf::Struct* config = nullptr;  // In the file's tree.
  std::vector<std::string> inputs;                   // The layers it reads, in order.
  std::vector<int> consumers;                        // The layers that read it.
  std::string module;  // The class's Python module, where the file records it.
  // Keras 3 records arithmetic on tensors (x + 3.0) as operations of module
  // "keras.src.ops.numpy" (an Add of one tensor and a number); their
  // number arguments, in order.
  bool operation = false;
  std::vector<double> constants;
  // Where Keras 3's weights file (model.save_weights) keeps the layer's
  // variables: "layers/<snake_case class>[_N]" in its model's list (N
  // counting earlier layers of the class there), under a nested
  // Sequential's path + "/layers/"; empty for what is no saveable layer (an
  // operation, a Sequential's InputLayer).
  std::string weights_path;
};

// A model in the file, as a saveable of the weights file: the model itself
// (path "") and each nested Sequential ("layers/sequential"). Their own
// variables are none: their layers hold them.
struct KerasContainer {
  std::string weights_path;
  std::string name;
};

class KerasFile {
 public:
  // `source` names the file in errors.
  explicit KerasFile(std::string source);
  ~KerasFile();
  KerasFile(const KerasFile&) = delete;
  KerasFile& operator=(const KerasFile&) = delete;

  // Reads `json`: the layers in topological order, each one's inputs
  // defined earlier, every layer but the last read by another.
  absl::Status Parse(absl::string_view json);

  const std::vector<KerasLayer>& layers() const { return layers_; }
  int index(const std::string& name) const { return index_.at(name); }
  // The model and its nested Sequentials, the model first.
  const std::vector<KerasContainer>& containers() const { return containers_; }
  int input() const { return input_; }    // The InputLayer, or -1 (a Sequential without one).
  int output() const { return output_; }  // The last layer.
  // The input's; num_classes is 0 (the network's to say).
  const KerasModelShape& input_shape() const { return shape_; }

  absl::Status FileError(absl::string_view message) const {
    return absl::InvalidArgumentError(absl::StrCat("model file ", source_, ": ", message));
  }
  absl::Status LayerError(const KerasLayer& layer, absl::string_view message) const {
    return absl::InvalidArgumentError(absl::StrCat("model file ", source_, ": layer \"", layer.name,
                                                   "\" (", layer.class_name, "): ", message));
  }

  // Typed config fields of `layer`, or an error naming it.
  absl::StatusOr<std::string> String(const KerasLayer& layer, const std::string& key,
                                     const std::string& fallback) const;
  absl::StatusOr<double> Number(const KerasLayer& layer, const std::string& key,
                                double fallback) const;
  // A number or a list of numbers, as one value per channel of `channels`
  // (a list of another length is an error); `fallback` for each when
  // absent or null.
  absl::StatusOr<std::vector<float>> PerChannel(const KerasLayer& layer, const std::string& key,
                                                int64_t channels, float fallback) const;
  // A list of positive ints (Reshape's "target_shape").
  absl::StatusOr<std::vector<int64_t>> Ints(const KerasLayer& layer, const std::string& key) const;
  // An int or a list of equal ints ("strides": [2, 2]); `fallback` when
  // absent or null.
  absl::StatusOr<int64_t> SquareInt(const KerasLayer& layer, const std::string& key,
                                    int64_t fallback) const;
  // The (height, width) of "kernel_size": an int or a list of two.
  absl::StatusOr<std::pair<int64_t, int64_t>> KernelSize(const KerasLayer& layer) const;
  absl::StatusOr<bool> Bool(const KerasLayer& layer, const std::string& key, bool fallback) const;
  // Dropout's "noise_shape" of a draw per example, (None, 1, ..., 1): true;
  // any other is an error.
  absl::StatusOr<bool> NoiseShapePerExample(const KerasLayer& layer) const;
  // Whether `key` is absent or null.
  bool IsNullField(const KerasLayer& layer, const std::string& key) const;
  // Whether the layer's "axis" (a number, or a list of one) is the
  // channels' (-1 or 3).
  bool OnChannels(const KerasLayer& layer) const;
  // The initializer at `key` for a weight of fan_in, fan_out.
  absl::StatusOr<VariableInit> Initializer(const KerasLayer& layer, const std::string& key,
                                           double fan_in, double fan_out) const;
  absl::StatusOr<kernels::Padding> PaddingOf(const KerasLayer& layer) const;
  // ZeroPadding2D's "padding": an int (every side), two ints (rows above
  // and below, columns left and right) or two pairs ((top, bottom), (left,
  // right)), as {top, bottom, left, right}.
  absl::StatusOr<std::array<int64_t, 4>> ZeroPadding(const KerasLayer& layer) const;
  // A layer's activation (its "activation" field, "linear" when absent):
  // "linear", "softmax", "relu", or another that Spec gives.
  absl::StatusOr<std::string> Activation(const KerasLayer& layer) const;
  // What activation `name` (not linear or softmax) computes, as this file's
  // Keras computes it (hard_sigmoid differs between Keras 2 and 3).
  kernels::ActivationSpec ActivationSpecOf(const std::string& name) const;
  // The ReLU layer's (max_value, negative_slope, threshold).
  absl::StatusOr<kernels::ActivationSpec> ReluLayerSpec(const KerasLayer& layer) const;
  // Written by Keras 2 (tf.keras before TensorFlow 2.16, tf_keras).
  bool keras2() const { return keras2_; }
  // An error naming the first of `keys` that the layer sets to anything but
  // null, false or "channels_last" (a regularizer, a constraint, ...: what
  // psrt does not do, and would otherwise ignore).
  absl::Status RequireDefaults(const KerasLayer& layer,
                               std::initializer_list<const char*> keys) const;

  // Whether layer i is a plain ReLU (Activation "relu", or ReLU with its
  // defaults) of one input.
  bool IsRelu(int i) const;
  // The one consumer of layer i, or -1.
  int OnlyConsumer(int i) const {
    return layers_[i].consumers.size() == 1 ? layers_[i].consumers[0] : -1;
  }

 private:
  absl::Status ParseSequential(const google::protobuf::Struct& config);
  absl::Status ParseFunctional(const google::protobuf::Struct& config);
  // The layers of a Sequential model nested in a Functional one (ConvNeXt's
  // stem), each reading the one before, the first `outer`'s input; the
  // Sequential's name then stands for its last layer.
  absl::Status InlineSequential(const KerasLayer& outer);
  // The weights-file path of the next layer of `class_name` in the model
  // at `container` (see KerasLayer::weights_path); `used` counts the
  // model's layers by class so far.
  static std::string NextWeightsPath(const std::string& container, const std::string& class_name,
                                     std::map<std::string, int>* used);
  // Appends `layer`; an error if its name is taken.
  absl::Status AddLayer(KerasLayer layer);
  absl::Status ParseInputShape(const google::protobuf::Value& shape, const std::string& what);
  absl::StatusOr<int> OnlyLayerName(const google::protobuf::Value* names, const char* what);

  const std::string source_;
  const std::unique_ptr<google::protobuf::Struct> root_;
  std::vector<KerasLayer> layers_;
  std::map<std::string, int> index_;
  std::vector<KerasContainer> containers_;
  int input_ = -1;
  int output_ = -1;
  bool keras2_ = false;
  KerasModelShape shape_;
};

}  // namespace psrt

#endif  // PSRT_MODELS_KERAS_FILE_H_
