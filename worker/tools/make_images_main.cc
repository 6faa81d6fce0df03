// psrt_make_images: writes a generated image folder (one subfolder of JPEGs
// per class, classes told apart by color, stripes and shape; see
// worker/synthetic_images.h) for the Inception example, tests and the
// input benchmark.
//
//   psrt_make_images --out=/tmp/shapes --classes=4 --per_class=200 --size=48
//
// Flags are read here only; they fill SyntheticFolderOptions.
#include <cstdio>
#include <string>

#include "gflags/gflags.h"
#include "worker/input/synthetic_images.h"

DEFINE_string(out, "", "Output folder (class_00, class_01, ... are created in it).");
DEFINE_int32(classes, 4, "Number of classes.");
DEFINE_int32(per_class, 100, "Images per class.");
DEFINE_int32(size, 48, "Height and width of the images.");
DEFINE_uint64(seed, 1, "Seed of the images.");
DEFINE_int32(quality, 90, "JPEG quality.");
DEFINE_int32(png_every, 0, "Write every N-th image as a PNG; 0: JPEGs only.");

int main(int argc, char** argv) {
  gflags::SetUsageMessage("writes a generated image folder: psrt_make_images --out=DIR");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (FLAGS_out.empty() || FLAGS_classes < 1 || FLAGS_per_class < 1 || FLAGS_size < 1) {
    std::fprintf(stderr, "psrt_make_images: needs --out and positive --classes, "
                         "--per_class, --size\n");
    return 2;
  }
  psrt::SyntheticFolderOptions options;
  options.num_classes = FLAGS_classes;
  options.per_class = FLAGS_per_class;
  options.height = options.width = FLAGS_size;
  options.seed = FLAGS_seed;
  options.quality = FLAGS_quality;
  options.png_every = FLAGS_png_every;
  absl::Status status = psrt::WriteSyntheticImageFolder(FLAGS_out, options);
  if (!status.ok()) {
    std::fprintf(stderr, "psrt_make_images: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  std::printf("wrote %d x %d images of %dx%d to %s\n", FLAGS_classes, FLAGS_per_class,
              FLAGS_size, FLAGS_size, FLAGS_out.c_str());
  return 0;
}
