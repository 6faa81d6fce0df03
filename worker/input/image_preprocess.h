// Image preprocessing for training and evaluation, as TensorFlow's
// Inception preprocessing does it (slim's inception_preprocessing.py),
// without the color distortions:
//
//   training:   a random crop (SampleDistortedCrop: area 5%..100% of the
//               image, aspect ratio 3/4..4/3), resized to the model's size,
//               flipped left-right with probability 1/2;
//   evaluation: the central 87.5% (CentralCrop), resized.
//
// Resizing is bilinear with half-pixel centers (tf.image.resize's default
// since TF 2): output pixel (y, x) samples the crop at
// ((y + 0.5) * crop_h / out_h - 0.5, ...), clamped to the crop's edges.
// Outputs are floats v / 255 in [0, 1] (psrt's models take [0, 1]; TF's
// Inception scales to [-1, 1] instead), HWC.
//
// Randomness comes from a SplitMix64 stream (ExampleRng) seeded from
// (seed, epoch, example), so a crop never depends on thread timing and is
// the same with any standard library.
//
// Thread safety: functions are thread-safe; an ExampleRng is not.
#ifndef PSRT_WORKER_INPUT_IMAGE_PREPROCESS_H_
#define PSRT_WORKER_INPUT_IMAGE_PREPROCESS_H_

#include <cstdint>

#include "worker/input/image_decoder.h"

namespace psrt {

// A rectangle of an image: rows [y, y + height), columns [x, x + width).
struct CropBox {
  int y = 0;
  int x = 0;
  int height = 0;
  int width = 0;
  bool operator==(const CropBox& o) const {
    return y == o.y && x == o.x && height == o.height && width == o.width;
  }
};

// SplitMix64: a small, fast, well-mixed stream of 64-bit values.
class ExampleRng {
 public:
  // A stream for one example of one epoch.
  ExampleRng(uint64_t seed, int64_t epoch, int64_t example);
  uint64_t Next();
  double Uniform();                  // In [0, 1).
  int64_t UniformInt(int64_t n);     // In [0, n). REQUIRES: n > 0.

 private:
  uint64_t state_;
};

struct DistortedCropOptions {
  double min_area = 0.05;  // Fractions of the image's area.
  double max_area = 1.0;
  double min_aspect = 3.0 / 4;  // width / height.
  double max_aspect = 4.0 / 3;
  int max_attempts = 10;  // Then the whole image.
};

// TF's sample_distorted_bounding_box with the whole image as the object:
// draws an area and an aspect ratio, and places a box of that shape at a
// random position; after max_attempts boxes that do not fit, the whole
// image. REQUIRES: height, width > 0.
CropBox SampleDistortedCrop(int height, int width, const DistortedCropOptions& options,
                            ExampleRng* rng);

// tf.image.central_crop: the centered box of `fraction` of each side (at
// least 1 pixel). REQUIRES: height, width > 0, 0 < fraction <= 1.
CropBox CentralCrop(int height, int width, double fraction);

// Writes `box` of `image`, resized to out_height x out_width (bilinear,
// above), mirrored left-right when `flip`, as floats in [0, pixel_max]
// (byte / 255 * pixel_max) to out[0 .. out_height * out_width * image.channels).
// REQUIRES: box lies within the image; out sizes > 0.
void CropResizeFlip(const Image& image, const CropBox& box, int out_height, int out_width,
                    bool flip, float* out, float pixel_max = 1);

}  // namespace psrt

#endif  // PSRT_WORKER_INPUT_IMAGE_PREPROCESS_H_
