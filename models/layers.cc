#include "models/layers.h"

#include <algorithm>
#include <utility>

#include "glog/logging.h"
#include "kernels/batch_norm.h"

namespace psrt {
namespace {

using kernels::DeviceArray;
using kernels::Padding;
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
    dev.Conv2DForward(shape, inputs[0], params[var_], conv_out);
    if (spec_.bias) {
      dev.BiasAddForward(conv_out, params[var_ + 1], rows, channels, out);
    }
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
    if (spec_.bias) dev.BiasAddBackward(d, rows, channels, grads[var_ + 1]);
    if (spec_.batch_norm) {
      bn_.Backward(ctx, params, rows, conv_out_.data(), d, params[var_ + 1], d, grads[var_ + 1],
                   grads[var_ + 2], grads);
    }
    dev.Conv2DBackward(shape, inputs[0], params[var_], d, din[0],
                       grads[var_]);
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

  const ConvSpec spec_;
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

// Keras's ZeroPadding2D.
class ZeroPadLayer : public Layer {
 public:
  ZeroPadLayer(const ZeroPadSpec& spec, Dims in) : spec_(spec), in_(in) {}

  void Forward(const StepContext& ctx, Params params, Inputs inputs, int64_t batch,
               float* out) override {
    ctx.device->ZeroPad2DForward(Shape(batch), inputs[0], out);
  }

  void Backward(const StepContext& ctx, Params params, Inputs inputs, const float* out,
                int64_t batch, float* dout, absl::Span<float* const> din, Grads grads) override {
    if (din[0] != nullptr) ctx.device->ZeroPad2DBackward(Shape(batch), dout, din[0]);
  }

 private:
  kernels::Pad2DShape Shape(int64_t batch) const {
    return kernels::Pad2DShape{batch,        in_.height,    in_.width,    in_.channels,
                               spec_.top,    spec_.bottom,  spec_.left,   spec_.right};
  }
  const ZeroPadSpec spec_;
  const Dims in_;
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

class PoolLayer : public Layer {
 public:
  PoolLayer(bool max, int64_t window, int64_t stride, Padding padding, Dims in)
      : max_(max),
        window_(window),
        stride_(stride),
        padding_(padding),
        in_(in) {}

  void Forward(const StepContext& ctx, Params params, Inputs inputs,
               int64_t batch, float* out) override {
    if (max_) {
      ctx.device->MaxPoolForward(Shape(batch), inputs[0], out);
    } else {
      ctx.device->AvgPoolForward(Shape(batch), inputs[0], out);
    }
  }

  void Backward(const StepContext& ctx, Params params, Inputs inputs,
                const float* out, int64_t batch, float* dout,
                absl::Span<float* const> din, Grads grads) override {
    if (din[0] == nullptr) return;
    if (max_) {
      ctx.device->MaxPoolBackward(Shape(batch), inputs[0], out, dout, din[0]);
    } else {
      ctx.device->AvgPoolBackward(Shape(batch), dout, din[0]);
    }
  }

 private:
  kernels::Pool2DShape Shape(int64_t batch) const {
    return kernels::Pool2DShape{batch,        in_.height, in_.width,
                                in_.channels, window_,    window_,
                                stride_,      stride_,    padding_};
  }
  const bool max_;
  const int64_t window_;
  const int64_t stride_;
  const Padding padding_;
  const Dims in_;
};

class GlobalAvgPoolLayer : public Layer {
 public:
  explicit GlobalAvgPoolLayer(Dims in) : in_(in) {}

  void Forward(const StepContext& ctx, Params params, Inputs inputs,
               int64_t batch, float* out) override {
    ctx.device->GlobalAvgPoolForward(inputs[0], batch, in_.pixels(),
                                     in_.channels, out);
  }

  void Backward(const StepContext& ctx, Params params, Inputs inputs,
                const float* out, int64_t batch, float* dout,
                absl::Span<float* const> din, Grads grads) override {
    if (din[0] == nullptr) return;
    ctx.device->GlobalAvgPoolBackward(dout, batch, in_.pixels(), in_.channels,
                                      din[0]);
  }

 private:
  const Dims in_;
};

class ConcatLayer : public Layer {
 public:
  ConcatLayer(std::vector<int64_t> channels, Dims out)
      : channels_(std::move(channels)), out_(out) {}

  void Forward(const StepContext& ctx, Params params, Inputs inputs,
               int64_t batch, float* out) override {
    ctx.device->ConcatChannelsForward(batch * out_.pixels(), inputs, channels_,
                                      out);
  }

