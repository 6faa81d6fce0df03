// The layers without variables (models/layers.h): padding, pooling,
// concatenation, sums, activations, constant affines, products and dropout.
#include <algorithm>
#include <utility>

#include "glog/logging.h"
#include "models/layers.h"

namespace psrt {
namespace {

using kernels::DeviceArray;
using kernels::Padding;
using Params = absl::Span<const float* const>;
using Inputs = absl::Span<const float* const>;
using Grads = absl::Span<float* const>;

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
    if (relu_) ctx.device->ReluForward(out, OutSize(batch), out);
  }

  // With a trailing ReLU, out is the rectified max: where it is 0 the
  // ReLU's backward zeroes dout first, so MaxPoolBackward routes zeros (the
  // GPU's, which finds the max cells by comparing with out, may then match
  // cells equal to 0), and elsewhere out is the window's max itself.
  void Backward(const StepContext& ctx, Params params, Inputs inputs,
                const float* out, int64_t batch, float* dout,
                absl::Span<float* const> din, Grads grads) override {
    if (din[0] == nullptr) return;
    if (relu_) ctx.device->ReluBackward(out, dout, OutSize(batch), dout);
    if (max_) {
      ctx.device->MaxPoolBackward(Shape(batch), inputs[0], out, dout, din[0]);
    } else {
      ctx.device->AvgPoolBackward(Shape(batch), dout, din[0]);
    }
  }

  bool TakesTrailingRelu() const override { return max_ && !relu_; }
  void TakeTrailingRelu() override { relu_ = true; }

 private:
  int64_t OutSize(int64_t batch) const { return Shape(batch).output_size(); }
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
  bool relu_ = false;  // A ReLU after the pool (TakeTrailingRelu).
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
