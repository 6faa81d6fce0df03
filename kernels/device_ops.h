// DeviceOps: the ops of Device (device.h) written once for both devices, as
// forwards to the free functions of the same name that take the device's
// context (CpuContext or CudaContext) and convolution state (Workspace, or
// CudaConvolutions: cudnn_conv.h). CpuDevice and CudaDevice derive from it and add memory.
// Internal to kernels/.
//
// REQUIRES: the includer declares the ops of Context before it includes this
// header (the calls are qualified, so they see only what precedes them).
//
// Thread safety: as Device's.
#ifndef PSRT_KERNELS_DEVICE_OPS_H_
#define PSRT_KERNELS_DEVICE_OPS_H_

#include "kernels/device.h"

namespace psrt {
namespace kernels {

template <class Context, class ConvWorkspace>
class DeviceOps : public Device {
 public:
  void MatMulForward(const MatMulShape& shape, const float* a, const float* b,
                     float* c) override {
    kernels::MatMulForward(ctx(), shape, a, b, c);
  }
  void MatMulBackward(const MatMulShape& shape, const float* a, const float* b,
                      const float* dc, float* da, float* db) override {
    kernels::MatMulBackward(ctx(), shape, a, b, dc, da, db);
  }
  void BiasAddForward(const float* x, const float* bias, int64_t rows,
                      int64_t cols, float* y) override {
    kernels::BiasAddForward(ctx(), x, bias, rows, cols, y);
  }
  void BiasAddBackward(const float* dy, int64_t rows, int64_t cols,
                       float* dbias) override {
    kernels::BiasAddBackward(ctx(), dy, rows, cols, dbias);
  }
  void ReluForward(const float* x, int64_t n, float* y) override {
    kernels::ReluForward(ctx(), x, n, y);
  }
  void ReluBackward(const float* y, const float* dy, int64_t n,
                    float* dx) override {
    kernels::ReluBackward(ctx(), y, dy, n, dx);
  }
  void SoftmaxCrossEntropyForward(const float* logits, const int32_t* labels,
                                  int64_t batch, int64_t classes,
                                  float* loss) override {
    kernels::SoftmaxCrossEntropyForward(ctx(), logits, labels, batch, classes,
                                        loss);
  }
  void SoftmaxCrossEntropyBackward(const float* logits, const int32_t* labels,
                                   int64_t batch, int64_t classes,
                                   float* dlogits) override {
    kernels::SoftmaxCrossEntropyBackward(ctx(), logits, labels, batch, classes,
                                         dlogits);
  }
  void CountCorrect(const float* logits, const int32_t* labels, int64_t batch,
                    int64_t classes, int32_t* correct) override {
    kernels::CountCorrect(ctx(), logits, labels, batch, classes, correct);
  }
  void Accumulate(const float* x, float* acc, int64_t n) override {
    kernels::Accumulate(ctx(), x, acc, n);
  }

