// The depthwise convolution on a GPU (depthwise_conv.h's contract;
// layers_cuda.h): a thread per output (or input) element gathering over the
// taps, and the filter's gradient as a column sum per tap.
#include "glog/logging.h"
#include "kernels/cuda_launch.cuh"
#include "kernels/depthwise_functors.h"
#include "kernels/layers_cuda.h"

namespace psrt {
namespace kernels {
namespace {

// Tap (i, j)'s column of the filter's gradient: DepthwiseFilterGrad::Term.
struct TapColumn {
  functor::DepthwiseFilterGrad grad;
  int64_t i, j;
  __device__ float operator()(int64_t r, int64_t oc) const { return grad.Term(r, i, j, oc); }
};

}  // namespace

void DepthwiseConv2DForward(const CudaContext& ctx, const DepthwiseConv2DShape& s, const float* x,
                            const float* filter, float* y, CudaConvolutions* /*convolutions*/) {
  cuda::LaunchForEachPixelChannel(ctx, s.batch * s.out_height() * s.out_width(), s.out_channels(),
                                  functor::DepthwiseConv{s, x, filter, y});
}

void DepthwiseConv2DBackward(const CudaContext& ctx, const DepthwiseConv2DShape& s, const float* x,
                             const float* filter, const float* dy, float* dx, float* dfilter,
                             CudaConvolutions* /*convolutions*/) {
  if (dx != nullptr) {
    cuda::LaunchForEachPixelChannel(ctx, s.batch * s.in_height * s.in_width, s.channels,
                                    functor::DepthwiseConvInputGrad{s, dy, filter, dx});
  }
  const functor::DepthwiseFilterGrad grad{s, x, dy};
  const int64_t rows = s.batch * s.out_height() * s.out_width();
  for (int64_t i = 0; i < s.filter_height; ++i) {
    for (int64_t j = 0; j < s.filter_width; ++j) {
      cuda::ColumnSums(ctx, rows, s.out_channels(), TapColumn{grad, i, j},
                       dfilter + (i * s.filter_width + j) * s.out_channels());
    }
  }
}

}  // namespace kernels
}  // namespace psrt
