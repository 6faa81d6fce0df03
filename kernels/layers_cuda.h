// The CUDA versions of the layer ops (conv.h, depthwise_conv.h, pool.h,
// batch_norm.h, layer_ops.h, activation.h): the same arguments with a
// CudaContext and device pointers, and the same contracts (overwrite or
// add, aliasing, null outputs). The CPU ops are their oracle
// (tests/kernels/cuda).
//
// Convolution here is an im2col kernel + cuBLAS GEMM over a chunk of the
// batch at a time, and a gathering col2im for the input gradient: the
// fallback of a GPU device's convolutions (cudnn_conv.h) and their oracle
// on the GPU. Pools, batch norm, concat and dropout run the functors of
// layer_functors.h, the code the CPU tests check, in grid-stride kernels,
// but for max pooling's backward, which scatters each window's gradient to
// its max with atomics. Those, per-channel sums (batch norm) and L2 loss
// (which reduce in shared memory and add with atomics) may differ from the
// CPU in the last bits and from run to run.
//
// Everything is queued on the context's stream; nothing copies between host
// and device. This header compiles with the host compiler.
#ifndef PSRT_KERNELS_LAYERS_CUDA_H_
#define PSRT_KERNELS_LAYERS_CUDA_H_

#include <cstdint>

#include "absl/types/span.h"
#include "kernels/activation.h"
#include "kernels/batch_norm.h"
#include "kernels/ops_cuda.h"
#include "kernels/window.h"

namespace psrt {
namespace kernels {

class CudaConvolutions;  // cudnn_conv.h

// CudaWorkspace: a device buffer that the CUDA ops borrow for one call and
// that the caller keeps across calls (the GPU counterpart of Workspace).
// Get grows it with cudaFree + cudaMalloc, which synchronize the device, so
// a training loop pays that only in its first step.
//
// Thread safety: not thread-safe; one per CudaContext.
class CudaWorkspace {
 public:
  CudaWorkspace() = default;
  ~CudaWorkspace();
  CudaWorkspace(const CudaWorkspace&) = delete;
  CudaWorkspace& operator=(const CudaWorkspace&) = delete;

  // A device buffer of at least `size` floats, valid until the next Get;
  // null when it cannot be had (recorded in ctx).
  float* Get(const CudaContext& ctx, int64_t size);

