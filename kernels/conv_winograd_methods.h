// The two Winograd methods that conv_winograd.cc runs, as the matrices of
// Lavin & Gray's "Fast Algorithms for Convolutional Neural Networks" (2016):
// y tile = A^T [ (G g G^T) (.) (B^T d B) ] A, for 4x4 output tiles. Each
// method gives B^T, A^T and A (the adjoint of A^T, for dy in the filter
// gradient) as straight-line 1D transforms over T, a float or a GCC vector
// of floats (lanes of channels), and G as a table for the filter's
// transform, done once per batch. Internal to kernels/.
//
// Thread safety: constants and pure functions.
#ifndef PSRT_KERNELS_CONV_WINOGRAD_METHODS_H_
#define PSRT_KERNELS_CONV_WINOGRAD_METHODS_H_

#define PSRT_ALWAYS_INLINE inline __attribute__((always_inline))

namespace psrt {
namespace kernels {
namespace internal {

constexpr int kWinogradTile = 4;  // Output tile side.

// Winograd's F(4x4, 5x5): points 0, 1, -1, 2, -2, 1/2, -1/2 and infinity.
struct F4x4By5x5 {
  static constexpr int kFilter = 5;
  // The input tile's side.
  static constexpr int kAlpha = kWinogradTile + kFilter - 1;

  // B^T d: an input row or column of 8 -> 8 points.
  template <class T>
  static PSRT_ALWAYS_INLINE void InputTransform1D(const T d[kAlpha],
                                                  T out[kAlpha]) {
    out[0] = (d[6] - d[0]) + 5.25f * (d[2] - d[4]);
    out[7] = (d[7] - d[1]) + 5.25f * (d[3] - d[5]);
    const T odd1 = (d[1] + d[5]) - 4.25f * d[3];
    const T even1 = (d[2] + d[6]) - 4.25f * d[4];
    out[1] = even1 + odd1;
    out[2] = even1 - odd1;
    const T odd2 = 0.5f * d[1] - 2.5f * d[3] + 2 * d[5];
    const T even2 = 0.25f * d[2] - 1.25f * d[4] + d[6];
    out[3] = even2 + odd2;
    out[4] = even2 - odd2;
    const T odd3 = 2 * d[1] - 2.5f * d[3] + 0.5f * d[5];
    const T even3 = 4 * d[2] - 5 * d[4] + d[6];
    out[5] = even3 + odd3;
    out[6] = even3 - odd3;
  }

  // A^T p: 8 points -> an output row or column of 4.
  template <class T>
  static PSRT_ALWAYS_INLINE void OutputTransform1D(const T p[kAlpha],
                                                   T out[kWinogradTile]) {
    const T sum1 = p[1] + p[2], diff1 = p[1] - p[2];
    const T sum2 = p[3] + p[4], diff2 = p[3] - p[4];
    const T sum3 = p[5] + p[6], diff3 = p[5] - p[6];
    out[0] = p[0] + sum1 + sum2 + sum3;
    out[1] = diff1 + 2 * diff2 + 0.5f * diff3;
    out[2] = sum1 + 4 * sum2 + 0.25f * sum3;
    out[3] = diff1 + 8 * diff2 + 0.125f * diff3 + p[7];
  }

  // A g, the adjoint of OutputTransform1D: an output row or column of 4
  // (of dy) -> 8 points.
  template <class T>
  static PSRT_ALWAYS_INLINE void GradientTransform1D(const T g[kWinogradTile],
                                                     T out[kAlpha]) {
    const T even1 = g[0] + g[2], odd1 = g[1] + g[3];
    const T even2 = g[0] + 4 * g[2], odd2 = 2 * g[1] + 8 * g[3];
    const T even3 = g[0] + 0.25f * g[2], odd3 = 0.5f * g[1] + 0.125f * g[3];
    out[0] = g[0];
    out[1] = even1 + odd1;
    out[2] = even1 - odd1;
    out[3] = even2 + odd2;
    out[4] = even2 - odd2;
    out[5] = even3 + odd3;
    out[6] = even3 - odd3;
    out[7] = g[3];
  }

