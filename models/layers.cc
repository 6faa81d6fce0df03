#include "models/layers.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "glog/logging.h"
#include "kernels/batch_norm.h"
#include "kernels/conv.h"
#include "kernels/layer_ops.h"
#include "kernels/ops.h"
#include "kernels/pool.h"

namespace psrt {
namespace {

using kernels::Padding;

// Gives t the shape [n], keeping its storage (and shape vector) when it has
// it already.
void EnsureVector(Tensor* t, int64_t n) {
  if (t->rank() != 1 || t->dim(0) != n) t->Resize({n});
}

class ConvLayer : public Layer {
 public:
  ConvLayer(const ConvSpec& spec, Dims in, int first_var)
      : spec_(spec), in_(in), var_(first_var) {
    if (spec_.batch_norm) {
      moving_mean_ = Tensor({spec_.out_channels});
      moving_var_ = Tensor({spec_.out_channels});
      for (float& v : moving_var_.flat()) v = 1.0f;
      saved_mean_ = Tensor({spec_.out_channels});
      saved_inv_std_ = Tensor({spec_.out_channels});
    }
  }

  void Forward(const StepContext& ctx, const std::vector<Tensor>& params,
               absl::Span<const Tensor* const> inputs, int64_t batch,
               Tensor* out) override {
    const kernels::Conv2DShape shape = Shape(batch);
    const int64_t rows = batch * shape.out_height() * shape.out_width();
    const int64_t channels = spec_.out_channels;
    float* conv_out = out->data();
    if (spec_.batch_norm) {
      EnsureVector(&conv_out_, rows * channels);
      conv_out = conv_out_.data();
    }
    kernels::Conv2DForward(ctx.cpu, shape, inputs[0]->data(),
                           params[var_].data(), conv_out, ctx.workspace);
    if (spec_.bias) {
      kernels::BiasAddForward(ctx.cpu, conv_out, params[var_ + 1].data(), rows,
                              channels, out->data());
    }
    if (spec_.batch_norm) {
      const kernels::BatchNormShape bn = BnShape(rows);
      const float* gamma = params[var_ + 1].data();
      const float* beta = params[var_ + 2].data();
      if (ctx.training) {
        kernels::BatchNormTrainingForward(
            ctx.cpu, bn, conv_out, gamma, beta, moving_mean_.data(),
            moving_var_.data(), saved_mean_.data(), saved_inv_std_.data(),
            out->data());
      } else {
        kernels::BatchNormInferenceForward(ctx.cpu, bn, conv_out, gamma, beta,
                                           moving_mean_.data(),
                                           moving_var_.data(), out->data());
      }
    }
    if (spec_.relu) {
      kernels::ReluForward(ctx.cpu, out->data(), rows * channels, out->data());
    }
  }

  void Backward(const StepContext& ctx, const std::vector<Tensor>& params,
                absl::Span<const Tensor* const> inputs, const Tensor& out,
                int64_t batch, Tensor* dout, absl::Span<Tensor* const> din,
                std::vector<Tensor>* grads) override {
    const kernels::Conv2DShape shape = Shape(batch);
    const int64_t rows = batch * shape.out_height() * shape.out_width();
    const int64_t channels = spec_.out_channels;
    float* d = dout->data();
    if (spec_.relu) {
      kernels::ReluBackward(ctx.cpu, out.data(), d, rows * channels, d);
    }
    if (spec_.bias) {
      kernels::BiasAddBackward(ctx.cpu, d, rows, channels,
                               (*grads)[var_ + 1].data());
    }
    if (spec_.batch_norm) {
      kernels::BatchNormTrainingBackward(
          ctx.cpu, BnShape(rows), conv_out_.data(), d, params[var_ + 1].data(),
          saved_mean_.data(), saved_inv_std_.data(), d,
          (*grads)[var_ + 1].data(), (*grads)[var_ + 2].data());
    }
    kernels::Conv2DBackward(ctx.cpu, shape, inputs[0]->data(),
                            params[var_].data(), d,
                            din[0] != nullptr ? din[0]->data() : nullptr,
                            (*grads)[var_].data(), ctx.workspace);
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

  const ConvSpec spec_;
  const Dims in_;
  const int var_;
  // Batch norm only: the convolution's output (the batch norm's input),
  // the moving statistics (non-trainable state, kept here, not on the
  // parameter servers) and the batch statistics saved for the backward.
  Tensor conv_out_;
  Tensor moving_mean_;
  Tensor moving_var_;
  Tensor saved_mean_;
  Tensor saved_inv_std_;
};

class FullyConnectedLayer : public Layer {
 public:
  FullyConnectedLayer(Dims in, int64_t units, bool relu, int first_var)
      : in_size_(in.size()), units_(units), relu_(relu), var_(first_var) {}

  void Forward(const StepContext& ctx, const std::vector<Tensor>& params,
               absl::Span<const Tensor* const> inputs, int64_t batch,
               Tensor* out) override {
    kernels::MatMulForward(ctx.cpu, Shape(batch), inputs[0]->data(),
                           params[var_].data(), out->data());
    kernels::BiasAddForward(ctx.cpu, out->data(), params[var_ + 1].data(),
                            batch, units_, out->data());
    if (relu_) {
      kernels::ReluForward(ctx.cpu, out->data(), batch * units_, out->data());
    }
  }