 private:
  float* data_ = nullptr;
  int64_t capacity_ = 0;
};

// ---- conv.h ----
void Conv2DForward(const CudaContext& ctx, const Conv2DShape& shape,
                   const float* x, const float* filter, float* y,
                   CudaWorkspace* workspace);
void Conv2DBackward(const CudaContext& ctx, const Conv2DShape& shape,
                    const float* x, const float* filter, const float* dy,
                    float* dx, float* dfilter, CudaWorkspace* workspace);

// Copies a window of NHWC images: dst [batch, dst_height, dst_width,
// channels] gets dst[n, h, w, c] = src[n, h - offset_height,
// w - offset_width, c], 0 outside src. Positive offsets pad, negative ones
// crop (the explicit padding of cuDNN convolutions, cudnn_conv.h).
void CopyImageWindow(const CudaContext& ctx, const float* src, int64_t batch,
                     int64_t src_height, int64_t src_width, int64_t channels,
                     int64_t dst_height, int64_t dst_width,
                     int64_t offset_height, int64_t offset_width, float* dst);

// ---- depthwise_conv.h: with the device's convolutions, as Conv2D's entry
// points (cudnn_conv.h) take them; these need no scratch and do not use it.
void DepthwiseConv2DForward(const CudaContext& ctx, const DepthwiseConv2DShape& shape,
                            const float* x, const float* filter, float* y,
                            CudaConvolutions* convolutions);
void DepthwiseConv2DBackward(const CudaContext& ctx, const DepthwiseConv2DShape& shape,
                             const float* x, const float* filter, const float* dy, float* dx,
                             float* dfilter, CudaConvolutions* convolutions);

// ---- activation.h ----
void ActivationForward(const CudaContext& ctx, const ActivationSpec& spec, const float* x,
                       int64_t n, float* y);
void ActivationBackward(const CudaContext& ctx, const ActivationSpec& spec, const float* x,
                        const float* dy, int64_t n, float* dx);

// ---- layer_ops.h: affine maps and products. ----
void ChannelAffineForward(const CudaContext& ctx, const float* x, const float* scale,
                          const float* offset, int64_t pixels, int64_t channels, float* y);
void MultiplyForward(const CudaContext& ctx, const MultiplyShape& shape, const float* a,
                     const float* b, float* y);
void MultiplyBackward(const CudaContext& ctx, const MultiplyShape& shape, const float* a,
                      const float* b, const float* dy, float* da, float* db);

// ---- layer_ops.h: zero padding, as window copies (CopyImageWindow). ----
void ZeroPad2DForward(const CudaContext& ctx, const Pad2DShape& shape, const float* x, float* y);
void ZeroPad2DBackward(const CudaContext& ctx, const Pad2DShape& shape, const float* dy,
                       float* dx);

// ---- pool.h ----
void MaxPoolForward(const CudaContext& ctx, const Pool2DShape& shape,
                    const float* x, float* y);
void MaxPoolBackward(const CudaContext& ctx, const Pool2DShape& shape,
                     const float* x, const float* y, const float* dy,
                     float* dx);
void AvgPoolForward(const CudaContext& ctx, const Pool2DShape& shape,
                    const float* x, float* y);
void AvgPoolBackward(const CudaContext& ctx, const Pool2DShape& shape,
                     const float* dy, float* dx);
void GlobalAvgPoolForward(const CudaContext& ctx, const float* x, int64_t batch,
                          int64_t pixels, int64_t channels, float* y);
void GlobalAvgPoolBackward(const CudaContext& ctx, const float* dy,
                           int64_t batch, int64_t pixels, int64_t channels,
                           float* dx);

// ---- batch_norm.h ----
void BatchNormTrainingForward(const CudaContext& ctx, const BatchNormShape& s,
                              const float* x, const float* gamma,
                              const float* beta, float* moving_mean,
                              float* moving_var, float* saved_mean,
                              float* saved_inv_std, float* y);
void BatchNormTrainingBackward(const CudaContext& ctx, const BatchNormShape& s,
                               const float* x, const float* dy,
                               const float* gamma, const float* saved_mean,
                               const float* saved_inv_std, float* dx,
                               float* dgamma, float* dbeta);
void BatchNormInferenceForward(const CudaContext& ctx, const BatchNormShape& s,
                               const float* x, const float* gamma,
                               const float* beta, const float* moving_mean,
                               const float* moving_var, float* y);
void LayerNormForward(const CudaContext& ctx, const LayerNormShape& s, const float* x,
                      const float* gamma, const float* beta, float* saved_mean,
                      float* saved_inv_std, float* y);
void LayerNormBackward(const CudaContext& ctx, const LayerNormShape& s, const float* x,
                       const float* dy, const float* gamma, const float* saved_mean,
                       const float* saved_inv_std, float* row_scratch, float* dx,
                       float* dgamma, float* dbeta);

// ---- layer_ops.h ----
// `inputs` and `dinputs` are host arrays of device pointers.
void ConcatChannelsForward(const CudaContext& ctx, int64_t pixels,
                           absl::Span<const float* const> inputs,
                           absl::Span<const int64_t> channels, float* y);
void ConcatChannelsBackward(const CudaContext& ctx, int64_t pixels,
                            const float* dy, absl::Span<const int64_t> channels,
                            absl::Span<float* const> dinputs);
void DropoutForward(const CudaContext& ctx, const float* x, int64_t n,
                    float keep_prob, uint64_t seed, float* y,
                    const DropoutNoise& noise = {});
void DropoutBackward(const CudaContext& ctx, const float* dy, int64_t n,
                     float keep_prob, uint64_t seed, float* dx,
                     const DropoutNoise& noise = {});
// Unlike the CPU op, writes sum(x^2) / 2 to the device scalar *loss.
void L2LossForward(const CudaContext& ctx, const float* x, int64_t n,
                   float* loss);
void L2LossBackward(const CudaContext& ctx, const float* x, int64_t n,
                    float dloss, float* dx);

}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_LAYERS_CUDA_H_