  void Conv2DForward(const Conv2DShape& shape, const float* x,
                     const float* filter, const float* bias,
                     float* y) override {
    kernels::Conv2DForward(ctx(), shape, x, filter, bias, y, conv_workspace());
  }
  void Conv2DBackward(const Conv2DShape& shape, const float* x,
                      const float* filter, const float* dy, float* dx,
                      float* dfilter, float* dbias) override {
    kernels::Conv2DBackward(ctx(), shape, x, filter, dy, dx, dfilter, dbias,
                            conv_workspace());
  }
  void DepthwiseConv2DForward(const DepthwiseConv2DShape& shape, const float* x,
                              const float* filter, float* y) override {
    kernels::DepthwiseConv2DForward(ctx(), shape, x, filter, y, conv_workspace());
  }
  void DepthwiseConv2DBackward(const DepthwiseConv2DShape& shape, const float* x,
                               const float* filter, const float* dy, float* dx,
                               float* dfilter) override {
    kernels::DepthwiseConv2DBackward(ctx(), shape, x, filter, dy, dx, dfilter, conv_workspace());
  }
  void MaxPoolForward(const Pool2DShape& shape, const float* x,
                      float* y) override {
    kernels::MaxPoolForward(ctx(), shape, x, y);
  }
  void MaxPoolBackward(const Pool2DShape& shape, const float* x,
                       const float* y, const float* dy, float* dx) override {
    kernels::MaxPoolBackward(ctx(), shape, x, y, dy, dx);
  }
  void AvgPoolForward(const Pool2DShape& shape, const float* x,
                      float* y) override {
    kernels::AvgPoolForward(ctx(), shape, x, y);
  }
  void AvgPoolBackward(const Pool2DShape& shape, const float* dy,
                       float* dx) override {
    kernels::AvgPoolBackward(ctx(), shape, dy, dx);
  }
  void GlobalAvgPoolForward(const float* x, int64_t batch, int64_t pixels,
                            int64_t channels, float* y) override {
    kernels::GlobalAvgPoolForward(ctx(), x, batch, pixels, channels, y);
  }
  void GlobalAvgPoolBackward(const float* dy, int64_t batch, int64_t pixels,
                             int64_t channels, float* dx) override {
    kernels::GlobalAvgPoolBackward(ctx(), dy, batch, pixels, channels, dx);
  }
  void BatchNormTrainingForward(const BatchNormShape& s, const float* x,
                                const float* gamma, const float* beta,
                                float* moving_mean, float* moving_var,
                                float* saved_mean, float* saved_inv_std,
                                float* y) override {
    kernels::BatchNormTrainingForward(ctx(), s, x, gamma, beta, moving_mean,
                                      moving_var, saved_mean, saved_inv_std, y);
  }
  void BatchNormTrainingBackward(const BatchNormShape& s, const float* x,
                                 const float* dy, const float* gamma,
                                 const float* saved_mean,
                                 const float* saved_inv_std, float* dx,
                                 float* dgamma, float* dbeta) override {
    kernels::BatchNormTrainingBackward(ctx(), s, x, dy, gamma, saved_mean,
                                       saved_inv_std, dx, dgamma, dbeta);
  }
  void BatchNormInferenceForward(const BatchNormShape& s, const float* x,
                                 const float* gamma, const float* beta,
                                 const float* moving_mean,
                                 const float* moving_var, float* y) override {
    kernels::BatchNormInferenceForward(ctx(), s, x, gamma, beta, moving_mean,
                                       moving_var, y);
  }
  void LayerNormForward(const LayerNormShape& s, const float* x, const float* gamma,
                        const float* beta, float* saved_mean, float* saved_inv_std,
                        float* y) override {
    kernels::LayerNormForward(ctx(), s, x, gamma, beta, saved_mean, saved_inv_std, y);
  }
  void LayerNormBackward(const LayerNormShape& s, const float* x, const float* dy,
                         const float* gamma, const float* saved_mean,
                         const float* saved_inv_std, float* row_scratch, float* dx,
                         float* dgamma, float* dbeta) override {
    kernels::LayerNormBackward(ctx(), s, x, dy, gamma, saved_mean, saved_inv_std, row_scratch,
                               dx, dgamma, dbeta);
  }
  void ConcatChannelsForward(int64_t pixels,
                             absl::Span<const float* const> inputs,
                             absl::Span<const int64_t> channels,
                             float* y) override {
    kernels::ConcatChannelsForward(ctx(), pixels, inputs, channels, y);
  }
  void ConcatChannelsBackward(int64_t pixels, const float* dy,
                              absl::Span<const int64_t> channels,
                              absl::Span<float* const> dinputs) override {
    kernels::ConcatChannelsBackward(ctx(), pixels, dy, channels, dinputs);
  }
  void ActivationForward(const ActivationSpec& spec, const float* x, int64_t n,
                         float* y) override {
    kernels::ActivationForward(ctx(), spec, x, n, y);
  }
  void ActivationBackward(const ActivationSpec& spec, const float* x, const float* dy,
                          int64_t n, float* dx) override {
    kernels::ActivationBackward(ctx(), spec, x, dy, n, dx);
  }
  void ChannelAffineForward(const float* x, const float* scale, const float* offset,
                            int64_t pixels, int64_t channels, float* y) override {
    kernels::ChannelAffineForward(ctx(), x, scale, offset, pixels, channels, y);
  }
  void MultiplyForward(const MultiplyShape& shape, const float* a, const float* b,
                       float* y) override {
    kernels::MultiplyForward(ctx(), shape, a, b, y);
  }
  void MultiplyBackward(const MultiplyShape& shape, const float* a, const float* b,
                        const float* dy, float* da, float* db) override {
    kernels::MultiplyBackward(ctx(), shape, a, b, dy, da, db);
  }
  void ZeroPad2DForward(const Pad2DShape& shape, const float* x, float* y) override {
    kernels::ZeroPad2DForward(ctx(), shape, x, y);
  }
  void ZeroPad2DBackward(const Pad2DShape& shape, const float* dy, float* dx) override {
    kernels::ZeroPad2DBackward(ctx(), shape, dy, dx);
  }
  void DropoutForward(const float* x, int64_t n, float keep_prob,
                      uint64_t seed, float* y, const DropoutNoise& noise) override {
    kernels::DropoutForward(ctx(), x, n, keep_prob, seed, y, noise);
  }
  void DropoutBackward(const float* dy, int64_t n, float keep_prob,
                       uint64_t seed, float* dx, const DropoutNoise& noise) override {
    kernels::DropoutBackward(ctx(), dy, n, keep_prob, seed, dx, noise);
  }

 protected:
  virtual const Context& ctx() const = 0;
  virtual ConvWorkspace* conv_workspace() = 0;
};

}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_DEVICE_OPS_H_