  // G: filter taps (5) -> points (8), for the filter's transform and (as
  // G^T) its gradient's, once per batch.
  static constexpr float kFilterTransform[kAlpha][kFilter] = {
      {-1, 0, 0, 0, 0},
      {-2.0f / 9, -2.0f / 9, -2.0f / 9, -2.0f / 9, -2.0f / 9},
      {-2.0f / 9, 2.0f / 9, -2.0f / 9, 2.0f / 9, -2.0f / 9},
      {1.0f / 90, 1.0f / 45, 2.0f / 45, 4.0f / 45, 8.0f / 45},
      {1.0f / 90, -1.0f / 45, 2.0f / 45, -4.0f / 45, 8.0f / 45},
      {32.0f / 45, 16.0f / 45, 8.0f / 45, 4.0f / 45, 2.0f / 45},
      {32.0f / 45, -16.0f / 45, 8.0f / 45, -4.0f / 45, 2.0f / 45},
      {0, 0, 0, 0, 1}};
};

// Winograd's F(4x4, 3x3): points 0, 1, -1, 2, -2 and infinity.
struct F4x4By3x3 {
  static constexpr int kFilter = 3;
  // The input tile's side.
  static constexpr int kAlpha = kWinogradTile + kFilter - 1;

  // B^T d: an input row or column of 6 -> 6 points.
  template <class T>
  static PSRT_ALWAYS_INLINE void InputTransform1D(const T d[kAlpha],
                                                  T out[kAlpha]) {
    out[0] = 4 * d[0] - 5 * d[2] + d[4];
    out[5] = 4 * d[1] - 5 * d[3] + d[5];
    const T odd1 = d[3] - 4 * d[1], even1 = d[4] - 4 * d[2];
    out[1] = even1 + odd1;
    out[2] = even1 - odd1;
    const T odd2 = 2 * (d[3] - d[1]), even2 = d[4] - d[2];
    out[3] = even2 + odd2;
    out[4] = even2 - odd2;
  }

  // A^T p: 6 points -> an output row or column of 4.
  template <class T>
  static PSRT_ALWAYS_INLINE void OutputTransform1D(const T p[kAlpha],
                                                   T out[kWinogradTile]) {
    const T sum1 = p[1] + p[2], diff1 = p[1] - p[2];
    const T sum2 = p[3] + p[4], diff2 = p[3] - p[4];
    out[0] = p[0] + sum1 + sum2;
    out[1] = diff1 + 2 * diff2;
    out[2] = sum1 + 4 * sum2;
    out[3] = diff1 + 8 * diff2 + p[5];
  }

  // A g, the adjoint of OutputTransform1D: an output row or column of 4
  // (of dy) -> 6 points.
  template <class T>
  static PSRT_ALWAYS_INLINE void GradientTransform1D(const T g[kWinogradTile],
                                                     T out[kAlpha]) {
    const T even1 = g[0] + g[2], odd1 = g[1] + g[3];
    const T even2 = g[0] + 4 * g[2], odd2 = 2 * g[1] + 8 * g[3];
    out[0] = g[0];
    out[1] = even1 + odd1;
    out[2] = even1 - odd1;
    out[3] = even2 + odd2;
    out[4] = even2 - odd2;
    out[5] = g[3];
  }

  // G: filter taps (3) -> points (6).
  static constexpr float kFilterTransform[kAlpha][kFilter] = {
      {0.25f, 0, 0},
      {-1.0f / 6, -1.0f / 6, -1.0f / 6},
      {-1.0f / 6, 1.0f / 6, -1.0f / 6},
      {1.0f / 24, 1.0f / 12, 1.0f / 6},
      {1.0f / 24, -1.0f / 12, 1.0f / 6},
      {0, 0, 1}};
};

}  // namespace internal
}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_CONV_WINOGRAD_METHODS_H_