  void Backward(const StepContext& ctx, Params params, Inputs inputs,
                const float* out, int64_t batch, float* dout,
                absl::Span<float* const> din, Grads grads) override {
    ctx.device->ConcatChannelsBackward(batch * out_.pixels(), dout, channels_,
                                       din);
  }

 private:
  const std::vector<int64_t> channels_;
  const Dims out_;
};

// The element-wise sum of its inputs (a residual connection), then an
// optional ReLU.
class SumLayer : public Layer {
 public:
  SumLayer(int64_t size, bool relu) : size_(size), relu_(relu) {}

  void Forward(const StepContext& ctx, Params params, Inputs inputs, int64_t batch,
               float* out) override {
    const int64_t n = batch * size_;
    ctx.device->CopyOnDevice(out, inputs[0], sizeof(float) * n);
    for (size_t i = 1; i < inputs.size(); ++i) ctx.device->Accumulate(inputs[i], out, n);
    if (relu_) ctx.device->ReluForward(out, n, out);
  }

  void Backward(const StepContext& ctx, Params params, Inputs inputs, const float* out,
                int64_t batch, float* dout, absl::Span<float* const> din, Grads grads) override {
    const int64_t n = batch * size_;
    if (relu_) ctx.device->ReluBackward(out, dout, n, dout);
    for (float* d : din) {
      if (d != nullptr) ctx.device->CopyOnDevice(d, dout, sizeof(float) * n);
    }
  }

 private:
  const int64_t size_;
  const bool relu_;
};

class ActivationLayer : public Layer {
 public:
  ActivationLayer(const kernels::ActivationSpec& spec, int64_t size) : spec_(spec), size_(size) {}

  void Forward(const StepContext& ctx, Params params, Inputs inputs, int64_t batch,
               float* out) override {
    ctx.device->ActivationForward(spec_, inputs[0], batch * size_, out);
  }

  void Backward(const StepContext& ctx, Params params, Inputs inputs, const float* out,
                int64_t batch, float* dout, absl::Span<float* const> din, Grads grads) override {
    if (din[0] != nullptr) {
      ctx.device->ActivationBackward(spec_, inputs[0], dout, batch * size_, din[0]);
    }
  }

 private:
  const kernels::ActivationSpec spec_;
  const int64_t size_;
};

class ChannelAffineLayer : public Layer {
 public:
  ChannelAffineLayer(std::vector<float> scale, std::vector<float> offset, Dims in)
      : scale_(std::move(scale)), offset_(std::move(offset)), in_(in) {
    CHECK_EQ(static_cast<int64_t>(scale_.size()), in.channels);
    CHECK_EQ(static_cast<int64_t>(offset_.size()), in.channels);
  }

  void Forward(const StepContext& ctx, Params params, Inputs inputs, int64_t batch,
               float* out) override {
    Upload(ctx.device);
    ctx.device->ChannelAffineForward(inputs[0], scale_d_.data(), offset_d_.data(),
                                     batch * in_.pixels(), in_.channels, out);
  }

  void Backward(const StepContext& ctx, Params params, Inputs inputs, const float* out,
                int64_t batch, float* dout, absl::Span<float* const> din, Grads grads) override {
    if (din[0] == nullptr) return;
    ctx.device->ChannelAffineForward(dout, scale_d_.data(), zeros_d_.data(),
                                     batch * in_.pixels(), in_.channels, din[0]);
  }

 private:
  // The constants on the step's device, once.
  void Upload(kernels::Device* dev) {
    if (scale_d_.data() != nullptr) return;
    const int64_t c = in_.channels;
    dev->CopyToDevice(scale_d_.Reserve(dev, c), scale_.data(), c * sizeof(float));
    dev->CopyToDevice(offset_d_.Reserve(dev, c), offset_.data(), c * sizeof(float));
    dev->Fill(zeros_d_.Reserve(dev, c), c, 0.0f);
  }

  const std::vector<float> scale_;
  const std::vector<float> offset_;
  const Dims in_;
  DeviceArray<float> scale_d_;
  DeviceArray<float> offset_d_;
  DeviceArray<float> zeros_d_;
};

class MultiplyLayer : public Layer {
 public:
  // The input of more pixels is `full`; the other is broadcast when it has
  // one pixel and the full one more.
  MultiplyLayer(Dims a, Dims b)
      : full_(b.pixels() > a.pixels() ? 1 : 0),
        shape_{0, std::max(a.pixels(), b.pixels()), a.channels, a.pixels() != b.pixels()} {
    CHECK_EQ(a.channels, b.channels);
    CHECK(a.pixels() == b.pixels() || std::min(a.pixels(), b.pixels()) == 1);
  }