  void Backward(const StepContext& ctx, const std::vector<Tensor>& params,
                absl::Span<const Tensor* const> inputs, const Tensor& out,
                int64_t batch, Tensor* dout, absl::Span<Tensor* const> din,
                std::vector<Tensor>* grads) override {
    float* d = dout->data();
    if (relu_) kernels::ReluBackward(ctx.cpu, out.data(), d, batch * units_, d);
    kernels::BiasAddBackward(ctx.cpu, d, batch, units_,
                             (*grads)[var_ + 1].data());
    kernels::MatMulBackward(
        ctx.cpu, Shape(batch), inputs[0]->data(), params[var_].data(), d,
        din[0] != nullptr ? din[0]->data() : nullptr, (*grads)[var_].data());
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

  void Forward(const StepContext& ctx, const std::vector<Tensor>& params,
               absl::Span<const Tensor* const> inputs, int64_t batch,
               Tensor* out) override {
    if (max_) {
      kernels::MaxPoolForward(ctx.cpu, Shape(batch), inputs[0]->data(),
                              out->data());
    } else {
      kernels::AvgPoolForward(ctx.cpu, Shape(batch), inputs[0]->data(),
                              out->data());
    }
  }

  void Backward(const StepContext& ctx, const std::vector<Tensor>& params,
                absl::Span<const Tensor* const> inputs, const Tensor& out,
                int64_t batch, Tensor* dout, absl::Span<Tensor* const> din,
                std::vector<Tensor>* grads) override {
    if (din[0] == nullptr) return;
    if (max_) {
      kernels::MaxPoolBackward(ctx.cpu, Shape(batch), inputs[0]->data(),
                               out.data(), dout->data(), din[0]->data());
    } else {
      kernels::AvgPoolBackward(ctx.cpu, Shape(batch), dout->data(),
                               din[0]->data());
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

  void Forward(const StepContext& ctx, const std::vector<Tensor>& params,
               absl::Span<const Tensor* const> inputs, int64_t batch,
               Tensor* out) override {
    kernels::GlobalAvgPoolForward(ctx.cpu, inputs[0]->data(), batch,
                                  in_.pixels(), in_.channels, out->data());
  }

  void Backward(const StepContext& ctx, const std::vector<Tensor>& params,
                absl::Span<const Tensor* const> inputs, const Tensor& out,
                int64_t batch, Tensor* dout, absl::Span<Tensor* const> din,
                std::vector<Tensor>* grads) override {
    if (din[0] == nullptr) return;
    kernels::GlobalAvgPoolBackward(ctx.cpu, dout->data(), batch, in_.pixels(),
                                   in_.channels, din[0]->data());
  }

 private:
  const Dims in_;
};

class ConcatLayer : public Layer {
 public:
  ConcatLayer(std::vector<int64_t> channels, Dims out)
      : channels_(std::move(channels)),
        out_(out),
        inputs_(channels_.size()),
        dinputs_(channels_.size()) {}

  void Forward(const StepContext& ctx, const std::vector<Tensor>& params,
               absl::Span<const Tensor* const> inputs, int64_t batch,
               Tensor* out) override {
    for (size_t i = 0; i < inputs.size(); ++i) inputs_[i] = inputs[i]->data();
    kernels::ConcatChannelsForward(ctx.cpu, batch * out_.pixels(), inputs_,
                                   channels_, out->data());
  }

  void Backward(const StepContext& ctx, const std::vector<Tensor>& params,
                absl::Span<const Tensor* const> inputs, const Tensor& out,
                int64_t batch, Tensor* dout, absl::Span<Tensor* const> din,
                std::vector<Tensor>* grads) override {
    for (size_t i = 0; i < din.size(); ++i) {
      dinputs_[i] = din[i] != nullptr ? din[i]->data() : nullptr;
    }
    kernels::ConcatChannelsBackward(ctx.cpu, batch * out_.pixels(),
                                    dout->data(), channels_, dinputs_);
  }

 private:
  const std::vector<int64_t> channels_;
  const Dims out_;
  // Pointer lists, sized once so that steps do not allocate.
  std::vector<const float*> inputs_;
  std::vector<float*> dinputs_;
};

class DropoutLayer : public Layer {
 public:
  DropoutLayer(float keep_prob, int64_t size, uint64_t salt)
      : keep_prob_(keep_prob), size_(size), salt_(salt) {}

  void Forward(const StepContext& ctx, const std::vector<Tensor>& params,
               absl::Span<const Tensor* const> inputs, int64_t batch,
               Tensor* out) override {
    if (!ctx.training) {
      std::memcpy(out->data(), inputs[0]->data(), out->num_bytes());
      return;
    }
    kernels::DropoutForward(ctx.cpu, inputs[0]->data(), batch * size_,
                            keep_prob_, Seed(ctx), out->data());
  }

  void Backward(const StepContext& ctx, const std::vector<Tensor>& params,
                absl::Span<const Tensor* const> inputs, const Tensor& out,
                int64_t batch, Tensor* dout, absl::Span<Tensor* const> din,
                std::vector<Tensor>* grads) override {
    if (din[0] == nullptr) return;
    kernels::DropoutBackward(ctx.cpu, dout->data(), batch * size_, keep_prob_,
                             Seed(ctx), din[0]->data());
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

std::unique_ptr<Layer> NewDropoutLayer(float keep_prob, int64_t size,
                                       uint64_t salt) {
  return std::make_unique<DropoutLayer>(keep_prob, size, salt);
}

}  // namespace psrt
