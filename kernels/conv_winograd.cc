#include "kernels/conv_winograd.h"

#include <algorithm>
#include <type_traits>

#include "kernels/conv_direct.h"
#include "kernels/conv_winograd_methods.h"

namespace psrt {
namespace kernels {
namespace internal {
namespace {

// Tiles that one round of GEMMs takes (whole images, at least one): GEMMs of
// about this many rows run near the path's speed. (On LeNet's second layer,
// a Zen 3 with 512 KiB of L2, rounds of 32 to 96 tiles ran within 5% of
// each other; 16 and 192 took up to 17% longer on the filter gradient.)
constexpr int64_t kRoundTiles = 96;
// Floats between one point's transformed tiles and the next's, past the
// tiles themselves (one cache line). A tile's transform touches all of its
// points at once; unpadded, with 16 tiles an image and 32 or 64
// channels, the points lay a multiple of 4 KiB apart, in one set of the L1
// cache, and evicted each other: the pad made LeNet's second layer 1.5x
// faster on a Zen 3.
constexpr int64_t kPointPad = 16;
// The method runs a convolution whose direct multiply-adds are at least this
// many times its own at the points (whole tiles); a 3x3 filter on a 2x2
// image, one tile of 36 points for 36 direct products, keeps the direct
// method.
constexpr int64_t kMinSaving = 2;
// The most scratch memory a thread takes (16 MiB): WinogradConvApplies.
constexpr int64_t kMaxScratchFloats = int64_t{1} << 22;

// The transforms as straight-line code on lanes of channels: T is a vector
// of floats (8, one register on the kernels' -march; 16 where the AVX-512
// GEMM path runs, compiled for it) or, for the channels past the last whole
// vector, one float.
#define PSRT_LAMBDA_INLINE __attribute__((always_inline))
typedef float Lanes8 __attribute__((vector_size(8 * sizeof(float))));
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PSRT_WINOGRAD_AVX512 1
#define PSRT_AVX512_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))
typedef float Lanes16 __attribute__((vector_size(16 * sizeof(float))));
#else
#define PSRT_WINOGRAD_AVX512 0
#endif

// Loads and stores of lanes at any float address. (Through pointers, not by
// value: a 16-float vector returned from a function compiled without
// AVX-512 would take another ABI.) The vectors go through may_alias types of
// float alignment, which GCC moves whole (one vmovups); std::memcpy of the
// vector type became a loop of 16-byte halves through the stack, whose
// 32-byte reloads waited on store forwarding (LeNet's second layer took
// 12-17% longer so on a Zen 3).
typedef float UnalignedLanes8
    __attribute__((vector_size(8 * sizeof(float)), aligned(4), may_alias));
PSRT_ALWAYS_INLINE void Load(const float* p, Lanes8* v) {
  *v = *reinterpret_cast<const UnalignedLanes8*>(p);
}
PSRT_ALWAYS_INLINE void Store(float* p, const Lanes8& v) {
  *reinterpret_cast<UnalignedLanes8*>(p) = v;
}
#if PSRT_WINOGRAD_AVX512
typedef float UnalignedLanes16
    __attribute__((vector_size(16 * sizeof(float)), aligned(4), may_alias));
PSRT_ALWAYS_INLINE void Load(const float* p, Lanes16* v) {
  *v = *reinterpret_cast<const UnalignedLanes16*>(p);
}
PSRT_ALWAYS_INLINE void Store(float* p, const Lanes16& v) {
  *reinterpret_cast<UnalignedLanes16*>(p) = v;
}
#endif
PSRT_ALWAYS_INLINE void Load(const float* p, float* v) { *v = *p; }
PSRT_ALWAYS_INLINE void Store(float* p, const float& v) { *p = v; }

// Runs fn(V*, c) for every channel c that starts a whole vector V, then
// fn(float*, c) for each channel left over (the pointer only names the
// type).
template <class V, class Fn>
PSRT_ALWAYS_INLINE void ForEachLane(int64_t channels, Fn&& fn) {
  constexpr int64_t kWidth = sizeof(V) / sizeof(float);
  int64_t c = 0;
  for (; c + kWidth <= channels; c += kWidth) fn(static_cast<V*>(nullptr), c);
  for (; c < channels; ++c) fn(static_cast<float*>(nullptr), c);
}

// A small constant matrix, read as stored or transposed.
struct Matrix {
  const float* data;
  int rows;
  int cols;
  int row_step;
  int col_step;
  float at(int i, int j) const { return data[i * row_step + j * col_step]; }
  Matrix Transposed() const { return {data, cols, rows, col_step, row_step}; }
};
template <int kRows, int kCols>
Matrix Of(const float (&m)[kRows][kCols]) {
  return {&m[0][0], kRows, kCols, kCols, 1};
}

// dst row i (`width` floats at dst + i * dst_step) = sum over j of
// mat(i, j) * src row j (at src + j * src_step), for every row of mat: the
// filter's transforms, along one axis of the filter, the rows' floats
// running over the channel pairs.
void Combine(const Matrix& mat, const float* src, int64_t src_step,
             int64_t width, float* dst, int64_t dst_step) {
  for (int i = 0; i < mat.rows; ++i) {
    float* __restrict out = dst + i * dst_step;
    std::fill_n(out, width, 0.0f);
    for (int j = 0; j < mat.cols; ++j) {
      const float w = mat.at(i, j);
      const float* __restrict in = src + j * src_step;
      if (w != 0.0f) {
        for (int64_t k = 0; k < width; ++k) out[k] += w * in[k];
      }
    }
  }
}

// The tiling of one convolution (as ConvGeometry, stride 1, a square
// filter): 4x4 output tiles, each read from an alpha x alpha tile of the
// padded input (alpha = 4 + filter side - 1), in rounds of whole images.
struct Tiling {
  ConvGeometry g;
  int64_t tiles_h, tiles_w;
  int64_t round_images;  // Images per round.
  int64_t points;        // alpha * alpha.

