// Converts a folder of images, one subfolder per class, into TFRecord
// files in the format of TensorFlow's build_image_data.py
// (worker/image_records.h), as psrt_images_to_tfrecord and
// scripts/images_to_tfrecord.sh do:
//
//   in/daisy/1.jpg, in/daisy/2.png, in/tulip/3.jpeg, ...
//   -> out/train-00000-of-00002, out/train-00001-of-00002,
//      out/validation-00000-of-00001 (with validation_percent > 0),
//      out/labels.txt
//
// Labels follow build_image_data.py: the classes are the subfolders in
// sorted (byte) order, class i gets image/class/label i + 1 (0 is left
// unused, for "background"), and labels.txt lists the class names one a
// line, in label order. psrt's reader subtracts --label_offset=1, so the
// model sees class ids 0..N-1 (train with --num_classes=N).
//
// Images with the extensions .jpg, .jpeg and .png (any case) are taken;
// other files are skipped. Every image is decoded once to check it and to
// record its height, width and channels; a bad one (unreadable, truncated,
// not an image) stops the conversion with an error naming the file, or,
// with skip_bad, is left out, counted and listed with its reason in
// out/skipped.txt (one "path: reason" line each; written, maybe empty,
// whenever skip_bad is on). Bytes are stored as they are (a PNG
// stays a PNG with image/format "PNG", where build_image_data.py
// re-encodes it as JPEG; psrt decodes both). Like build_image_data.py, the
// examples are shuffled with a fixed seed before they are split into
// shards, so each shard mixes the classes. Files are written to "*.tmp"
// and renamed when complete, `threads` of them at a time; the output does
// not depend on the thread count.
#ifndef PSRT_WORKER_INPUT_IMAGE_FOLDER_H_
#define PSRT_WORKER_INPUT_IMAGE_FOLDER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace psrt {

struct ImageFolderOptions {
  std::string in_dir;
  std::string out_dir;  // Created if missing.
  int train_shards = 2;
  int validation_shards = 1;
  double validation_percent = 0;  // Of the examples, to validation-*.
  uint64_t seed = 12345;          // build_image_data.py's random.seed.
  int threads = 1;  // Files written at once (build_image_data.py's --num_threads).
  bool skip_bad = false;  // Leave out the images that cannot be read or decoded.
};

struct ImageFolderSummary {
  std::vector<std::string> classes;  // Label i + 1 is classes[i].
  int64_t train_examples = 0;
  int64_t validation_examples = 0;
  int64_t png_examples = 0;
  std::vector<std::string> files;  // Written, in order.
  std::vector<std::string> skipped;  // With skip_bad: "path: reason", in input order.
};

absl::StatusOr<ImageFolderSummary> ConvertImageFolder(const ImageFolderOptions& options);

}  // namespace psrt

#endif  // PSRT_WORKER_INPUT_IMAGE_FOLDER_H_
