// The layers that Net (net.h) chains into models: each a forward/backward
// pair over [batch, height * width * channels] NHWC activations, calling the
// ops of a Device (kernels/device.h), so one layer runs on the CPU or a GPU.
// Every pointer a layer gets or keeps is in that device's memory. Internal
// to models/.
//
// A layer owns only what is its own across steps: a batch norm's batch
// statistics, its constant gamma or beta when it has none, and the
// intermediate buffers of a fused conv + batch norm, allocated on the
// step's device at their first use. Outputs, gradients and parameters
// (batch norms' moving statistics among them) belong to Net.
#ifndef PSRT_MODELS_LAYERS_H_
#define PSRT_MODELS_LAYERS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "kernels/device.h"
#include "kernels/window.h"

namespace psrt {

// The per-example size of an activation: height x width x channels (NHWC);
// a feature vector is 1 x 1 x features.
struct Dims {
  int64_t height = 1;
  int64_t width = 1;
  int64_t channels = 1;
  int64_t size() const { return height * width * channels; }
  int64_t pixels() const { return height * width; }
};

// How a variable starts: a truncated normal of `stddev` (when > 0; the
// sample is divided by 0.8796 so that its standard deviation is `stddev`,
// like TensorFlow's variance_scaling), a uniform on [-uniform_limit,
// uniform_limit] (when > 0), or the constant `value`.
struct VariableInit {
  double stddev = 0;
  float value = 0;
  double uniform_limit = 0;
  bool random() const { return stddev > 0 || uniform_limit > 0; }
};

// What a step's forward and backward share. The same device on every step
// of a layer's life.
struct StepContext {
  kernels::Device* device;
  bool training;
  uint64_t step;  // Counts training steps; seeds dropout.
};

// `params` and `grads` hold one device pointer per variable of the model,
// in variables() order; a layer uses those of its own variables.
class Layer {
 public:
  virtual ~Layer() = default;

  // out = f(inputs): [batch, size of each node] arrays.
  virtual void Forward(const StepContext& ctx,
                       absl::Span<const float* const> params,
                       absl::Span<const float* const> inputs, int64_t batch,
                       float* out) = 0;

  // From the forward's inputs and output and dout = dL/dout (which the
  // layer may overwrite), overwrites din[i] = dL/d inputs[i] (null: not
  // needed) and the gradients of the layer's own variables in `grads`.
  virtual void Backward(const StepContext& ctx,
                        absl::Span<const float* const> params,
                        absl::Span<const float* const> inputs, const float* out,
                        int64_t batch, float* dout, absl::Span<float* const> din,
                        absl::Span<float* const> grads) = 0;

