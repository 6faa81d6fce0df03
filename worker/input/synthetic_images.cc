#include "worker/input/synthetic_images.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/input/image_preprocess.h"

namespace psrt {
namespace {

// HSV (h in [0, 1), s, v in [0, 1]) to RGB bytes.
void HsvToRgb(double h, double s, double v, uint8_t rgb[3]) {
  const double c = v * s;
  const double hp = h * 6;
  const double x = c * (1 - std::fabs(std::fmod(hp, 2.0) - 1));
  double r = 0, g = 0, b = 0;
  switch (static_cast<int>(hp) % 6) {
    case 0: r = c, g = x; break;
    case 1: r = x, g = c; break;
    case 2: g = c, b = x; break;
    case 3: g = x, b = c; break;
    case 4: r = x, b = c; break;
    default: r = c, b = x; break;
  }
  const double m = v - c;
  rgb[0] = static_cast<uint8_t>(std::lround(255 * (r + m)));
  rgb[1] = static_cast<uint8_t>(std::lround(255 * (g + m)));
  rgb[2] = static_cast<uint8_t>(std::lround(255 * (b + m)));
}

absl::Status WriteFile(const std::string& path, const std::string& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return absl::InternalError(absl::StrCat("cannot write ", path));
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  if (std::fclose(f) != 0 || !ok) {
    return absl::InternalError(absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

}  // namespace

Image SyntheticImage(int label, int num_classes, int height, int width, uint64_t seed) {
  CHECK(label >= 0 && label < num_classes && height > 0 && width > 0);
  ExampleRng rng(seed, label, 0);
  const double hue = static_cast<double>(label) / num_classes;
  uint8_t base[3], bright[3], dark[3];
  HsvToRgb(hue, 0.5 + 0.4 * rng.Uniform(), 0.4 + 0.4 * rng.Uniform(), base);
  HsvToRgb(hue, 0.4, 1.0, bright);
  HsvToRgb(hue, 0.9, 0.3, dark);
  const int period = 4 + 2 * (label % 4);  // Stripes: 4, 6, 8 or 10 pixels.
  const bool vertical = (label / 4) % 2 == 1;
  const int radius = std::max(2, static_cast<int>(std::min(height, width) * (0.15 + 0.1 * rng.Uniform())));
  const int cy = static_cast<int>(rng.UniformInt(height));
  const int cx = static_cast<int>(rng.UniformInt(width));
  const int phase = static_cast<int>(rng.UniformInt(period));
  Image image;
  image.height = height;
  image.width = width;
  image.channels = 3;
  image.pixels.resize(size_t{3} * height * width);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const int dy = y - cy, dx = x - cx;
      const bool shape = label % 2 == 0 ? dy * dy + dx * dx <= radius * radius
                                        : std::abs(dy) <= radius && std::abs(dx) <= radius;
      const bool stripe = (((vertical ? x : y) + phase) % period) < period / 2;
      const uint8_t* color = shape ? bright : (stripe ? dark : base);
      for (int c = 0; c < 3; ++c) {
        const int noise = static_cast<int>(rng.UniformInt(81)) - 40;
        image.pixels[(size_t{1} * y * width + x) * 3 + c] =
            static_cast<uint8_t>(std::clamp(color[c] + noise, 0, 255));
      }
    }
  }
  return image;
}

absl::Status WriteSyntheticImageFolder(const std::string& dir,
                                       const SyntheticFolderOptions& options) {
  namespace fs = std::filesystem;
  int64_t n = 0;
  for (int k = 0; k < options.num_classes; ++k) {
    const std::string class_dir = absl::StrFormat("%s/class_%02d", dir, k);
    std::error_code error;
    fs::create_directories(class_dir, error);
    if (error) {
      return absl::InternalError(absl::StrCat("cannot create ", class_dir, ": ", error.message()));
    }
    for (int i = 0; i < options.per_class; ++i, ++n) {
      const Image image = SyntheticImage(k, options.num_classes, options.height, options.width,
                                         options.seed * 1000003 + n);
      const bool png = options.png_every > 0 && n % options.png_every == options.png_every - 1;
      std::string bytes;
      if (png) {
        ASSIGN_OR_RETURN(bytes, EncodePng(image));
      } else {
        ASSIGN_OR_RETURN(bytes, EncodeJpeg(image, options.quality));
      }
      RETURN_IF_ERROR(WriteFile(
          absl::StrFormat("%s/img_%05d.%s", class_dir, i, png ? "png" : "jpg"), bytes));
    }
  }
  return absl::OkStatus();
}

}  // namespace psrt