  void Forward(const StepContext& ctx, Params params, Inputs inputs, int64_t batch,
               float* out) override {
    ctx.device->MultiplyForward(Shape(batch), inputs[full_], inputs[1 - full_], out);
  }

  void Backward(const StepContext& ctx, Params params, Inputs inputs, const float* out,
                int64_t batch, float* dout, absl::Span<float* const> din, Grads grads) override {
    ctx.device->MultiplyBackward(Shape(batch), inputs[full_], inputs[1 - full_], dout,
                                 din[full_], din[1 - full_]);
  }

 private:
  kernels::MultiplyShape Shape(int64_t batch) const {
    kernels::MultiplyShape s = shape_;
    s.batch = batch;
    return s;
  }
  const int full_;
  const kernels::MultiplyShape shape_;
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

class DropoutLayer : public Layer {
 public:
  DropoutLayer(float keep_prob, int64_t size, uint64_t salt, kernels::DropoutNoise noise)
      : keep_prob_(keep_prob), size_(size), salt_(salt), noise_(noise) {}

  void Forward(const StepContext& ctx, Params params, Inputs inputs,
               int64_t batch, float* out) override {
    if (!ctx.training) {
      ctx.device->CopyOnDevice(out, inputs[0],
                               sizeof(float) * batch * size_);
      return;
    }
    ctx.device->DropoutForward(inputs[0], batch * size_, keep_prob_, Seed(ctx),
                               out, noise_);
  }

  void Backward(const StepContext& ctx, Params params, Inputs inputs,
                const float* out, int64_t batch, float* dout,
                absl::Span<float* const> din, Grads grads) override {
    if (din[0] == nullptr) return;
    ctx.device->DropoutBackward(dout, batch * size_, keep_prob_, Seed(ctx),
                                din[0], noise_);
  }

 private:
  uint64_t Seed(const StepContext& ctx) const {
    return ctx.step * 0x9E3779B97F4A7C15ull + salt_;
  }
  const float keep_prob_;
  const int64_t size_;
  const uint64_t salt_;
  const kernels::DropoutNoise noise_;
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

std::unique_ptr<Layer> NewZeroPadLayer(const ZeroPadSpec& spec, Dims in) {
  return std::make_unique<ZeroPadLayer>(spec, in);
}

std::unique_ptr<Layer> NewPoolLayer(bool max, int64_t window, int64_t stride,
                                    Padding padding, Dims in) {
  return std::make_unique<PoolLayer>(max, window, stride, padding, in);
}

std::unique_ptr<Layer> NewGlobalAvgPoolLayer(Dims in) {
  return std::make_unique<GlobalAvgPoolLayer>(in);
}

std::unique_ptr<Layer> NewConcatLayer(std::vector<int64_t> channels, Dims out) {
  return std::make_unique<ConcatLayer>(std::move(channels), out);
}

std::unique_ptr<Layer> NewSumLayer(int64_t size, bool relu) {
  return std::make_unique<SumLayer>(size, relu);
}

std::unique_ptr<Layer> NewDropoutLayer(float keep_prob, int64_t size,
                                       uint64_t salt, kernels::DropoutNoise noise) {
  return std::make_unique<DropoutLayer>(keep_prob, size, salt, noise);
}

std::unique_ptr<Layer> NewLayerNormLayer(float epsilon, Dims in, int first_var) {
  return std::make_unique<LayerNormLayer>(epsilon, in, first_var);
}

std::unique_ptr<Layer> NewChannelScaleLayer(Dims in, int first_var) {
  return std::make_unique<ChannelScaleLayer>(in, first_var);
}

std::unique_ptr<Layer> NewChannelAffineLayer(std::vector<float> scale, std::vector<float> offset,
                                             Dims in) {
  return std::make_unique<ChannelAffineLayer>(std::move(scale), std::move(offset), in);
}

std::unique_ptr<Layer> NewMultiplyLayer(Dims a, Dims b) {
  return std::make_unique<MultiplyLayer>(a, b);
}

std::unique_ptr<Layer> NewActivationLayer(const kernels::ActivationSpec& spec, int64_t size) {
  return std::make_unique<ActivationLayer>(spec, size);
}

}  // namespace psrt
