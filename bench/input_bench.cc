// input_bench: the image input pipeline's own throughput (no model, no
// parameter server): JPEG decode + random distorted crop + resize + flip to
// --size x --size RGB floats, on --threads decoder threads, as a training
// worker's ImagePipeline (worker/input/image_pipeline.h) does it:
//
//   build/bin/input_bench --size=299 --threads=2
//   input: size=299 threads=2 images_per_sec=X (source 500x375 JPEG, N KB; ...)
//
// The source images are generated (worker/input/synthetic_images.h: colored
// stripes and shapes with per-pixel noise) at ImageNet's typical size,
// JPEG-encoded at --quality, and held in memory like a worker's shard; the
// noise makes them larger (and slower to decode) than photos of the same
// size. Prints the median of --runs runs of --batches batches each, after a
// warm-up run.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "bench/bench_util.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "common/tfrecord.h"
#include "worker/input/image_decoder.h"
#include "worker/input/image_pipeline.h"
#include "worker/input/image_records.h"
#include "worker/input/synthetic_images.h"

DEFINE_int32(size, 299, "Output height and width.");
DEFINE_string(threads, "1,2", "Comma-separated decoder thread counts to time.");
DEFINE_int32(batch_size, 32, "Images per batch.");
DEFINE_int32(batches, 20, "Batches per timed run.");
DEFINE_int32(runs, 3, "Timed runs; the median is reported.");
DEFINE_int32(source_height, 375, "Height of the source JPEGs.");
DEFINE_int32(source_width, 500, "Width of the source JPEGs.");
DEFINE_int32(images, 64, "Distinct source images (cycled).");
DEFINE_int32(quality, 90, "JPEG quality of the source images.");
DEFINE_int32(prefetch_batches, 3, "Batches decoded ahead.");
DEFINE_string(input_cache, "memory",
              "memory: the JPEGs held in RAM; disk: written as build_image_data.py "
              "records to --disk_file and read back by offset for each image.");
DEFINE_string(disk_file, "/tmp/input_bench.tfrecord", "The records, for --input_cache=disk.");

using psrt::bench::Median;

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  auto shard = std::make_shared<psrt::ImageShard>();
  shard->files.push_back("(generated)");
  int64_t bytes = 0;
  for (int i = 0; i < FLAGS_images; ++i) {
    const psrt::Image image =
        psrt::SyntheticImage(i % 10, 10, FLAGS_source_height, FLAGS_source_width, i);
    absl::StatusOr<std::string> jpeg = psrt::EncodeJpeg(image, FLAGS_quality);
    CHECK(jpeg.ok()) << jpeg.status();
    bytes += jpeg->size();
    shard->encoded.push_back(*std::move(jpeg));
    shard->labels.push_back(i % 10);
    shard->file_index.push_back(0);
    shard->record.push_back(i);
  }
  std::shared_ptr<const psrt::ImageShard> source = shard;
  if (FLAGS_input_cache == "disk") {
    auto writer = psrt::TFRecordWriter::Open(FLAGS_disk_file);
    CHECK(writer.ok()) << writer.status();
    for (int i = 0; i < FLAGS_images; ++i) {
      psrt::ImageRecord record;
      record.encoded = shard->encoded[i];
      record.label = 1 + shard->labels[i];
      CHECK((*writer)->Write(psrt::SerializeImageExample(record)).ok());
    }
    CHECK((*writer)->Close().ok());
    psrt::ImageShardOptions options;
    options.in_memory = false;
    absl::StatusOr<psrt::ImageShard> read = psrt::ReadImageShard({FLAGS_disk_file}, options);
    CHECK(read.ok()) << read.status();
    source = std::make_shared<const psrt::ImageShard>(*std::move(read));
  } else {
    CHECK_EQ(FLAGS_input_cache, "memory");
  }
  std::vector<int> thread_counts;
  for (const char* p = FLAGS_threads.c_str(); *p != '\0';) {
    thread_counts.push_back(std::atoi(p));
    while (*p != '\0' && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  for (int threads : thread_counts) {
    psrt::ImagePipelineOptions options;
    options.height = options.width = FLAGS_size;
    options.channels = 3;
    options.batch_size = FLAGS_batch_size;
    options.threads = threads;
    options.prefetch_batches = FLAGS_prefetch_batches;
    options.train = true;
    psrt::ImagePipeline pipeline(source, options);
    psrt::Tensor images;
    std::vector<int32_t> labels;
    std::vector<double> rates;
    for (int run = 0; run <= FLAGS_runs; ++run) {  // Run 0 warms up.
      const absl::Time start = absl::Now();
      for (int b = 0; b < FLAGS_batches; ++b) {
        absl::Status status = pipeline.NextBatch(FLAGS_batch_size, &images, &labels);
        CHECK(status.ok()) << status;
      }
      const double secs = absl::ToDoubleSeconds(absl::Now() - start);
      if (run > 0) rates.push_back(static_cast<double>(FLAGS_batch_size) * FLAGS_batches / secs);
    }
    std::printf(
        "input: size=%d threads=%d images_per_sec=%.1f (source %dx%d JPEG, %.0f KB avg, "
        "from %s; decode + random crop + resize + flip; median of %d runs)\n",
        FLAGS_size, threads, Median(rates), FLAGS_source_width, FLAGS_source_height,
        bytes / 1024.0 / FLAGS_images, FLAGS_input_cache.c_str(), FLAGS_runs);
    std::fflush(stdout);
  }
  return 0;
}
