// Generated image data sets whose classes are learnable, for tests, the
// Inception example and the input benchmark (no download needed).
//
// Class k of C has its own hue (k / C around the color wheel) over the
// whole image, stripes of a class-specific period, and a filled disc
// (even classes) or square (odd ones) of a brighter shade at a random
// place; every pixel gets uniform noise. Any crop of 5% of the image or
// more still shows the class's color and stripes, and a left-right flip
// keeps them.
//
// Thread safety: functions are thread-safe.
#ifndef PSRT_WORKER_INPUT_SYNTHETIC_IMAGES_H_
#define PSRT_WORKER_INPUT_SYNTHETIC_IMAGES_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "worker/input/image_decoder.h"

namespace psrt {

// An RGB image of class `label` (of num_classes), drawn from `seed`.
// REQUIRES: 0 <= label < num_classes; height, width > 0.
Image SyntheticImage(int label, int num_classes, int height, int width, uint64_t seed);

struct SyntheticFolderOptions {
  int num_classes = 4;
  int per_class = 50;
  int height = 48;
  int width = 48;
  uint64_t seed = 1;
  int quality = 90;   // JPEG quality.
  int png_every = 0;  // Every png_every-th image is a PNG; 0: none.
};

// Writes dir/class_00/img_00000.jpg, ... (build_image_data.py's layout: one
// folder per class), creating the folders.
absl::Status WriteSyntheticImageFolder(const std::string& dir,
                                       const SyntheticFolderOptions& options);

}  // namespace psrt

#endif  // PSRT_WORKER_INPUT_SYNTHETIC_IMAGES_H_
