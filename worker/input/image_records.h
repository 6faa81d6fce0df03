// Image records in the format of TensorFlow's build_image_data.py and
// build_imagenet_data.py (inception/data/): TFRecord files of
// tf.train.Example with the features
//   image/encoded      bytes   the JPEG (or PNG) file's bytes, as stored
//   image/class/label  int64   build_image_data.py: 1 + the class's index
//                              in its labels file (0 is "background")
//   image/format       bytes   "JPEG" (or "PNG")
//   image/height, image/width, image/channels   int64 (3 for RGB)
//   image/colorspace   bytes   "RGB"
//   image/class/text   bytes   the class's name, e.g. "daisy"
//   image/filename     bytes   the source file's base name
// Only image/encoded and image/class/label are required; the rest is read
// for messages and left unchecked (the decoder finds the real size).
//
// Labels: psrt's models take class ids in [0, num_classes), so a stored
// label L becomes L - label_offset. The default offset 1 maps
// build_image_data.py's labels 1..N to 0..N-1 (train with
// --num_classes=N; TF's Inception has N+1 outputs instead, one unused).
// Data written with labels from 0 needs label_offset 0.
//
// Errors name the file and the record, e.g.
//   "/data/train-00000-of-00002: record 17: missing feature
//    "image/class/label" (present: image/encoded, image/format)"
//   "/data/train-00000-of-00002: record 3: label 0 - label_offset 1 = -1 is
//    outside [0, 5)"
#ifndef PSRT_WORKER_INPUT_IMAGE_RECORDS_H_
#define PSRT_WORKER_INPUT_IMAGE_RECORDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/file_system.h"

namespace psrt {

inline constexpr char kImageEncodedFeature[] = "image/encoded";

// One build_image_data.py record.
struct ImageRecord {
  std::string encoded;
  int64_t label = 0;  // As stored.
  std::string format;      // "JPEG", "PNG".
  std::string text;        // The class name.
  std::string filename;
  std::string colorspace;  // "RGB", "Grayscale".
  int64_t height = 0, width = 0, channels = 0;
};

// Parses a serialized tf.train.Example. InvalidArgument (without a
// location: callers add it) when it is not an Example or lacks
// image/encoded or image/class/label or holds them with the wrong type.
absl::StatusOr<ImageRecord> ParseImageExample(absl::string_view serialized);

// The serialized Example of `record`, with every feature above (empty
// strings and zero sizes too, as build_image_data.py writes them), its
// features in name order (the same bytes for the same record).
std::string SerializeImageExample(const ImageRecord& record);

// Whether the first record of `file` holds image/encoded (an image data
// set) rather than MNIST-style image_raw. NotFound/InvalidArgument for a
// missing, empty or corrupt file.
absl::StatusOr<bool> IsImageRecordFile(const std::string& file);

// The examples of one worker's shard: their labels, where each came from
// (for messages), and their encoded images, held in memory (about 110 KB
// an ImageNet image) or, for plain (not gzip) files read with
// in_memory = false, read from the file when they are decoded (the page
// cache keeps what fits).
// Thread safety: Read may be called from any number of threads.
struct ImageShard {
  std::vector<std::string> encoded;  // Empty for an example read from disk.
  std::vector<int32_t> labels;  // Class ids: stored label - label_offset.
  std::vector<std::string> files;
  std::vector<int32_t> file_index;  // Per example: its file in `files`,
  std::vector<int64_t> record;      // its record index there,
  std::vector<int64_t> offset;      // and its record's byte offset
  std::vector<int64_t> length;      // and data length there.
  // Per file: open when its images stay on disk, else null.
  std::vector<std::unique_ptr<RandomAccessFile>> on_disk;
  bool sharded_by_file = true;

  int64_t size() const { return static_cast<int64_t>(labels.size()); }
  // "<file>: record <k>" of example i.
  std::string Where(int64_t i) const;
  // Example i's encoded image: in memory, or read into *scratch (the
  // record's checksum checked). An error (a short read, a checksum that
  // does not match, a record that no longer parses) does not name the
  // record: callers add Where(i).
  absl::Status Read(int64_t i, std::string* scratch, absl::string_view* bytes) const;
};

struct ImageShardOptions {
  int shard = 0;       // This worker's shard,
  int num_shards = 1;  // of this many.
  int num_classes = 10;
  int label_offset = 1;  // See above.
  // False: keep plain files' images on disk (offsets only); gzip files'
  // are always held in memory.
  bool in_memory = true;
};

// Reads this worker's shard of `files` (in the given order). With at least
// as many files as shards, shard r takes the files with index % W == r
// (like TF's input readers: each worker opens only its files); with fewer
// files, every shard reads every file and takes the records i % W == r,
// numbered across the files (logged). InvalidArgument when the shard holds
// no example, or for a bad record (naming file and record). The images are
// not decoded here.
// REQUIRES: 0 <= shard < num_shards.
absl::StatusOr<ImageShard> ReadImageShard(const std::vector<std::string>& files,
                                          const ImageShardOptions& options);

}  // namespace psrt

#endif  // PSRT_WORKER_INPUT_IMAGE_RECORDS_H_
