// IDX input: the MNIST / Fashion-MNIST file format, read into a Dataset.
//
// IDX layout (big-endian): magic 0x00000803 (images) or 0x00000801 (labels),
// then the dimension sizes (N, rows, cols for images; N for labels) as
// uint32, then N*rows*cols (or N) unsigned bytes. Files may be gzip-compressed
// (detected by the gzip magic 1f 8b; a ".gz" name without it is an error).
// A missing file is NotFound naming the path. Anything that does not match,
// a short file, trailing bytes, a corrupt gzip stream, mismatched counts or a
// label >= num_classes, is an InvalidArgument that names the file and what
// is wrong, with the numbers, e.g.
//   "<path>: truncated data: expected 47040000 bytes (60000 x 28 x 28) after
//    the 16-byte header, got 47039999".
#ifndef PSRT_WORKER_INPUT_IDX_DATASET_H_
#define PSRT_WORKER_INPUT_IDX_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "worker/input/dataset.h"

namespace psrt {

absl::StatusOr<Dataset> ReadIdxDataset(const std::string& images_path,
                                       const std::string& labels_path,
                                       int num_classes = 10);

// Loads "train" or "t10k" from a directory holding the standard file names
// (train-images-idx3-ubyte[.gz], ...; the "train-images.idx3-ubyte" spelling
// too), preferring the plain file. NotFound names the directory and the
// names tried.
absl::StatusOr<Dataset> LoadMnistSplit(const std::string& data_dir,
                                       const std::string& split);

}  // namespace psrt

#endif  // PSRT_WORKER_INPUT_IDX_DATASET_H_
