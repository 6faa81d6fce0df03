// Pooling over NHWC images: max and average pooling with a window, strides
// and SAME/VALID padding (window.h), as TensorFlow's max_pool / avg_pool
// define them (padded cells are never the max and are not counted in an
// average), and global average pooling over all pixels of each image.
//
// Every backward gathers (one writer per input gradient element), so the
// CPU and GPU versions run the same functors (layer_functors.h) and need no
// atomics. Backwards overwrite dx. Nothing here allocates.
#ifndef PSRT_KERNELS_POOL_H_
#define PSRT_KERNELS_POOL_H_

#include <cstdint>

#include "kernels/cpu_context.h"
#include "kernels/window.h"

namespace psrt {
namespace kernels {

// y[n, oh, ow, c] = max of x over the window. Overwrites y.
// REQUIRES: y does not overlap x; the window fits (VALID) the input.
void MaxPoolForward(const CpuContext& ctx, const Pool2DShape& shape,
                    const float* x, float* y);
// From the forward's input x and output y: dx = dy routed to each window's
// first maximal cell (summed where windows overlap). Overwrites dx.
void MaxPoolBackward(const CpuContext& ctx, const Pool2DShape& shape,
                     const float* x, const float* y, const float* dy,
                     float* dx);

// y[n, oh, ow, c] = mean of x over the valid cells of the window.
void AvgPoolForward(const CpuContext& ctx, const Pool2DShape& shape,
                    const float* x, float* y);
// dx = each dy spread evenly over its window's valid cells. Overwrites dx.
void AvgPoolBackward(const CpuContext& ctx, const Pool2DShape& shape,
                     const float* dy, float* dx);

// y[n, c] = mean over the `pixels` pixels of x[n, pixels, channels].
// Overwrites y.
void GlobalAvgPoolForward(const CpuContext& ctx, const float* x, int64_t batch,
                          int64_t pixels, int64_t channels, float* y);
// dx[n, p, c] = dy[n, c] / pixels. Overwrites dx.
void GlobalAvgPoolBackward(const CpuContext& ctx, const float* dy,
                           int64_t batch, int64_t pixels, int64_t channels,
                           float* dx);

}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_POOL_H_