  Tiling(const ConvGeometry& geometry, int64_t images)
      : g(geometry),
        tiles_h((geometry.out_h + kWinogradTile - 1) / kWinogradTile),
        tiles_w((geometry.out_w + kWinogradTile - 1) / kWinogradTile),
        round_images(
            std::max<int64_t>(1, std::min(kRoundTiles / tiles(), images))),
        points((kWinogradTile + geometry.fh - 1) *
               (kWinogradTile + geometry.fh - 1)) {}

  int64_t tiles() const { return tiles_h * tiles_w; }  // Per image.
  int64_t round_tiles() const { return round_images * tiles(); }
  // The padded input: every tile's alpha x alpha inside, zeros around the
  // image.
  int64_t padded_h() const { return tiles_h * kWinogradTile + g.fh - 1; }
  int64_t padded_w() const { return tiles_w * kWinogradTile + g.fw - 1; }
  int64_t padded_size() const { return padded_h() * padded_w() * g.in_c; }
  // Transformed tiles of a round, [points, round_tiles, channels], point xi
  // at xi * point_step(channels).
  int64_t point_step(int64_t channels) const {
    return round_tiles() * channels + kPointPad;
  }
  int64_t points_size(int64_t channels) const {
    return points * point_step(channels);
  }
};

// Thread scratch: the padded input, the input's transformed tiles, and the
// products at the points (or dy's transformed tiles).
struct Scratch {
  float* padded;
  float* input_points;
  float* output_points;
};
int64_t ScratchFloats(const Tiling& t) {
  return t.padded_size() + t.points_size(t.g.in_c) + t.points_size(t.g.out_c);
}
Scratch CarveScratch(const Tiling& t, float* scratch) {
  Scratch s;
  s.padded = scratch;
  s.input_points = s.padded + t.padded_size();
  s.output_points = s.input_points + t.points_size(t.g.in_c);
  return s;
}

// Runs fn(tile, rows, cols, top, left) for each 4x4 output tile of an
// image: tile its number (row-major), rows and cols how many of its output
// rows and columns lie inside the image (1 to 4), (top, left) its first
// output pixel.
template <class Fn>
PSRT_ALWAYS_INLINE void ForEachTile(const Tiling& t, Fn&& fn) {
  for (int64_t th = 0; th < t.tiles_h; ++th) {
    const int64_t top = th * kWinogradTile;
    const int64_t rows = std::min<int64_t>(kWinogradTile, t.g.out_h - top);
    for (int64_t tw = 0; tw < t.tiles_w; ++tw) {
      const int64_t left = tw * kWinogradTile;
      fn(th * t.tiles_w + tw, rows,
         std::min<int64_t>(kWinogradTile, t.g.out_w - left), top, left);
    }
  }
}

// Stores points (i, 0..alpha-1) of a tile's lanes: point (i, j) at
// out + (i * alpha + j) * point_step.
template <class M, class T>
PSRT_ALWAYS_INLINE void StorePointRow(const T row[M::kAlpha], int i,
                                      int64_t point_step, float* out) {
  constexpr int kAlpha = M::kAlpha;
  for (int j = 0; j < kAlpha; ++j) {
    Store(out + (i * kAlpha + j) * point_step, row[j]);
  }
}

// Transforms the tiles of one padded image (B^T d B) into points[xi][first
// + tile] (channels g.in_c).
template <class M, class V>
PSRT_ALWAYS_INLINE void TransformInputTiles(const Tiling& t,
                                            const float* padded,
                                            int64_t first_tile, float* points) {
  constexpr int kAlpha = M::kAlpha;
  const int64_t c = t.g.in_c, row = t.padded_w() * c;
  const int64_t point_step = t.point_step(c);
  ForEachTile(t, [&](int64_t tile, int64_t, int64_t, int64_t top,
                     int64_t left) PSRT_LAMBDA_INLINE {
    const float* d = padded + top * row + left * c;
    float* out = points + (first_tile + tile) * c;
    ForEachLane<V>(c, [&](auto* lanes, int64_t k) PSRT_LAMBDA_INLINE {
      using T = std::remove_pointer_t<decltype(lanes)>;
      T cols[kAlpha][kAlpha];  // [x][i]: column x's points i.
      for (int x = 0; x < kAlpha; ++x) {
        T column[kAlpha];
        for (int y = 0; y < kAlpha; ++y) {
          Load(d + y * row + x * c + k, &column[y]);
        }
        M::InputTransform1D(column, cols[x]);
      }
      for (int i = 0; i < kAlpha; ++i) {
        T across[kAlpha], result[kAlpha];
        for (int x = 0; x < kAlpha; ++x) across[x] = cols[x][i];
        M::InputTransform1D(across, result);
        StorePointRow<M>(result, i, point_step, out + k);
      }
    });
  });
}

// y of one image from its tiles' products at the points,
// products[xi][first + tile] (channels g.out_c): A^T (products) A, cropped.
template <class M, class V>
PSRT_ALWAYS_INLINE void TransformOutputTiles(const Tiling& t,
                                             const float* products,
                                             int64_t first_tile, float* y) {
  constexpr int kAlpha = M::kAlpha;
  const int64_t o = t.g.out_c, point_step = t.point_step(o);
  ForEachTile(t, [&](int64_t tile, int64_t rows, int64_t cols, int64_t top,
                     int64_t left) PSRT_LAMBDA_INLINE {
    const float* p = products + (first_tile + tile) * o;
    float* corner = y + (top * t.g.out_w + left) * o;
    ForEachLane<V>(o, [&](auto* lanes, int64_t k) PSRT_LAMBDA_INLINE {
      using T = std::remove_pointer_t<decltype(lanes)>;
      T half[kAlpha][kWinogradTile];  // [i][x]: point row i, output column x.
      for (int i = 0; i < kAlpha; ++i) {
        T points_i[kAlpha];
        for (int j = 0; j < kAlpha; ++j) {
          Load(p + (i * kAlpha + j) * point_step + k, &points_i[j]);
        }
        M::OutputTransform1D(points_i, half[i]);
      }
      for (int64_t x = 0; x < cols; ++x) {
        T down[kAlpha], out[kWinogradTile];
        for (int i = 0; i < kAlpha; ++i) down[i] = half[i][x];
        M::OutputTransform1D(down, out);
        for (int64_t yy = 0; yy < rows; ++yy) {
          Store(corner + (yy * t.g.out_w + x) * o + k, out[yy]);
        }
      }
    });
  });
}

// Transforms one image's dy tiles (A dy A^T, zero past the edges) into
// points[xi][first + tile] (channels g.out_c).
template <class M, class V>
PSRT_ALWAYS_INLINE void TransformGradientTiles(const Tiling& t, const float* dy,
                                               int64_t first_tile,
                                               float* points) {
  constexpr int kAlpha = M::kAlpha;
  const int64_t o = t.g.out_c, point_step = t.point_step(o);
  ForEachTile(t, [&](int64_t tile, int64_t rows, int64_t cols, int64_t top,
                     int64_t left) PSRT_LAMBDA_INLINE {
    const float* corner = dy + (top * t.g.out_w + left) * o;
    float* out = points + (first_tile + tile) * o;
    ForEachLane<V>(o, [&](auto* lanes, int64_t k) PSRT_LAMBDA_INLINE {
      using T = std::remove_pointer_t<decltype(lanes)>;
      T half[kAlpha][kWinogradTile];  // [i][x]: point row i, dy column x.
      for (int x = 0; x < kWinogradTile; ++x) {
        T column[kWinogradTile];
        for (int yy = 0; yy < kWinogradTile; ++yy) {
          if (yy < rows && x < cols) {
            Load(corner + (yy * t.g.out_w + x) * o + k, &column[yy]);
          } else {
            column[yy] = T{};
          }
        }
        T points_x[kAlpha];
        M::GradientTransform1D(column, points_x);
        for (int i = 0; i < kAlpha; ++i) half[i][x] = points_x[i];
      }
      for (int i = 0; i < kAlpha; ++i) {
        T result[kAlpha];
        M::GradientTransform1D(half[i], result);
        StorePointRow<M>(result, i, point_step, out + k);
      }
    });
  });
}

// Pads images [n0, n0 + images) of x one by one into s.padded (whose
// border the caller zeroed) and transforms their tiles into s.input_points,
// as one round.
template <class M, class V>
PSRT_ALWAYS_INLINE void TransformRoundInputs(const Tiling& t, const float* x,
                                             int64_t n0, int64_t images,
                                             const Scratch& s) {
  for (int64_t i = 0; i < images; ++i) {
    PadImage(t.g, x + (n0 + i) * t.g.in_image(), t.padded_h(), t.padded_w(),
             s.padded);
    TransformInputTiles<M, V>(t, s.padded, i * t.tiles(), s.input_points);
  }
}

// The forward of images [begin, end) of `x` (images of g.in_image() floats)
// into `y`, by the transformed filter, its transforms on vectors V.
template <class M, class V>
PSRT_ALWAYS_INLINE void ForwardWith(GemmPath path, const ConvGeometry& g,
                                    const float* x, const float* filter_points,
                                    int64_t begin, int64_t end, float* scratch,
                                    float* y) {
  const Tiling t(g, end - begin);
  const Scratch s = CarveScratch(t, scratch);
  std::fill_n(s.padded, t.padded_size(), 0.0f);
  for (int64_t n0 = begin; n0 < end; n0 += t.round_images) {
    const int64_t images = std::min(t.round_images, end - n0);
    TransformRoundInputs<M, V>(t, x, n0, images, s);
    const int64_t rows = images * t.tiles();
    for (int xi = 0; xi < t.points; ++xi) {
      const GemmTerm term{s.input_points + xi * t.point_step(g.in_c),
                          filter_points + xi * g.in_c * g.out_c, g.in_c};
      BatchReduceGemmOnPath(
          path, BatchReduceGemm{rows, g.out_c, false, false, &term, 1, g.in_c,
                                g.out_c, 1.0f, 0.0f,
                                s.output_points + xi * t.point_step(g.out_c),
                                g.out_c});
    }
    for (int64_t i = 0; i < images; ++i) {
      TransformOutputTiles<M, V>(t, s.output_points, i * t.tiles(),
                                 y + (n0 + i) * g.out_image());
    }
  }
}

// Adds the filter gradient of images [begin, end) at the points into
// dfilter_points [points, in, out], its transforms on vectors V.
template <class M, class V>
PSRT_ALWAYS_INLINE void AddFilterGradientPointsWith(
    GemmPath path, const ConvGeometry& g, const float* x, const float* dy,
    int64_t begin, int64_t end, float* scratch, float* dfilter_points) {
  const Tiling t(g, end - begin);
  const Scratch s = CarveScratch(t, scratch);
  std::fill_n(s.padded, t.padded_size(), 0.0f);
  for (int64_t n0 = begin; n0 < end; n0 += t.round_images) {
    const int64_t images = std::min(t.round_images, end - n0);
    TransformRoundInputs<M, V>(t, x, n0, images, s);
    for (int64_t i = 0; i < images; ++i) {
      TransformGradientTiles<M, V>(t, dy + (n0 + i) * g.out_image(),
                                   i * t.tiles(), s.output_points);
    }
    const int64_t depth = images * t.tiles();
    for (int xi = 0; xi < t.points; ++xi) {
      // [in, tiles] x [tiles, out]: the input's points stored [tiles, in].
      const GemmTerm term{s.input_points + xi * t.point_step(g.in_c),
                          s.output_points + xi * t.point_step(g.out_c), depth};
      BatchReduceGemmOnPath(
          path,
          BatchReduceGemm{g.in_c, g.out_c, true, false, &term, 1, g.in_c,
                          g.out_c, 1.0f, 1.0f,
                          dfilter_points + xi * g.in_c * g.out_c, g.out_c});
    }
  }
}

#if PSRT_WINOGRAD_AVX512
template <class M>
PSRT_AVX512_TARGET void ForwardAvx512(GemmPath path, const ConvGeometry& g,
                                      const float* x,
                                      const float* filter_points, int64_t begin,
                                      int64_t end, float* scratch, float* y) {
  ForwardWith<M, Lanes16>(path, g, x, filter_points, begin, end, scratch, y);
}
template <class M>
PSRT_AVX512_TARGET void AddFilterGradientPointsAvx512(
    GemmPath path, const ConvGeometry& g, const float* x, const float* dy,
    int64_t begin, int64_t end, float* scratch, float* dfilter_points) {
  AddFilterGradientPointsWith<M, Lanes16>(path, g, x, dy, begin, end, scratch,
                                          dfilter_points);
}
#endif

// The above with 16 lanes on the AVX-512 path (whose CPUs run them), 8 on
// the others.
template <class M>
void ForwardOf(GemmPath path, const ConvGeometry& g, const float* x,
               const float* filter_points, int64_t begin, int64_t end,
               float* scratch, float* y) {
#if PSRT_WINOGRAD_AVX512
  if (path == GemmPath::kAvx512) {
    ForwardAvx512<M>(path, g, x, filter_points, begin, end, scratch, y);
    return;
  }
#endif
  ForwardWith<M, Lanes8>(path, g, x, filter_points, begin, end, scratch, y);
}
template <class M>
void AddFilterGradientPointsOf(GemmPath path, const ConvGeometry& g,
                               const float* x, const float* dy, int64_t begin,
                               int64_t end, float* scratch,
                               float* dfilter_points) {
#if PSRT_WINOGRAD_AVX512
  if (path == GemmPath::kAvx512) {
    AddFilterGradientPointsAvx512<M>(path, g, x, dy, begin, end, scratch,
                                     dfilter_points);
    return;
  }
#endif
  AddFilterGradientPointsWith<M, Lanes8>(path, g, x, dy, begin, end, scratch,
                                         dfilter_points);
}

// The method of g's filter side (3 or 5).
void Forward(GemmPath path, const ConvGeometry& g, const float* x,
             const float* filter_points, int64_t begin, int64_t end,
             float* scratch, float* y) {
  if (g.fh == F4x4By3x3::kFilter) {
    ForwardOf<F4x4By3x3>(path, g, x, filter_points, begin, end, scratch, y);
  } else {
    ForwardOf<F4x4By5x5>(path, g, x, filter_points, begin, end, scratch, y);
  }
}
void AddFilterGradientPoints(GemmPath path, const ConvGeometry& g,
                             const float* x, const float* dy, int64_t begin,
                             int64_t end, float* scratch,
                             float* dfilter_points) {
  if (g.fh == F4x4By3x3::kFilter) {
    AddFilterGradientPointsOf<F4x4By3x3>(path, g, x, dy, begin, end, scratch,
                                         dfilter_points);
  } else {
    AddFilterGradientPointsOf<F4x4By5x5>(path, g, x, dy, begin, end, scratch,
                                         dfilter_points);
  }
}

// G of the method for s's filter, and the sides of the filter and of its
// transform (alpha).
struct FilterTransform {
  Matrix g;
  int filter;
  int alpha;
};
FilterTransform FilterTransformOf(const Conv2DShape& s) {
  if (s.filter_height == F4x4By3x3::kFilter) {
    return {Of(F4x4By3x3::kFilterTransform), F4x4By3x3::kFilter,
            F4x4By3x3::kAlpha};
  }
  return {Of(F4x4By5x5::kFilterTransform), F4x4By5x5::kFilter,
          F4x4By5x5::kAlpha};
}

}  // namespace

bool WinogradConvApplies(GemmPath path, const Conv2DShape& s) {
  if (path == GemmPath::kPortable || s.stride_height != 1 ||
      s.stride_width != 1 || s.filter_height != s.filter_width ||
      (s.filter_height != F4x4By3x3::kFilter &&
       s.filter_height != F4x4By5x5::kFilter) ||
      s.in_channels < 16 || s.out_channels < 16) {
    return false;
  }
  const Tiling t(ForwardGeometry(s), 1);
  const int64_t direct =
      s.out_height() * s.out_width() * s.filter_height * s.filter_width;
  if (direct < kMinSaving * t.tiles() * t.points) return false;
  // Rounds take whole images: the transformed tiles of a large image (a
  // 5x5 layer at 224x224) would leave the caches, and take hundreds of MiB
  // per thread, so the direct method keeps those.
  Conv2DShape one_image = s;
  one_image.batch = 1;
  return WinogradBackwardScratch(one_image) <= kMaxScratchFloats;
}

int64_t WinogradFilterFloats(const Conv2DShape& s) {
  const FilterTransform f = FilterTransformOf(s);
  return f.alpha * f.alpha * s.in_channels * s.out_channels;
}

int64_t WinogradFilterScratch(const Conv2DShape& s) {
  const FilterTransform f = FilterTransformOf(s);
  return f.alpha * f.filter * s.in_channels * s.out_channels;
}

void WinogradTransformFilter(const Conv2DShape& s, const float* filter,
                             float* scratch, float* points) {
  const int64_t pairs = s.in_channels * s.out_channels;
  const FilterTransform f = FilterTransformOf(s);
  // scratch[i] = sum_a G(i, a) filter row a: `filter` taps of `pairs` floats.
  Combine(f.g, filter, f.filter * pairs, f.filter * pairs, scratch,
          f.filter * pairs);
  for (int i = 0; i < f.alpha; ++i) {
    Combine(f.g, scratch + i * f.filter * pairs, pairs, pairs,
            points + i * f.alpha * pairs, pairs);
  }
}

int64_t WinogradForwardScratch(const Conv2DShape& s) {
  return ScratchFloats(Tiling(ForwardGeometry(s), s.batch));
}

int64_t WinogradBackwardScratch(const Conv2DShape& s) {
  return std::max(ScratchFloats(Tiling(DxGeometry(s), s.batch)),
                  ScratchFloats(Tiling(ForwardGeometry(s), s.batch)));
}

void WinogradConvForward(GemmPath path, const Conv2DShape& s, const float* x,
                         const float* filter_points, int64_t begin, int64_t end,
                         float* scratch, float* y) {
  Forward(path, ForwardGeometry(s), x, filter_points, begin, end, scratch, y);
}

void WinogradConvBackward(GemmPath path, const Conv2DShape& s, const float* x,
                          const float* flipped_points, const float* dy,
                          int64_t begin, int64_t end, float* scratch, float* dx,
                          float* dfilter_points) {
  if (dx != nullptr) {
    Forward(path, DxGeometry(s), dy, flipped_points, begin, end, scratch, dx);
  }
  if (dfilter_points != nullptr) {
    AddFilterGradientPoints(path, ForwardGeometry(s), x, dy, begin, end,
                            scratch, dfilter_points);
  }
}

void WinogradFilterGradient(const Conv2DShape& s, const float* dfilter_points,
                            float* scratch, float* dfilter) {
  const int64_t pairs = s.in_channels * s.out_channels;
  const FilterTransform f = FilterTransformOf(s);
  const Matrix gt = f.g.Transposed();
  // scratch[a] = sum_i G(i, a) points row i: alpha points of `pairs` floats.
  Combine(gt, dfilter_points, f.alpha * pairs, f.alpha * pairs, scratch,
          f.alpha * pairs);
  for (int a = 0; a < f.filter; ++a) {
    Combine(gt, scratch + a * f.alpha * pairs, pairs, pairs,
            dfilter + a * f.filter * pairs, pairs);
  }
}

}  // namespace internal
}  // namespace kernels
}  // namespace psrt
