// The layers with variables (models/layers.h): convolutions, batch and
// layer norms, fully connected and channel scales; the others are in
// layers_without_variables.cc.
#include "models/layers.h"

#include <algorithm>
#include <utility>

#include "glog/logging.h"
#include "kernels/batch_norm.h"

namespace psrt {
namespace {

using kernels::DeviceArray;
using Params = absl::Span<const float* const>;
using Inputs = absl::Span<const float* const>;
using Grads = absl::Span<float* const>;

// A batch norm's state across steps, on the step's device: the batch
// statistics saved for the backward, the moving statistics a training step
// makes, and for a batch norm without scale or center the constant gamma
// (1) or beta (0) and a scratch for their unused gradients. The moving
// statistics are the variables at `moving_var` (mean) and moving_var + 1
// (variance); a training step's "gradients" of them are their new values
// (common/tensor.h's IsMovingStatistic).
class BatchNormState {
 public:
  BatchNormState(const BatchNormSpec& spec, int moving_var) : spec_(spec), moving_(moving_var) {}

  // y = the batch norm of x [rows, channels]; a null gamma or beta is the
  // constant. y may equal x.
  void Forward(const StepContext& ctx, Params params, int64_t rows, const float* x,
               const float* gamma, const float* beta, float* y) {
    kernels::Device* dev = ctx.device;
    Initialize(dev);
    if (gamma == nullptr) gamma = ones_.data();
    if (beta == nullptr) beta = zeros_.data();
    if (ctx.training) {
      const size_t bytes = spec_.channels * sizeof(float);
      dev->CopyOnDevice(new_mean_.data(), params[moving_], bytes);
      dev->CopyOnDevice(new_var_.data(), params[moving_ + 1], bytes);
      dev->BatchNormTrainingForward(Shape(rows), x, gamma, beta, new_mean_.data(),
                                    new_var_.data(), saved_mean_.data(), saved_inv_std_.data(), y);
    } else {
      dev->BatchNormInferenceForward(Shape(rows), x, gamma, beta, params[moving_],
                                     params[moving_ + 1], y);
    }
  }
  // From the forward's x and dy: dx (may equal dy), the gradients of gamma
  // and beta (null: not variables) and the moving statistics' new values.
  void Backward(const StepContext& ctx, Params params, int64_t rows, const float* x,
                const float* dy, const float* gamma, float* dx, float* dgamma, float* dbeta,
                Grads grads) {
    kernels::Device* dev = ctx.device;
    // The scratch holds both unused gradients (Initialize made it 2 x C).
    dev->BatchNormTrainingBackward(
        Shape(rows), x, dy, gamma != nullptr ? gamma : ones_.data(), saved_mean_.data(),
        saved_inv_std_.data(), dx, dgamma != nullptr ? dgamma : unused_.data(),
        dbeta != nullptr ? dbeta : unused_.data() + spec_.channels);
    const size_t bytes = spec_.channels * sizeof(float);
    dev->CopyOnDevice(grads[moving_], new_mean_.data(), bytes);
    dev->CopyOnDevice(grads[moving_ + 1], new_var_.data(), bytes);
  }

 private:
  kernels::BatchNormShape Shape(int64_t rows) const {
    return kernels::BatchNormShape{rows, spec_.channels, spec_.epsilon, spec_.momentum,
                                   spec_.bessel};
  }
  void Initialize(kernels::Device* dev) {
    if (ones_.data() != nullptr) return;
    const int64_t c = spec_.channels;
    dev->Fill(ones_.Reserve(dev, c), c, 1.0f);
    dev->Fill(zeros_.Reserve(dev, c), c, 0.0f);
    new_mean_.Reserve(dev, c);
    new_var_.Reserve(dev, c);
    saved_mean_.Reserve(dev, c);
    saved_inv_std_.Reserve(dev, c);
    unused_.Reserve(dev, 2 * c);
  }

