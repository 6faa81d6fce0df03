// TFRecord input: labelled images stored as tf.train.Example records in
// TFRecord files (common/tfrecord.h), read into the Dataset that IDX input
// also produces, so BatchIterator shards and batches both alike.
//
// Every record is a psrt.tf.Example (proto/example.proto) with the features
// TensorFlow's MNIST convert_to_records.py writes:
//   image_raw  bytes_list, one value: the rows*cols uint8 pixels, row-major
//   label      int64_list, one value in [0, num_classes)
//   height, width   int64_list, optional: rows and cols
//   depth           int64_list, optional: must be 1 (Dataset has one channel)
//   pixels          int64_list, optional: rows*cols (older MNIST converters)
// Other features are ignored. Without height/width an image of n pixels is
// sqrt(n) x sqrt(n) when n is a square (28 x 28 for 784), else 1 x n. Every
// record must have the first record's shape. Pixels become floats v / 255.
//
// Errors name the file and the record index (and what was found), e.g.
//   "/data/train.tfrecord: record 17: missing feature "label" (present:
//    height, image_raw, width)"
//   "/data/train.tfrecord: record 3: image_raw has 783 bytes, expected 784
//    (28 x 28)"
// plus the TFRecord reader's errors for corrupt files.
#ifndef PSRT_WORKER_INPUT_TFRECORD_DATASET_H_
#define PSRT_WORKER_INPUT_TFRECORD_DATASET_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tfrecord.h"
#include "worker/input/dataset.h"

namespace psrt {

// The files named by `spec`: a comma-separated list whose items are each a
// file, a directory (its regular files, except hidden ones and "*.tmp"), or
// a glob pattern ("data/train-*"); directories and patterns expand in name
// order, items keep theirs. NotFound names an item that matches nothing.
absl::StatusOr<std::vector<std::string>> ExpandDataFiles(
    const std::string& spec);

// Reads every record of the files of `spec` (ExpandDataFiles), in order.
// InvalidArgument when there is no record at all.
absl::StatusOr<Dataset> ReadTFRecordDataset(const std::string& spec,
                                            int num_classes = 10);

struct TFRecordDatasetWriteOptions {
  TFRecordCompression compression = TFRecordCompression::kNone;
  // More than 1: consecutive ranges of examples go to the files
  // "<path>-00000-of-0000N", ..., which read back in name order (a glob
  // "<path>-*") hold the examples in the original order.
  int num_files = 1;
};

// Writes `data` as Examples with image_raw, label, height, width and depth
// (= 1), like convert_to_records.py. Each file is written to "<file>.tmp"
// and renamed when complete. InvalidArgument when a pixel is not one of
// 0/255, 1/255, ..., 255/255 (it would not survive the round trip).
absl::Status WriteTFRecordDataset(const Dataset& data, const std::string& path,
                                  const TFRecordDatasetWriteOptions& options = {});

}  // namespace psrt

#endif  // PSRT_WORKER_INPUT_TFRECORD_DATASET_H_
