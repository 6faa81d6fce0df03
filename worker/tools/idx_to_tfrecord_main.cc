// psrt_idx_to_tfrecord: converts IDX image and label files (MNIST,
// Fashion-MNIST) into TFRecord files of tf.train.Example, with the features
// TensorFlow's convert_to_records.py writes: image_raw (the uint8 pixels),
// label, height, width, depth.
//
//   psrt_idx_to_tfrecord --data_dir=/usr/share/datasets/fashion-mnist \
//       --split=train --out=/data/fashion/train.tfrecord
//   psrt_idx_to_tfrecord --images=t10k-images-idx3-ubyte.gz \
//       --labels=t10k-labels-idx1-ubyte.gz --out=test.tfrecord.gz --compression=gzip
//   psrt_idx_to_tfrecord --data_dir=... --split=train --out=train --num_files=4
//       (writes train-00000-of-00004 ... train-00003-of-00004)
//
// Flags are read here only; they fill TFRecordDatasetWriteOptions.
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "common/tfrecord.h"
#include "gflags/gflags.h"
#include "worker/input/idx_dataset.h"
#include "worker/input/tfrecord_dataset.h"

DEFINE_string(images, "", "IDX images file (may be .gz); with --labels.");
DEFINE_string(labels, "", "IDX labels file (may be .gz); with --images.");
DEFINE_string(data_dir, "",
              "Instead of --images/--labels: a directory holding the standard "
              "MNIST file names, with --split.");
DEFINE_string(split, "train", "With --data_dir: train or t10k.");
DEFINE_string(out, "", "Output TFRecord file (the prefix with --num_files > 1).");
DEFINE_string(compression, "none", "none or gzip (TFRecordOptions' GZIP).");
DEFINE_int32(num_files, 1,
             "Split the examples, in order, over this many files "
             "<out>-00000-of-0000N, ...");
DEFINE_int32(num_classes, 10, "Labels must be 0..num_classes-1.");

namespace {

absl::Status Run() {
  if (FLAGS_out.empty()) return absl::InvalidArgumentError("--out is required");
  psrt::TFRecordDatasetWriteOptions options;
  options.num_files = FLAGS_num_files;
  if (FLAGS_compression == "gzip") {
    options.compression = psrt::TFRecordCompression::kGzip;
  } else if (FLAGS_compression != "none") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--compression=", FLAGS_compression, ": must be none or gzip"));
  }
  psrt::Dataset data;
  if (!FLAGS_data_dir.empty()) {
    if (!FLAGS_images.empty() || !FLAGS_labels.empty()) {
      return absl::InvalidArgumentError(
          "give either --data_dir (with --split) or --images and --labels");
    }
    ASSIGN_OR_RETURN(data, psrt::LoadMnistSplit(FLAGS_data_dir, FLAGS_split));
  } else {
    if (FLAGS_images.empty() || FLAGS_labels.empty()) {
      return absl::InvalidArgumentError(
          "give --images and --labels (IDX files), or --data_dir and --split");
    }
    ASSIGN_OR_RETURN(data, psrt::ReadIdxDataset(FLAGS_images, FLAGS_labels,
                                                FLAGS_num_classes));
  }
  RETURN_IF_ERROR(psrt::WriteTFRecordDataset(data, FLAGS_out, options));
  const std::string where =
      FLAGS_num_files == 1
          ? FLAGS_out
          : absl::StrFormat("%s-00000-of-%05d ... %s-%05d-of-%05d", FLAGS_out,
                            FLAGS_num_files, FLAGS_out, FLAGS_num_files - 1,
                            FLAGS_num_files);
  std::printf("wrote %lld examples (%d x %d pixels) to %s\n",
              static_cast<long long>(data.size()), data.rows, data.cols,
              where.c_str());
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "converts IDX files (MNIST, Fashion-MNIST) to TFRecord files of "
      "tf.train.Example: psrt_idx_to_tfrecord --data_dir=DIR --split=train "
      "--out=FILE");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  absl::Status status = Run();
  if (!status.ok()) {
    std::fprintf(stderr, "psrt_idx_to_tfrecord: %s\n",
                 std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
