// psrt_images_to_tfrecord: converts a folder of JPEG/PNG images, one
// subfolder per class, into TFRecord files in build_image_data.py's format
// (see worker/image_folder.h for the layout, labels and shards).
//
//   psrt_images_to_tfrecord --in=photos --out=photos-tfrecord \
//       --train_shards=2 --validation_percent=10
//
// Flags are read here only; they fill ImageFolderOptions.
#include <algorithm>
#include <cstdio>
#include <string>

#include "absl/strings/str_join.h"
#include "common/cpu_budget.h"
#include "gflags/gflags.h"
#include "worker/input/image_folder.h"

DEFINE_string(in, "", "Folder with one subfolder of images per class.");
DEFINE_string(out, "", "Output folder (created if missing).");
DEFINE_int32(train_shards, 2, "Files train-00000-of-0000N, ...");
DEFINE_int32(validation_shards, 1, "Files validation-00000-of-0000N, ...");
DEFINE_double(validation_percent, 0,
              "Percent of the images (after the seeded shuffle) written to validation-*.");
DEFINE_uint64(seed, 12345, "Seed of the shuffle before sharding.");
DEFINE_int32(num_threads, 0, "Files written at once; 0: number of cores.");
DEFINE_bool(skip_bad, false,
            "Leave out the images that cannot be read or decoded (a truncated JPEG, say), "
            "count them and list them with their reasons in OUT/skipped.txt, instead of "
            "stopping at the first.");

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "converts DIR/<class>/*.{jpg,jpeg,png} to build_image_data.py TFRecords: "
      "psrt_images_to_tfrecord --in=DIR --out=DIR");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  psrt::ImageFolderOptions options;
  options.in_dir = FLAGS_in;
  options.out_dir = FLAGS_out;
  options.train_shards = FLAGS_train_shards;
  options.validation_shards = FLAGS_validation_shards;
  options.validation_percent = FLAGS_validation_percent;
  options.seed = FLAGS_seed;
  options.skip_bad = FLAGS_skip_bad;
  options.threads = FLAGS_num_threads > 0
                        ? FLAGS_num_threads
                        : psrt::ProcessCpuBudget().cores;
  absl::StatusOr<psrt::ImageFolderSummary> summary = psrt::ConvertImageFolder(options);
  if (!summary.ok()) {
    std::fprintf(stderr, "psrt_images_to_tfrecord: %s\n",
                 std::string(summary.status().message()).c_str());
    return 1;
  }
  std::printf(
      "wrote %lld train and %lld validation images (%lld PNG) of %zu classes to %s: %s\n"
      "labels 1..%zu in %s/labels.txt order (psrt: --num_classes=%zu --label_offset=1)\n",
      static_cast<long long>(summary->train_examples),
      static_cast<long long>(summary->validation_examples),
      static_cast<long long>(summary->png_examples), summary->classes.size(), FLAGS_out.c_str(),
      absl::StrJoin(summary->classes, ", ").c_str(), summary->classes.size(), FLAGS_out.c_str(),
      summary->classes.size());
  if (FLAGS_skip_bad) {
    std::printf("skipped %zu files that could not be read or decoded (listed in %s/skipped.txt)\n",
                summary->skipped.size(), FLAGS_out.c_str());
  }
  return 0;
}
