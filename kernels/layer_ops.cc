#include "kernels/layer_ops.h"

#include <algorithm>

#include "glog/logging.h"
#include "kernels/elementwise.h"
#include "kernels/layer_functors.h"

namespace psrt {
namespace kernels {
namespace {

constexpr int64_t kElementGrain = 1 << 15;

int64_t TotalChannels(absl::Span<const int64_t> channels) {
  int64_t total = 0;
  for (int64_t c : channels) {
    CHECK_GE(c, 1) << "a concatenated input has no channels";
    total += c;
  }
  return total;
}

// Runs f(pixel, 0, channels) over the pixels, a run of them per task.
template <class F>
void ForEachPixel(const CpuContext& ctx, int64_t pixels, int64_t channels, const F& f) {
  ctx.ParallelFor(pixels, std::max<int64_t>(1, kElementGrain / std::max<int64_t>(channels, 1)),
                  [&](int64_t begin, int64_t end) {
                    const F local = f;  // See ForEachIndex.
                    for (int64_t p = begin; p < end; ++p) local(p, 0, channels);
                  });
}

void CheckPad(const Pad2DShape& s) {
  CHECK(s.batch >= 0 && s.in_height >= 0 && s.in_width >= 0 && s.channels >= 0 && s.top >= 0 &&
        s.bottom >= 0 && s.left >= 0 && s.right >= 0)
      << "a zero padding of negative sizes";
}

}  // namespace

void ZeroPad2DForward(const CpuContext& ctx, const Pad2DShape& shape, const float* x, float* y) {
  CheckPad(shape);
  ForEachPixel(ctx, shape.batch * shape.out_height() * shape.out_width(), shape.channels,
               functor::ZeroPad2D(shape, x, y));
}

void ZeroPad2DBackward(const CpuContext& ctx, const Pad2DShape& shape, const float* dy,
                       float* dx) {
  CheckPad(shape);
  ForEachPixel(ctx, shape.batch * shape.in_height * shape.in_width, shape.channels,
               functor::ZeroPad2DGrad(shape, dy, dx));
}

void ChannelAffineForward(const CpuContext& ctx, const float* x, const float* scale,
                          const float* offset, int64_t pixels, int64_t channels, float* y) {
  const functor::ChannelAffine f{x, scale, offset, channels, y};
  ctx.ParallelFor(pixels, std::max<int64_t>(1, kElementGrain / std::max<int64_t>(channels, 1)),
                  [&](int64_t begin, int64_t end) { ForEachRowCol(begin, end, channels, f); });
}

void MultiplyForward(const CpuContext& ctx, const MultiplyShape& s, const float* a,
                     const float* b, float* y) {
  const functor::Multiply f{a, b, s.pixels, s.channels, s.broadcast, y};
  ctx.ParallelFor(s.batch * s.pixels,
                  std::max<int64_t>(1, kElementGrain / std::max<int64_t>(s.channels, 1)),
                  [&](int64_t begin, int64_t end) { ForEachRowCol(begin, end, s.channels, f); });
}

void MultiplyBackward(const CpuContext& ctx, const MultiplyShape& s, const float* a,
                      const float* b, const float* dy, float* da, float* db) {
  if (da != nullptr) MultiplyForward(ctx, s, dy, b, da);
  if (db == nullptr) return;
  if (!s.broadcast) {
    MultiplyForward(ctx, s, dy, a, db);
    return;
  }
  // Each image's column sums, over its pixels in order.
  const functor::MultiplyBroadcastGradTerm term{dy, a, s.pixels, s.channels};
  ctx.ParallelFor(s.batch, 1, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      float* out = db + n * s.channels;
      std::fill(out, out + s.channels, 0.0f);
      for (int64_t p = 0; p < s.pixels; ++p) {
        for (int64_t c = 0; c < s.channels; ++c) out[c] += term(p, n * s.channels + c);
      }
    }
  });
}

void ConcatChannelsForward(const CpuContext& ctx, int64_t pixels,
                           absl::Span<const float* const> inputs,
                           absl::Span<const int64_t> channels, float* y) {
  CHECK_EQ(inputs.size(), channels.size());
  CHECK(!inputs.empty());
  const int64_t total = TotalChannels(channels);
  ctx.ParallelFor(pixels, std::max<int64_t>(1, kElementGrain / total),
                  [&](int64_t begin, int64_t end) {
                    int64_t offset = 0;
                    for (size_t i = 0; i < inputs.size(); ++i) {
                      ForEachRowCol(begin, end, channels[i],
                                    functor::CopyColumns{inputs[i], channels[i],
                                                         0, y, total, offset});
                      offset += channels[i];
                    }
                  });
}

void ConcatChannelsBackward(const CpuContext& ctx, int64_t pixels,
                            const float* dy, absl::Span<const int64_t> channels,
                            absl::Span<float* const> dinputs) {
  CHECK_EQ(dinputs.size(), channels.size());
  const int64_t total = TotalChannels(channels);
  ctx.ParallelFor(pixels, std::max<int64_t>(1, kElementGrain / total),
                  [&](int64_t begin, int64_t end) {
                    int64_t offset = 0;
                    for (size_t i = 0; i < dinputs.size(); ++i) {
                      if (dinputs[i] != nullptr) {
                        ForEachRowCol(
                            begin, end, channels[i],
                            functor::CopyColumns{dy, total, offset, dinputs[i],
                                                 channels[i], 0});
                      }
                      offset += channels[i];
                    }
                  });
}

void DropoutForward(const CpuContext& ctx, const float* x, int64_t n,
                    float keep_prob, uint64_t seed, float* y, const DropoutNoise& noise) {
  CHECK(keep_prob > 0.0f && keep_prob <= 1.0f)
      << "keep_prob " << keep_prob << " is outside (0, 1]";
  const functor::Dropout f{x, keep_prob, seed, noise, y};
  ctx.ParallelFor(n, kElementGrain, [&](int64_t begin, int64_t end) {
    ForEachIndex(begin, end, f);
  });
}

void DropoutBackward(const CpuContext& ctx, const float* dy, int64_t n,
                     float keep_prob, uint64_t seed, float* dx, const DropoutNoise& noise) {
  // The forward is linear in x with a fixed mask: its own adjoint.
  DropoutForward(ctx, dy, n, keep_prob, seed, dx, noise);
}

float L2LossForward(const CpuContext& ctx, const float* x, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += double(x[i]) * x[i];
  return static_cast<float>(sum / 2);
}

void L2LossBackward(const CpuContext& ctx, const float* x, int64_t n,
                    float dloss, float* dx) {
  const functor::L2LossGrad f{x, dloss, dx};
  ctx.ParallelFor(n, kElementGrain, [&](int64_t begin, int64_t end) {
    ForEachIndex(begin, end, f);
  });
}

}  // namespace kernels
}  // namespace psrt
