// Batch normalization over the channels of NHWC activations, seen as a
// [rows, channels] matrix (rows = batch * height * width; a fully connected
// layer's [batch, units] works the same).
//
// Training: each channel is normalized with the mean and the (biased)
// variance of its rows in this batch, then scaled by gamma and shifted by
// beta; the moving statistics are updated with TensorFlow/Keras' momentum
// (moving = momentum * moving + (1 - momentum) * batch statistic; the
// variance is Bessel-corrected there, as TensorFlow and PyTorch do). The
// forward saves the batch mean and 1/sqrt(var + epsilon) for the backward,
// like cuDNN's saveMean / saveInvVariance. Inference normalizes with the
// moving statistics and has no backward here.
//
// Buffers are the caller's: gamma, beta, moving_mean, moving_var,
// saved_mean, saved_inv_std and the gradients of gamma and beta are
// [channels] each. CPU statistics are accumulated in double. Nothing here
// allocates.
#ifndef PSRT_KERNELS_BATCH_NORM_H_
#define PSRT_KERNELS_BATCH_NORM_H_

#include <cstdint>

#include "kernels/cpu_context.h"

namespace psrt {
namespace kernels {

struct BatchNormShape {
  int64_t rows = 0;
  int64_t channels = 0;
  float epsilon = 1e-3f;   // TensorFlow's default.
  float momentum = 0.99f;  // Keras' default (TensorFlow's "decay").
  // The moving variance follows the batch's variance with Bessel's
  // correction (n / (n - 1): TensorFlow's fused batch norm, Keras 2,
  // PyTorch), or without (Keras 3).
  bool bessel = true;
};

// y = gamma * (x - mean) / sqrt(var + epsilon) + beta with this batch's
// statistics. Writes saved_mean and saved_inv_std; updates moving_mean and
// moving_var when they are not null (both or neither). Overwrites y; y may
// equal x.
// REQUIRES: rows >= 1, channels >= 1.
void BatchNormTrainingForward(const CpuContext& ctx, const BatchNormShape& s,
                              const float* x, const float* gamma,
                              const float* beta, float* moving_mean,
                              float* moving_var, float* saved_mean,
                              float* saved_inv_std, float* y);

// Backward of BatchNormTrainingForward, from its input x and saved
// statistics: dgamma = sum(dy * xhat), dbeta = sum(dy) and
// dx = gamma * inv_std * (dy - mean(dy) - xhat * mean(dy * xhat)).
// Overwrites dx (null: skipped; may equal dy), dgamma and dbeta.
void BatchNormTrainingBackward(const CpuContext& ctx, const BatchNormShape& s,
                               const float* x, const float* dy,
                               const float* gamma, const float* saved_mean,
                               const float* saved_inv_std, float* dx,
                               float* dgamma, float* dbeta);

// y = gamma * (x - moving_mean) / sqrt(moving_var + epsilon) + beta.
// Overwrites y; y may equal x.
void BatchNormInferenceForward(const CpuContext& ctx, const BatchNormShape& s,
                               const float* x, const float* gamma,
                               const float* beta, const float* moving_mean,
                               const float* moving_var, float* y);

// Layer normalization (Keras's LayerNormalization over the last axis):
// each row of x [rows, channels] normalized with its own mean and (biased)
// variance, then scaled by gamma [channels] and shifted by beta
// [channels]; the same in training and inference. saved_mean and
// saved_inv_std are [rows]: the forward writes them for the backward.
struct LayerNormShape {
  int64_t rows = 0;
  int64_t channels = 0;
  float epsilon = 1e-3f;  // Keras's default.
};

// Overwrites y (may equal x), saved_mean and saved_inv_std.
// REQUIRES: rows >= 1, channels >= 1.
void LayerNormForward(const CpuContext& ctx, const LayerNormShape& s, const float* x,
                      const float* gamma, const float* beta, float* saved_mean,
                      float* saved_inv_std, float* y);

// Backward of LayerNormForward, from its input x and saved statistics:
// dgamma = sum over rows of dy * xhat, dbeta = sum of dy, and (unless dx is
// null) dx = inv_std * (g - mean(g) - xhat * mean(g * xhat)) with
// g = dy * gamma, the means over each row. row_scratch holds 2 * rows
// floats. Overwrites dx (may equal dy), dgamma and dbeta.
void LayerNormBackward(const CpuContext& ctx, const LayerNormShape& s, const float* x,
                       const float* dy, const float* gamma, const float* saved_mean,
                       const float* saved_inv_std, float* row_scratch, float* dx,
                       float* dgamma, float* dbeta);

}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_BATCH_NORM_H_