  const BatchNormSpec spec_;
  const int moving_;
  DeviceArray<float> new_mean_;
  DeviceArray<float> new_var_;
  DeviceArray<float> saved_mean_;
  DeviceArray<float> saved_inv_std_;
  DeviceArray<float> ones_;
  DeviceArray<float> zeros_;
  DeviceArray<float> unused_;
};

class ConvLayer : public Layer {
 public:
  ConvLayer(const ConvSpec& spec, Dims in, int first_var)
      : spec_(spec),
        in_(in),
        var_(first_var),
        bn_(BatchNormSpec{spec.out_channels, spec.bn_epsilon, spec.bn_momentum,
                          /*center=*/true, /*scale=*/true, spec.bn_bessel},
            first_var + 3) {}

  void Forward(const StepContext& ctx, Params params, Inputs inputs,
               int64_t batch, float* out) override {
    kernels::Device& dev = *ctx.device;
    const kernels::Conv2DShape shape = Shape(batch);
    const int64_t rows = batch * shape.out_height() * shape.out_width();
    const int64_t channels = spec_.out_channels;
    float* conv_out = spec_.batch_norm ? conv_out_.Reserve(&dev, rows * channels) : out;
    dev.Conv2DForward(shape, inputs[0], params[var_],
                      spec_.bias ? params[var_ + 1] : nullptr, conv_out);
    if (spec_.batch_norm) {
      bn_.Forward(ctx, params, rows, conv_out, params[var_ + 1], params[var_ + 2], out);
    }
    if (spec_.relu) dev.ReluForward(out, rows * channels, out);
  }

  void Backward(const StepContext& ctx, Params params, Inputs inputs,
                const float* out, int64_t batch, float* dout,
                absl::Span<float* const> din, Grads grads) override {
    kernels::Device& dev = *ctx.device;
    const kernels::Conv2DShape shape = Shape(batch);
    const int64_t rows = batch * shape.out_height() * shape.out_width();
    const int64_t channels = spec_.out_channels;
    float* d = dout;
    if (spec_.relu) dev.ReluBackward(out, d, rows * channels, d);
    if (spec_.batch_norm) {
      bn_.Backward(ctx, params, rows, conv_out_.data(), d, params[var_ + 1], d, grads[var_ + 1],
                   grads[var_ + 2], grads);
    }
    dev.Conv2DBackward(shape, inputs[0], params[var_], d, din[0], grads[var_],
                       spec_.bias ? grads[var_ + 1] : nullptr);
  }

  bool DropTrailingRelu() override {
    if (!spec_.relu) return false;
    spec_.relu = false;
    return true;
  }

 private:
  kernels::Conv2DShape Shape(int64_t batch) const {
    return kernels::Conv2DShape{batch,
                                in_.height,
                                in_.width,
                                in_.channels,
                                spec_.filter_height,
                                spec_.filter_width,
                                spec_.out_channels,
                                spec_.stride,
                                spec_.stride,
                                spec_.padding};
  }

  ConvSpec spec_;  // Its relu may be dropped (DropTrailingRelu).
  const Dims in_;
  const int var_;
  // Batch norm only: the convolution's output (the batch norm's input) and
  // the batch norm's state.
  DeviceArray<float> conv_out_;
  BatchNormState bn_;
};

class DepthwiseConvLayer : public Layer {
 public:
  DepthwiseConvLayer(const DepthwiseConvSpec& spec, Dims in, int first_var)
      : spec_(spec), in_(in), var_(first_var) {}

  void Forward(const StepContext& ctx, Params params, Inputs inputs, int64_t batch,
               float* out) override {
    const kernels::DepthwiseConv2DShape shape = Shape(batch);
    ctx.device->DepthwiseConv2DForward(shape, inputs[0], params[var_], out);
    if (spec_.bias) {
      ctx.device->BiasAddForward(out, params[var_ + 1],
                                 batch * shape.out_height() * shape.out_width(),
                                 shape.out_channels(), out);
    }
  }

  void Backward(const StepContext& ctx, Params params, Inputs inputs, const float* out,
                int64_t batch, float* dout, absl::Span<float* const> din, Grads grads) override {
    const kernels::DepthwiseConv2DShape shape = Shape(batch);
    if (spec_.bias) {
      ctx.device->BiasAddBackward(dout, batch * shape.out_height() * shape.out_width(),
                                  shape.out_channels(), grads[var_ + 1]);
    }
    ctx.device->DepthwiseConv2DBackward(shape, inputs[0], params[var_], dout, din[0],
                                        grads[var_]);
  }

