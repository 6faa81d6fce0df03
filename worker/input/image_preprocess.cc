#include "worker/input/image_preprocess.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "glog/logging.h"

namespace psrt {
namespace {

uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The source coordinates of one output axis: sample i reads lo[i] and
// hi[i] with weight frac[i] on hi.
struct Axis {
  std::vector<int> lo, hi;
  std::vector<float> frac;
};

void MakeAxis(int begin, int in_size, int out_size, Axis* axis) {
  axis->lo.resize(out_size);
  axis->hi.resize(out_size);
  axis->frac.resize(out_size);
  const double scale = static_cast<double>(in_size) / out_size;
  for (int i = 0; i < out_size; ++i) {
    const double in = std::clamp((i + 0.5) * scale - 0.5, 0.0, in_size - 1.0);
    const int lo = static_cast<int>(std::floor(in));
    axis->lo[i] = begin + lo;
    axis->hi[i] = begin + std::min(lo + 1, in_size - 1);
    axis->frac[i] = static_cast<float>(in - lo);
  }
}

}  // namespace

ExampleRng::ExampleRng(uint64_t seed, int64_t epoch, int64_t example)
    : state_(Mix(Mix(Mix(seed) ^ static_cast<uint64_t>(epoch)) ^
                 static_cast<uint64_t>(example))) {}

uint64_t ExampleRng::Next() {
  state_ += 0x9e3779b97f4a7c15ULL;
  return Mix(state_);
}

double ExampleRng::Uniform() { return (Next() >> 11) * 0x1.0p-53; }

int64_t ExampleRng::UniformInt(int64_t n) {
  return static_cast<int64_t>(Next() % static_cast<uint64_t>(n));
}

CropBox SampleDistortedCrop(int height, int width, const DistortedCropOptions& options,
                            ExampleRng* rng) {
  const double area = static_cast<double>(height) * width;
  for (int attempt = 0; attempt < options.max_attempts; ++attempt) {
    const double target =
        area * (options.min_area + (options.max_area - options.min_area) * rng->Uniform());
    const double aspect =
        options.min_aspect + (options.max_aspect - options.min_aspect) * rng->Uniform();
    const int h = static_cast<int>(std::lround(std::sqrt(target / aspect)));
    const int w = static_cast<int>(std::lround(std::sqrt(target * aspect)));
    if (h < 1 || w < 1 || h > height || w > width) continue;
    CropBox box;
    box.height = h;
    box.width = w;
    box.y = static_cast<int>(rng->UniformInt(height - h + 1));
    box.x = static_cast<int>(rng->UniformInt(width - w + 1));
    return box;
  }
  return CropBox{0, 0, height, width};
}

CropBox CentralCrop(int height, int width, double fraction) {
  CropBox box;
  // As tf.image.central_crop: start = int((size - size * fraction) / 2).
  box.y = static_cast<int>((height - height * fraction) / 2);
  box.x = static_cast<int>((width - width * fraction) / 2);
  box.height = std::max(1, height - 2 * box.y);
  box.width = std::max(1, width - 2 * box.x);
  return box;
}

void CropResizeFlip(const Image& image, const CropBox& box, int out_height, int out_width,
                    bool flip, float* out, float pixel_max) {
  CHECK(box.y >= 0 && box.x >= 0 && box.height > 0 && box.width > 0 &&
        box.y + box.height <= image.height && box.x + box.width <= image.width)
      << "crop box outside the image";
  thread_local Axis rows, cols;
  MakeAxis(box.y, box.height, out_height, &rows);
  MakeAxis(box.x, box.width, out_width, &cols);
  const int c = image.channels;
  const size_t stride = size_t{1} * image.width * c;
  const float scale = pixel_max / 255;
  for (int y = 0; y < out_height; ++y) {
    const uint8_t* top = image.pixels.data() + rows.lo[y] * stride;
    const uint8_t* bottom = image.pixels.data() + rows.hi[y] * stride;
    const float fy = rows.frac[y];
    float* row_out = out + size_t{1} * y * out_width * c;
    for (int x = 0; x < out_width; ++x) {
      const int ox = flip ? out_width - 1 - x : x;
      const size_t left = size_t{1} * cols.lo[x] * c;
      const size_t right = size_t{1} * cols.hi[x] * c;
      const float fx = cols.frac[x];
      for (int k = 0; k < c; ++k) {
        const float t = top[left + k] + (top[right + k] - top[left + k]) * fx;
        const float b = bottom[left + k] + (bottom[right + k] - bottom[left + k]) * fx;
        row_out[size_t{1} * ox * c + k] = (t + (b - t) * fy) * scale;
      }
    }
  }
}

}  // namespace psrt
