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

class ConvLayer : public Layer {
 public:
  ConvLayer(const ConvSpec& spec, Dims in, int first_var)
      : spec_(spec), in_(in), var_(first_var) {}

  void Forward(const StepContext& ctx, Params params, Inputs inputs,
               int64_t batch, float* out) override {
    kernels::Device& dev = *ctx.device;
    const kernels::Conv2DShape shape = Shape(batch);
    const int64_t rows = batch * shape.out_height() * shape.out_width();
    const int64_t channels = spec_.out_channels;
    float* conv_out = out;
    if (spec_.batch_norm) {
      InitializeBatchNorm(&dev);
      conv_out = conv_out_.Reserve(&dev, rows * channels);
    }
    dev.Conv2DForward(shape, inputs[0], params[var_], conv_out);
    if (spec_.bias) {
      dev.BiasAddForward(conv_out, params[var_ + 1], rows, channels, out);
    }
    if (spec_.batch_norm) {
      const kernels::BatchNormShape bn = BnShape(rows);
      const float* gamma = params[var_ + 1];
      const float* beta = params[var_ + 2];
      if (ctx.training) {
        dev.BatchNormTrainingForward(bn, conv_out, gamma, beta,
                                     moving_mean_.data(), moving_var_.data(),
                                     saved_mean_.data(), saved_inv_std_.data(),
                                     out);
      } else {
        dev.BatchNormInferenceForward(bn, conv_out, gamma, beta,
                                      moving_mean_.data(), moving_var_.data(),
                                      out);
      }
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
      dev.BatchNormTrainingBackward(BnShape(rows), conv_out_.data(), d,
                                    params[var_ + 1], saved_mean_.data(),
                                    saved_inv_std_.data(), d, grads[var_ + 1],
                                    grads[var_ + 2]);
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
  kernels::BatchNormShape BnShape(int64_t rows) const {
    return kernels::BatchNormShape{rows, spec_.out_channels, spec_.bn_epsilon,
                                   spec_.bn_momentum};
  }
  // The moving statistics start at mean 0, variance 1, on the first use.
  void InitializeBatchNorm(kernels::Device* dev) {
    if (moving_mean_.data() != nullptr) return;
    const int64_t c = spec_.out_channels;
    dev->Fill(moving_mean_.Reserve(dev, c), c, 0.0f);
    dev->Fill(moving_var_.Reserve(dev, c), c, 1.0f);
    saved_mean_.Reserve(dev, c);
    saved_inv_std_.Reserve(dev, c);
  }

  const ConvSpec spec_;
  const Dims in_;
  const int var_;
  // Batch norm only: the convolution's output (the batch norm's input),
  // the moving statistics (non-trainable state, kept here, not on the
  // parameter servers) and the batch statistics saved for the backward.
  DeviceArray<float> conv_out_;
  DeviceArray<float> moving_mean_;
  DeviceArray<float> moving_var_;
  DeviceArray<float> saved_mean_;
  DeviceArray<float> saved_inv_std_;
};

class FullyConnectedLayer : public Layer {
 public:
  FullyConnectedLayer(Dims in, int64_t units, bool relu, int first_var)
      : in_size_(in.size()), units_(units), relu_(relu), var_(first_var) {}

  void Forward(const StepContext& ctx, Params params, Inputs inputs,
               int64_t batch, float* out) override {
    kernels::Device& dev = *ctx.device;
    dev.MatMulForward(Shape(batch), inputs[0], params[var_], out);
    dev.BiasAddForward(out, params[var_ + 1], batch, units_, out);
    if (relu_) dev.ReluForward(out, batch * units_, out);
  }

  void Backward(const StepContext& ctx, Params params, Inputs inputs,
                const float* out, int64_t batch, float* dout,
                absl::Span<float* const> din, Grads grads) override {
    kernels::Device& dev = *ctx.device;
    if (relu_) dev.ReluBackward(out, dout, batch * units_, dout);
    dev.BiasAddBackward(dout, batch, units_, grads[var_ + 1]);
    dev.MatMulBackward(Shape(batch), inputs[0], params[var_], dout, din[0],
                       grads[var_]);
  }

 private:
  kernels::MatMulShape Shape(int64_t batch) const {
    return kernels::MatMulShape{batch, units_, in_size_};
  }
  const int64_t in_size_;
  const int64_t units_;
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

class DropoutLayer : public Layer {
 public:
  DropoutLayer(float keep_prob, int64_t size, uint64_t salt)
      : keep_prob_(keep_prob), size_(size), salt_(salt) {}

  void Forward(const StepContext& ctx, Params params, Inputs inputs,
               int64_t batch, float* out) override {
    if (!ctx.training) {
      ctx.device->CopyOnDevice(out, inputs[0],
                               sizeof(float) * batch * size_);
      return;
    }
    ctx.device->DropoutForward(inputs[0], batch * size_, keep_prob_, Seed(ctx),
                               out);
  }

  void Backward(const StepContext& ctx, Params params, Inputs inputs,
                const float* out, int64_t batch, float* dout,
                absl::Span<float* const> din, Grads grads) override {
    if (din[0] == nullptr) return;
    ctx.device->DropoutBackward(dout, batch * size_, keep_prob_, Seed(ctx),
                                din[0]);
  }

 private:
  uint64_t Seed(const StepContext& ctx) const {
    return ctx.step * 0x9E3779B97F4A7C15ull + salt_;
  }
  const float keep_prob_;
  const int64_t size_;
  const uint64_t salt_;
};

}  // namespace

std::unique_ptr<Layer> NewConvLayer(const ConvSpec& spec, Dims in,
                                    int first_var) {
  CHECK(!(spec.bias && spec.batch_norm)) << "a bias before a batch norm";
  return std::make_unique<ConvLayer>(spec, in, first_var);
}

std::unique_ptr<Layer> NewFullyConnectedLayer(Dims in, int64_t units, bool relu,
                                              int first_var) {
  return std::make_unique<FullyConnectedLayer>(in, units, relu, first_var);
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
                                       uint64_t salt) {
  return std::make_unique<DropoutLayer>(keep_prob, size, salt);
}

}  // namespace psrt