 private:
  kernels::DepthwiseConv2DShape Shape(int64_t batch) const {
    kernels::DepthwiseConv2DShape s;
    s.batch = batch;
    s.in_height = in_.height;
    s.in_width = in_.width;
    s.channels = in_.channels;
    s.filter_height = spec_.filter_height;
    s.filter_width = spec_.filter_width;
    s.multiplier = spec_.multiplier;
    s.stride_height = s.stride_width = spec_.stride;
    s.dilation_height = s.dilation_width = spec_.dilation;
    s.padding = spec_.padding;
    return s;
  }

  const DepthwiseConvSpec spec_;
  const Dims in_;
  const int var_;
};

// A batch norm of its own (after any layer), over the channels of
// [batch * pixels, channels]; gamma and beta at first_var when scaled and
// centered.
class BatchNormLayer : public Layer {
 public:
  BatchNormLayer(const BatchNormSpec& spec, Dims in, int first_var)
      : spec_(spec),
        in_(in),
        var_(first_var),
        bn_(spec, first_var + (spec.scale ? 1 : 0) + (spec.center ? 1 : 0)) {}

  void Forward(const StepContext& ctx, Params params, Inputs inputs, int64_t batch,
               float* out) override {
    bn_.Forward(ctx, params, batch * in_.pixels(), inputs[0], Gamma(params), Beta(params), out);
  }

  void Backward(const StepContext& ctx, Params params, Inputs inputs, const float* out,
                int64_t batch, float* dout, absl::Span<float* const> din, Grads grads) override {
    // dx goes to dout first: the layer's input gradient may be unwanted,
    // but gamma's and beta's are not.
    float* dx = din[0] != nullptr ? din[0] : dout;
    bn_.Backward(ctx, params, batch * in_.pixels(), inputs[0], dout, Gamma(params), dx,
                 spec_.scale ? grads[var_] : nullptr,
                 spec_.center ? grads[var_ + (spec_.scale ? 1 : 0)] : nullptr, grads);
  }

 private:
  const float* Gamma(Params params) const { return spec_.scale ? params[var_] : nullptr; }
  const float* Beta(Params params) const {
    return spec_.center ? params[var_ + (spec_.scale ? 1 : 0)] : nullptr;
  }

  const BatchNormSpec spec_;
  const Dims in_;
  const int var_;
  BatchNormState bn_;
};

class LayerNormLayer : public Layer {
 public:
  LayerNormLayer(float epsilon, Dims in, int first_var)
      : epsilon_(epsilon), in_(in), var_(first_var) {}

  void Forward(const StepContext& ctx, Params params, Inputs inputs, int64_t batch,
               float* out) override {
    kernels::Device* dev = ctx.device;
    const int64_t rows = batch * in_.pixels();
    // Per-row statistics: kept for the backward, grown with the batch.
    dev->LayerNormForward(Shape(batch), inputs[0], params[var_], params[var_ + 1],
                          saved_mean_.Reserve(dev, rows), saved_inv_std_.Reserve(dev, rows), out);
  }

  void Backward(const StepContext& ctx, Params params, Inputs inputs, const float* out,
                int64_t batch, float* dout, absl::Span<float* const> din, Grads grads) override {
    kernels::Device* dev = ctx.device;
    dev->LayerNormBackward(Shape(batch), inputs[0], dout, params[var_], saved_mean_.data(),
                           saved_inv_std_.data(),
                           din[0] != nullptr ? row_scratch_.Reserve(dev, 2 * Shape(batch).rows)
                                             : nullptr,
                           din[0], grads[var_], grads[var_ + 1]);
  }

