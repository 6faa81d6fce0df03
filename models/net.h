// NetBuilder: builds a Model from layers (layers.h) wired into a
// feed-forward graph, so that a network is written as the list of its
// layers (lenet.cc, inception_mini.cc, inception_v3.cc).
//
// Nodes are numbered in the order they are added; node 0 is the input
// images [batch, height * width * channels] (NHWC), and each later node
// reads earlier ones, so the numbering is a topological order. The built
// model runs the layers in that order, the backward in reverse; a node read
// by several layers (an Inception module's input) gets the sum of their
// gradients. The last layer gives logits [batch, num_classes], trained with
// softmax cross-entropy.
//
// Variables are declared in the order their layers are added, with
// TensorFlow-style names: "<scope>/weights" [fh, fw, in, out] (HWIO) or
// [in, units], "<scope>/biases", or for a batch-normed conv
// "<scope>/BatchNorm/gamma", "<scope>/BatchNorm/beta",
// "<scope>/BatchNorm/moving_mean" and "<scope>/BatchNorm/moving_variance"
// (a batch norm of its own: "<scope>/gamma", "<scope>/beta",
// "<scope>/moving_mean", "<scope>/moving_variance"). Initial values
// (from the seed alone): weights truncated normal with He's stddev
// sqrt(2 / fan_in) (sqrt(1 / fan_in) for a layer without ReLU), biases,
// beta and moving means 0, gamma and moving variances 1. The moving
// statistics are variables that ComputeGradients updates itself (training
// mode): their "gradients" are their new values (common/tensor.h's
// IsMovingStatistic); Evaluate (inference mode) reads them.
//
// Steady state: after the first ComputeGradients at a batch size, later
// calls at that size reuse every buffer (activations, gradients, im2col
// workspace).
//
// Thread safety: the builder and the built model are not thread-safe.
#ifndef PSRT_MODELS_NET_H_
#define PSRT_MODELS_NET_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/window.h"
#include "models/layers.h"
#include "models/model.h"

namespace psrt {

class NetBuilder {
 public:
  // The input node: options.input_height x input_width x input_channels.
  explicit NetBuilder(const ModelOptions& options);
  ~NetBuilder();
  NetBuilder(const NetBuilder&) = delete;
  NetBuilder& operator=(const NetBuilder&) = delete;

  static constexpr int kInput = 0;
  Dims dims(int node) const;

  // Each returns the new node. A layer that does not fit its input (a VALID
  // window larger than the image) records an error that Build returns.
  int Conv(const std::string& scope, int input, const ConvSpec& spec);
  // weights_init: the initial weights; not random(): He's above. Without
  // `bias`, no "<scope>/biases".
  int FullyConnected(const std::string& scope, int input, int64_t units, bool relu,
                     VariableInit weights_init = {}, VariableInit bias_init = {},
                     bool bias = true);
  // A batch norm of its own over the input's channels (spec.channels is
  // set from it): variables "<scope>/gamma" (with scale) and
  // "<scope>/beta" (with center), starting at 1 and 0.
  int BatchNorm(const std::string& scope, int input, BatchNormSpec spec);
  // A layer norm over each pixel's channels: variables "<scope>/gamma"
  // (starting at 1) and "<scope>/beta" (at 0).
  int LayerNorm(const std::string& scope, int input, float epsilon);
  // x * gamma[c]: variable "<scope>/gamma" [channels], starting at `init`.
  int ChannelScale(const std::string& scope, int input, VariableInit init);
  int ZeroPad(int input, const ZeroPadSpec& spec);
  // Variables "<scope>/depthwise_weights" [h, w, channels, multiplier] and,
  // with spec.bias, "<scope>/biases".
  int DepthwiseConv(const std::string& scope, int input, const DepthwiseConvSpec& spec);
  int MaxPool(int input, int64_t window, int64_t stride, kernels::Padding padding);
  int AvgPool(int input, int64_t window, int64_t stride, kernels::Padding padding);
  int GlobalAvgPool(int input);
  // REQUIRES: the inputs have the same height and width.
  int Concat(const std::vector<int>& inputs);
  // Dropout with a draw per element, or (`per_example`) a draw per example
  // (stochastic depth), or (`per_channel`) a draw per channel of an example
  // (SpatialDropout2D).
  int Dropout(int input, float keep_prob, bool per_example = false, bool per_channel = false);
  // The element-wise sum of two or more nodes (a residual connection), then
  // a ReLU if `relu`. REQUIRES: the inputs have the same dims.
  int Sum(const std::vector<int>& inputs, bool relu);
  // max(x, 0).
  int Relu(int input);
  // Any other element-wise activation (kernels/activation.h).
  int Activate(int input, const kernels::ActivationSpec& spec);
  // x * scale[c] + offset[c], constants (one per channel). `non_trainable`
  // floats of state Keras counts beside it (a Normalization's mean,
  // variance and count) go to num_non_trainable().
  int ChannelAffine(const std::string& scope, int input, std::vector<float> scale,
                    std::vector<float> offset, int64_t non_trainable = 0);
  // The element-wise product of two nodes (net.h's MultiplyLayer: equal
  // dims, or one 1x1 of the other's channels). REQUIRES: they fit.
  int Multiply(int a, int b);
  // The same values as `dims`. REQUIRES: dims.size() is the input's.
  int Reshape(int input, Dims dims);

  // The model whose logits are the last node added. InvalidArgument (naming
  // `model_name` and the layer) when a layer did not fit or the logits do
  // not have num_classes features.
  absl::StatusOr<std::unique_ptr<Model>> Build(const std::string& model_name);
  // The first layer that did not fit so far (what Build would return), or OK.
  const absl::Status& status() const { return status_; }
  // The nodes added so far (the input included).
  int num_nodes() const;

  struct Graph;  // Internal (net_graph.h): the nodes and variables, handed to the model.

 private:
  int Add(std::unique_ptr<Layer> layer, std::vector<int> inputs, Dims dims,
          const std::string& what);
  void AddVariable(const std::string& name, Shape shape, VariableInit init);
  // "<scope>/moving_mean" (starting at 0) and "<scope>/moving_variance" (at 1).
  void AddMovingStatistics(const std::string& scope, int64_t channels);

  const ModelOptions options_;
  std::unique_ptr<Graph> graph_;
  absl::Status status_;
};

}  // namespace psrt

#endif  // PSRT_MODELS_NET_H_
