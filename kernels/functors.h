// Element-wise math, written once for the CPU and the GPU.
//
// Each functor is a small struct holding its scalars and raw pointers; its
// call operator does the work of one index (an element, a row or a column),
// or of one (row, column) pair. The CPU runs a functor with a plain loop
// (ForEachIndex / ForEachRowCol in elementwise.h), the GPU with a
// grid-stride kernel (ops_cuda.cu), so the GPU path runs
// exactly the arithmetic that the CPU tests check. Pointers are host
// pointers on the CPU and device pointers on the GPU.
//
// Functors never allocate, never branch on the device and hold no state
// beyond their fields; they are copied by value into CUDA kernel launches.
#ifndef PSRT_KERNELS_FUNCTORS_H_
#define PSRT_KERNELS_FUNCTORS_H_

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define PSRT_HOST_DEVICE __host__ __device__
#else
#define PSRT_HOST_DEVICE
#endif

namespace psrt {
namespace kernels {
namespace functor {

// Scalar helpers usable on both devices (std:: functions are not all
// __device__).
PSRT_HOST_DEVICE inline float MaxF(float a, float b) { return a > b ? a : b; }
PSRT_HOST_DEVICE inline float ExpF(float v) {
#if defined(__CUDA_ARCH__)
  return expf(v);
#else
  return std::exp(v);
#endif
}
PSRT_HOST_DEVICE inline float LogF(float v) {
#if defined(__CUDA_ARCH__)
  return logf(v);
#else
  return std::log(v);
#endif
}
PSRT_HOST_DEVICE inline double SqrtD(double v) {
#if defined(__CUDA_ARCH__)
  return sqrt(v);
#else
  return std::sqrt(v);
#endif
}
PSRT_HOST_DEVICE inline float SqrtF(float v) {
#if defined(__CUDA_ARCH__)
  return sqrtf(v);
#else
  return std::sqrt(v);
#endif
}

// y[i] = max(x[i], 0). y may alias x.
struct Relu {
  const float* x;
  float* y;
  PSRT_HOST_DEVICE void operator()(int64_t i) const {
    y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  }
};

// dx[i] = dy[i] where the forward output y[i] > 0, else 0. Uses the output,
// not the input, of the forward pass (they are positive at the same places).
// dx may alias dy.
struct ReluGrad {
  const float* y;
  const float* dy;
  float* dx;
  PSRT_HOST_DEVICE void operator()(int64_t i) const {
    dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
  }
};

// y[r, c] = x[r, c] + bias[c]: the bias broadcast over the rows of a
// [rows, cols] matrix. Indexed by (row, column) so that the CPU loops over
// contiguous rows and the GPU over elements. y may alias x.
struct BiasAdd {
  const float* x;
  const float* bias;
  int64_t cols;
  float* y;
  PSRT_HOST_DEVICE void operator()(int64_t r, int64_t c) const {
    y[r * cols + c] = x[r * cols + c] + bias[c];
  }
};

// Softmax cross-entropy of row `r` of logits[rows, classes] against
// labels[r], computed stably (max subtracted). Returns the row's loss divided
// by `rows` (its share of the batch mean), and when dlogits is not null
// writes d(mean loss)/d(logits row) = (softmax - onehot) / rows into row r of
// dlogits (overwrites; dlogits may equal logits).
// REQUIRES: 0 <= labels[r] < classes.
struct SoftmaxCrossEntropyRow {
  const float* logits;
  const int32_t* labels;
  int64_t rows;
  int64_t classes;
  float* dlogits;  // [rows, classes] or null.
  PSRT_HOST_DEVICE float operator()(int64_t r) const {
    const float* x = logits + r * classes;
    float max = x[0];
    for (int64_t c = 1; c < classes; ++c) max = MaxF(max, x[c]);
    float sum = 0.0f;
    for (int64_t c = 0; c < classes; ++c) sum += ExpF(x[c] - max);
    const float inv_rows = 1.0f / static_cast<float>(rows);
    const int32_t label = labels[r];
    // -log(softmax[label]) = log(sum exp(x - max)) - (x[label] - max).
    const float loss = (LogF(sum) - (x[label] - max)) * inv_rows;
    if (dlogits != nullptr) {
      float* d = dlogits + r * classes;
      const float inv_sum = 1.0f / sum;
      for (int64_t c = 0; c < classes; ++c) {
        const float p = ExpF(x[c] - max) * inv_sum;
        d[c] = (p - (c == label ? 1.0f : 0.0f)) * inv_rows;
      }
    }
    return loss;
  }
};


// Whether row `r` of logits[rows, classes] predicts labels[r]: its arg-max
// (the first maximum, on ties) is the label. 1 or 0.
struct CorrectPrediction {
  const float* logits;
  const int32_t* labels;
  int64_t classes;
  PSRT_HOST_DEVICE int32_t operator()(int64_t r) const {
    const float* x = logits + r * classes;
    int64_t best = 0;
    for (int64_t c = 1; c < classes; ++c) {
      if (x[c] > x[best]) best = c;
    }
    return best == labels[r] ? 1 : 0;
  }
};
// Plain SGD: var[i] -= lr * grad[i].
struct SgdUpdate {
  float lr;
  const float* grad;
  float* var;
  PSRT_HOST_DEVICE void operator()(int64_t i) const { var[i] -= lr * grad[i]; }
};

// Momentum, as TensorFlow's MomentumOptimizer (ApplyMomentum):
//   accum[i] = momentum * accum[i] + grad[i]
//   var[i]  -= lr * accum[i]                          (use_nesterov = false)
//   var[i]  -= lr * (grad[i] + momentum * accum[i])   (use_nesterov = true)
// The choice is a template argument, so neither device branches on it.
template <bool kNesterov>
struct MomentumUpdateT {
  float lr;
  float momentum;
  const float* grad;
  float* accum;
  float* var;
  PSRT_HOST_DEVICE void operator()(int64_t i) const {
    const float a = momentum * accum[i] + grad[i];
    accum[i] = a;
    var[i] -= lr * (kNesterov ? grad[i] + momentum * a : a);
  }
};
using MomentumUpdate = MomentumUpdateT<false>;

// acc[i] += grad[i].
struct Accumulate {
  const float* grad;
  float* acc;
  PSRT_HOST_DEVICE void operator()(int64_t i) const { acc[i] += grad[i]; }
};

// x[i] *= scale.
struct Scale {
  float scale;
  float* x;
  PSRT_HOST_DEVICE void operator()(int64_t i) const { x[i] *= scale; }
};

struct Fill {
  float value;
  float* x;
  PSRT_HOST_DEVICE void operator()(int64_t i) const { x[i] = value; }
};

// ---- The worker's gradient math (weight decay, clipping, tower averages).

// y[i] += a * x[i].
struct Axpy {
  float a;
  const float* x;
  float* y;
  PSRT_HOST_DEVICE void operator()(int64_t i) const { y[i] += a * x[i]; }
};

// g[i] += wd * w[i]: the gradient of the L2 penalty wd / 2 * sum(w^2).
struct WeightDecayGrad {
  float wd;
  const float* w;
  float* g;
  PSRT_HOST_DEVICE void operator()(int64_t i) const { g[i] += wd * w[i]; }
};

// x[i]^2 in double: a term of a sum (SumOverIndex on the CPU, a reduction
// kernel on the GPU).
struct SquaredValue {
  const float* x;
  PSRT_HOST_DEVICE double operator()(int64_t i) const { return double{x[i]} * x[i]; }
};

// Clipping by global norm: x[i] *= clip_norm / norm when the global norm,
// sqrt(*squares) (the sum of every tensor's squares, in memory: a device
// scalar on the GPU, so no round trip to the host), exceeds clip_norm.
struct ClipByNorm {
  float clip_norm;
  const double* squares;
  float* x;
  PSRT_HOST_DEVICE void operator()(int64_t i) const {
    const double norm = SqrtD(*squares);
    if (norm > clip_norm) x[i] *= static_cast<float>(clip_norm / norm);
  }
};

}  // namespace functor
}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_FUNCTORS_H_