 private:
  kernels::LayerNormShape Shape(int64_t batch) const {
    return kernels::LayerNormShape{batch * in_.pixels(), in_.channels, epsilon_};
  }
  const float epsilon_;
  const Dims in_;
  const int var_;
  DeviceArray<float> saved_mean_;
  DeviceArray<float> saved_inv_std_;
  DeviceArray<float> row_scratch_;
};

class FullyConnectedLayer : public Layer {
 public:
  FullyConnectedLayer(Dims in, int64_t units, bool bias, bool relu, int first_var)
      : in_size_(in.size()), units_(units), bias_(bias), relu_(relu), var_(first_var) {}

  void Forward(const StepContext& ctx, Params params, Inputs inputs,
               int64_t batch, float* out) override {
    kernels::Device& dev = *ctx.device;
    dev.MatMulForward(Shape(batch), inputs[0], params[var_], out);
    if (bias_) dev.BiasAddForward(out, params[var_ + 1], batch, units_, out);
    if (relu_) dev.ReluForward(out, batch * units_, out);
  }

  void Backward(const StepContext& ctx, Params params, Inputs inputs,
                const float* out, int64_t batch, float* dout,
                absl::Span<float* const> din, Grads grads) override {
    kernels::Device& dev = *ctx.device;
    if (relu_) dev.ReluBackward(out, dout, batch * units_, dout);
    if (bias_) dev.BiasAddBackward(dout, batch, units_, grads[var_ + 1]);
    dev.MatMulBackward(Shape(batch), inputs[0], params[var_], dout, din[0],
                       grads[var_]);
  }

 private:
  kernels::MatMulShape Shape(int64_t batch) const {
    return kernels::MatMulShape{batch, units_, in_size_};
  }
  const int64_t in_size_;
  const int64_t units_;
  const bool bias_;
  const bool relu_;
  const int var_;
};

// A product with a variable per channel: MultiplyLayer's broadcast, the
// whole batch as one image, so that gamma's gradient sums every pixel.
class ChannelScaleLayer : public Layer {
 public:
  ChannelScaleLayer(Dims in, int first_var) : in_(in), var_(first_var) {}

  void Forward(const StepContext& ctx, Params params, Inputs inputs, int64_t batch,
               float* out) override {
    ctx.device->MultiplyForward(Shape(batch), inputs[0], params[var_], out);
  }

  void Backward(const StepContext& ctx, Params params, Inputs inputs, const float* out,
                int64_t batch, float* dout, absl::Span<float* const> din, Grads grads) override {
    ctx.device->MultiplyBackward(Shape(batch), inputs[0], params[var_], dout, din[0],
                                 grads[var_]);
  }

 private:
  kernels::MultiplyShape Shape(int64_t batch) const {
    return kernels::MultiplyShape{1, batch * in_.pixels(), in_.channels, /*broadcast=*/true};
  }
  const Dims in_;
  const int var_;
};

}  // namespace

std::unique_ptr<Layer> NewConvLayer(const ConvSpec& spec, Dims in,
                                    int first_var) {
  CHECK(!(spec.bias && spec.batch_norm)) << "a bias before a batch norm";
  return std::make_unique<ConvLayer>(spec, in, first_var);
}

std::unique_ptr<Layer> NewFullyConnectedLayer(Dims in, int64_t units, bool bias, bool relu,
                                              int first_var) {
  return std::make_unique<FullyConnectedLayer>(in, units, bias, relu, first_var);
}

std::unique_ptr<Layer> NewDepthwiseConvLayer(const DepthwiseConvSpec& spec, Dims in,
                                             int first_var) {
  return std::make_unique<DepthwiseConvLayer>(spec, in, first_var);
}

std::unique_ptr<Layer> NewBatchNormLayer(const BatchNormSpec& spec, Dims in, int first_var) {
  CHECK_EQ(spec.channels, in.channels);
  return std::make_unique<BatchNormLayer>(spec, in, first_var);
}

std::unique_ptr<Layer> NewLayerNormLayer(float epsilon, Dims in, int first_var) {
  return std::make_unique<LayerNormLayer>(epsilon, in, first_var);
}

std::unique_ptr<Layer> NewChannelScaleLayer(Dims in, int first_var) {
  return std::make_unique<ChannelScaleLayer>(in, first_var);
}

}  // namespace psrt