  // NetBuilder::Build moves a ReLU that ends a layer past a max pool that is
  // the only consumer of the layer's output: the two commute, values and
  // gradients alike (relu(max x) = max(relu x), and both route a window's
  // gradient to its first max cell, or nowhere when that max is not
  // positive), and the ReLU then rectifies the pool's outputs, a quarter as
  // many for a 2x2 window. A layer that ends in a ReLU drops it and returns
  // true; a max pool takes one after it.
  virtual bool DropTrailingRelu() { return false; }
  virtual bool TakesTrailingRelu() const { return false; }
  virtual void TakeTrailingRelu() {}
};

// Convolution (no bias, bias, or batch norm) and an optional ReLU.
// Variables at first_var: weights, then biases or gamma, beta, moving mean,
// moving variance.
struct ConvSpec {
  int64_t filter_height = 3;
  int64_t filter_width = 3;
  int64_t out_channels = 0;
  int64_t stride = 1;
  kernels::Padding padding = kernels::Padding::kSame;
  bool bias = false;
  bool batch_norm = false;
  bool relu = true;
  float bn_epsilon = 1e-3f;
  float bn_momentum = 0.99f;
  bool bn_bessel = true;  // kernels::BatchNormShape's: false for Keras 3's.
  // The weights' initial values; not random(): He's (net.h). The biases'.
  VariableInit weights_init;
  VariableInit bias_init;
};

std::unique_ptr<Layer> NewConvLayer(const ConvSpec& spec, Dims in,
                                    int first_var);
// Fully connected over the flattened input; variables weights, then biases
// if `bias`.
std::unique_ptr<Layer> NewFullyConnectedLayer(Dims in, int64_t units, bool bias, bool relu,
                                              int first_var);

// A depthwise convolution (kernels/depthwise_conv.h) and an optional bias;
// variables at first_var: the filter [h, w, channels, multiplier], then
// the biases [channels * multiplier].
struct DepthwiseConvSpec {
  int64_t filter_height = 3;
  int64_t filter_width = 3;
  int64_t multiplier = 1;
  int64_t stride = 1;
  int64_t dilation = 1;
  kernels::Padding padding = kernels::Padding::kSame;
  bool bias = false;
  VariableInit weights_init;  // Not random(): He's (net.h).
  VariableInit bias_init;
};
std::unique_ptr<Layer> NewDepthwiseConvLayer(const DepthwiseConvSpec& spec, Dims in,
                                             int first_var);

// A batch norm over the channels: y = gamma (x - mean) / sqrt(var +
// epsilon) + beta, with the batch's statistics in training and the moving
// ones at inference. Without `scale` gamma is 1, without `center` beta is
// 0; the variables at first_var are gamma (if scale), then beta (if
// center), then the moving mean and variance, whose "gradients" a training
// step sets to their new values (by `momentum`).
struct BatchNormSpec {
  int64_t channels = 0;
  float epsilon = 1e-3f;
  float momentum = 0.99f;
  bool center = true;
  bool scale = true;
  bool bessel = true;  // kernels::BatchNormShape's: false for Keras 3's.
};
std::unique_ptr<Layer> NewBatchNormLayer(const BatchNormSpec& spec, Dims in, int first_var);
// A layer norm over each pixel's channels (kernels/batch_norm.h's; Keras's
// LayerNormalization on the last axis): variables gamma, then beta, at
// first_var.
std::unique_ptr<Layer> NewLayerNormLayer(float epsilon, Dims in, int first_var);
// y = x * gamma[c], gamma [channels] the variable at first_var (ConvNeXt's
// LayerScale).
std::unique_ptr<Layer> NewChannelScaleLayer(Dims in, int first_var);

// Zero rows above and below, zero columns left and right (Keras's
// ZeroPadding2D).
struct ZeroPadSpec {
  int64_t top = 0, bottom = 0, left = 0, right = 0;
};
std::unique_ptr<Layer> NewZeroPadLayer(const ZeroPadSpec& spec, Dims in);
std::unique_ptr<Layer> NewPoolLayer(bool max, int64_t window, int64_t stride,
                                    kernels::Padding padding, Dims in);
std::unique_ptr<Layer> NewGlobalAvgPoolLayer(Dims in);
std::unique_ptr<Layer> NewConcatLayer(std::vector<int64_t> channels, Dims out);
// The element-wise sum of its inputs (each of `size` per example), then a
// ReLU if `relu`: a residual connection (with one input and `relu`, a ReLU).
std::unique_ptr<Layer> NewSumLayer(int64_t size, bool relu);
// Identity at inference. `noise`: what one draw of the mask covers (an
// element, an example, or a channel of an example).
std::unique_ptr<Layer> NewDropoutLayer(float keep_prob, int64_t size,
                                       uint64_t salt, kernels::DropoutNoise noise = {});
// y = x * scale[c] + offset[c], constants per channel (Keras's Rescaling
// and Normalization).
std::unique_ptr<Layer> NewChannelAffineLayer(std::vector<float> scale, std::vector<float> offset,
                                             Dims in);
// The element-wise product of two inputs (Keras's Multiply): of equal dims,
// or one of them 1x1 with the other's channels, broadcast over its pixels.
std::unique_ptr<Layer> NewMultiplyLayer(Dims a, Dims b);
// An element-wise activation (kernels/activation.h) of `size` per example.
std::unique_ptr<Layer> NewActivationLayer(const kernels::ActivationSpec& spec, int64_t size);

}  // namespace psrt

#endif  // PSRT_MODELS_LAYERS_H_
