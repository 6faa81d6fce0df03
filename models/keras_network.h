// KerasNetwork: the layers of a Keras model file (keras_file.h) added to a
// NetBuilder (net.h), for keras_model.cc. Internal to models/.
//
// Thread safety: one Build per object, on one thread.
#ifndef PSRT_MODELS_KERAS_NETWORK_H_
#define PSRT_MODELS_KERAS_NETWORK_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "models/keras_file.h"
#include "models/net.h"

namespace psrt {

// The network of a KerasFile: its layers as NetBuilder's (a Conv2D with the
// BatchNormalization and ReLU that alone follow it as one fused layer; an
// Add with the ReLU after it), checking what NetBuilder would refuse or
// compute otherwise than Keras. Build walks the layers in the file's order;
// one method per layer class adds a layer's nodes.
class KerasNetwork {
 public:
  explicit KerasNetwork(const KerasFile& file) : file_(file) {}

  // Adds the layers to `net` (made with the file's input shape); returns
  // the class count (the logits are the last node). Call once.
  absl::StatusOr<int> Build(NetBuilder* net);

 private:
  // A layer about to be added, and what it reads.
  struct Step {
    int index = 0;  // In file_.layers().
    const KerasLayer* layer = nullptr;
    std::vector<int> in;  // Its input nodes.
    int x = -1;           // The one input node; -1 when there are several.
    bool x_flat = false;  // Whether that input is a vector (features).
  };
  // What a layer added: its output node, whether that is a vector, and the
  // layers after it folded into it (a batch norm and a ReLU after a Conv2D,
  // a ReLU after a sum), whose output is the same node.
  struct Added {
    int out = -1;
    bool flat = false;
    std::vector<int> folded;
  };
  using ClassBuilder = absl::StatusOr<Added> (KerasNetwork::*)(const Step&, NetBuilder*);
  // The builder of each supported class name.
  static const std::vector<std::pair<const char*, ClassBuilder>>& Builders();

  // One method per class (or family of classes): adds `step`'s layer.
  absl::StatusOr<Added> Conv2D(const Step& step, NetBuilder* net);
  absl::StatusOr<Added> GroupedConv2D(const Step& step, NetBuilder* net);
  absl::StatusOr<Added> DepthwiseOrSeparableConv2D(const Step& step, NetBuilder* net);
  absl::StatusOr<Added> BatchNormalization(const Step& step, NetBuilder* net);
  absl::StatusOr<Added> ZeroPadding2D(const Step& step, NetBuilder* net);
  absl::StatusOr<Added> ConstantArithmetic(const Step& step, NetBuilder* net);
  absl::StatusOr<Added> Rescaling(const Step& step, NetBuilder* net);
  absl::StatusOr<Added> Normalization(const Step& step, NetBuilder* net);
  absl::StatusOr<Added> Reshape(const Step& step, NetBuilder* net);
  absl::StatusOr<Added> Multiply(const Step& step, NetBuilder* net);
  absl::StatusOr<Added> Dense(const Step& step, NetBuilder* net);
  absl::StatusOr<Added> Pooling2D(const Step& step, NetBuilder* net);
  absl::StatusOr<Added> GlobalPooling2D(const Step& step, NetBuilder* net);
  absl::StatusOr<Added> Flatten(const Step& step, NetBuilder* net);
  absl::StatusOr<Added> Dropout(const Step& step, NetBuilder* net);
  absl::StatusOr<Added> Activation(const Step& step, NetBuilder* net);
  absl::StatusOr<Added> Add(const Step& step, NetBuilder* net);
  absl::StatusOr<Added> LayerNormalization(const Step& step, NetBuilder* net);
  absl::StatusOr<Added> LayerScale(const Step& step, NetBuilder* net);
  absl::StatusOr<Added> CustomScaleLayer(const Step& step, NetBuilder* net);
  absl::StatusOr<Added> Concatenate(const Step& step, NetBuilder* net);

  // Whether an Add or Multiply is Keras 3's x + c or x * c (one input and a
  // constant): ConstantArithmetic's.
  static bool OfAConstant(const Step& step);
  // An error unless the layer reads exactly one tensor.
  absl::Status OneInput(const Step& step) const;
  // An error when the layer's one input is a vector (after Flatten or
  // Dense) but not the model's own input; `what`: "a convolution", ...
  absl::Status NotOfAVector(const Step& step, absl::string_view what) const;
  // The sum of `inputs` (of equal dims), with the ReLU layer that alone
  // reads `step`'s layer folded into it.
  Added SumAndRelu(const Step& step, const std::vector<int>& inputs, NetBuilder* net) const;
  // `out` after the layer's `activation` (other than softmax), as a node
  // of its own: a ReLU, none for linear, else an activation layer.
  int Activated(int out, const std::string& activation, NetBuilder* net) const;
  // An error when two of a layer's inputs are one node (x + x, or x and an
  // identity of x): not supported.
  absl::Status DistinctInputs(const KerasLayer& layer, const std::vector<int>& in) const;
  // An error unless the inputs have one shape (`what`: "inputs of different
  // shapes", ...); with `channels` false, heights and widths alone.
  absl::Status SameDims(const Step& step, bool channels, absl::string_view what,
                        NetBuilder* net) const;
  // Whether the output layer's `activation` over `units` is the loss's
  // (left out of the network): softmax, or a sigmoid over one unit (a
  // binary classifier; see Build).
  bool IsLossActivation(const std::string& activation, int layer, int64_t units) const;
  // A depthwise convolution's window (kernel_size, strides, dilation_rate,
  // padding), refusing what Keras refuses.
  absl::Status ReadDepthwiseWindow(const KerasLayer& layer, DepthwiseConvSpec* spec) const;
  // A BatchNormalization's options, refusing what psrt would compute
  // otherwise than Keras (regularizers, constraints, renorm, other axes or
  // initial values).
  absl::StatusOr<BatchNormSpec> BatchNormOf(const KerasLayer& norm) const;
  // Whether every input of `layer` is a vector.
  bool AllFlat(const KerasLayer& layer) const;

  const KerasFile& file_;
  // Build's progress, by layer index: the node of each layer's output (-1
  // until added) and whether it is a vector.
  std::vector<int> node_;
  std::vector<bool> flat_;
};

}  // namespace psrt

#endif  // PSRT_MODELS_KERAS_NETWORK_H_
