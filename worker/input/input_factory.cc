#include "worker/input/input_factory.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cpu_budget.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/input/criteo_batch_source.h"
#include "worker/input/idx_dataset.h"
#include "worker/input/prefetching_batch_source.h"
#include "worker/input/image_pipeline.h"
#include "worker/input/image_records.h"
#include "worker/input/tfrecord_dataset.h"

namespace psrt {
namespace {

// Whether the options name image records.
absl::StatusOr<bool> ReadsImageRecords(const InputOptions& options) {
  switch (options.format) {
    case InputOptions::Format::kMnist:
    case InputOptions::Format::kCriteo:
      return false;
    case InputOptions::Format::kImages:
      if (options.synthetic) {
        return absl::InvalidArgumentError("--data_format=images reads no --synthetic_data");
      }
      return true;
    case InputOptions::Format::kAuto:
      break;
  }
  const std::string& spec =
      options.train_data.empty() ? options.test_data : options.train_data;
  if (options.synthetic || spec.empty()) return false;
  ASSIGN_OR_RETURN(std::vector<std::string> files, ExpandDataFiles(spec));
  return IsImageRecordFile(files[0]);
}

// A data set of another image size than the model's is named here, not
// found by the first step.
absl::StatusOr<Dataset> FitsModel(const InputOptions& options, Dataset data,
                                  const std::string& source) {
  const int64_t pixels = int64_t{options.height} * options.width * options.channels;
  if (data.images.rank() == 2 && data.images.dim(1) != pixels) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, " holds images of ", data.images.dim(1), " values (", data.rows, "x",
        data.cols, "), but --model=", options.model, " is built for ", options.height, "x",
        options.width, "x", options.channels, " = ", pixels,
        " (--input_height, --input_width, --input_channels)"));
  }
  return data;
}

// The IDX split `split` of data_dir, or the TFRecord files of `spec`.
absl::StatusOr<Dataset> ReadDataset(const InputOptions& options, const std::string& spec,
                                    const std::string& split) {
  ASSIGN_OR_RETURN(Dataset data, spec.empty()
                                     ? LoadMnistSplit(options.data_dir, split)
                                     : ReadTFRecordDataset(spec, options.num_classes));
  if (options.pixel_max != 1) {  // The readers give byte / 255: back to the byte, then scaled.
    const float scale = options.pixel_max / 255;
    for (float& v : data.images.flat()) v = std::round(v * 255) * scale;
  }
  return FitsModel(options, std::move(data), spec.empty() ? options.data_dir : spec);
}

// The image records of `spec`, shard `shard` of `shards`.
absl::StatusOr<std::shared_ptr<const ImageShard>> OpenImageShard(const InputOptions& options,
                                                                 const std::string& spec,
                                                                 int shard, int shards) {
  if (spec.empty()) {
    return absl::InvalidArgumentError(
        "image records need both --train_data and --test_data (no default data set)");
  }
  ASSIGN_OR_RETURN(std::vector<std::string> files, ExpandDataFiles(spec));
  ImageShardOptions shard_options;
  shard_options.shard = shard;
  shard_options.num_shards = shards;
  shard_options.num_classes = options.num_classes;
  shard_options.label_offset = options.label_offset;
  shard_options.in_memory = options.records_in_memory;
  ASSIGN_OR_RETURN(ImageShard read, ReadImageShard(files, shard_options));
  return std::make_shared<const ImageShard>(std::move(read));
}

BatchSourceFactory Pipelines(std::shared_ptr<const ImageShard> shard,
                             const ImagePipelineOptions& options) {
  return [shard, options]() -> absl::StatusOr<std::unique_ptr<BatchSource>> {
    return std::unique_ptr<BatchSource>(std::make_unique<ImagePipeline>(shard, options));
  };
}

absl::Status OpenImageRecords(const InputOptions& options, int replica, int num_replicas,
                              WorkerInput* input) {
  if (options.channels != 1 && options.channels != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--input_channels=", options.channels, ": image records decode to 1 or 3"));
  }
  ImagePipelineOptions pipeline;
  pipeline.height = options.height;
  pipeline.width = options.width;
  pipeline.channels = options.channels;
  pipeline.batch_size = options.batch_size;
  pipeline.shuffle = options.shuffle;
  pipeline.seed = options.seed + 1000 * std::max(replica, 0);
  pipeline.threads = options.decoder_threads;
  pipeline.prefetch_batches = std::max(1, options.prefetch_batches);
  pipeline.skip_corrupt = options.skip_corrupt;
  pipeline.pixel_max = options.pixel_max;
  input->streamed = true;
  if (replica >= 0) {
    ASSIGN_OR_RETURN(std::shared_ptr<const ImageShard> train,
                     OpenImageShard(options, options.train_data, replica, num_replicas));
    input->train_examples = train->size() * num_replicas;
    LOG(INFO) << "input: " << train->size() << " image records in " << train->files.size()
              << " file(s) for replica " << replica << ", decoded on "
              << (options.decoder_threads > 0
                      ? options.decoder_threads
                      : ProcessCpuBudget().cores)
              << " threads, " << pipeline.prefetch_batches << " batches ahead";
    input->train_source = Pipelines(std::move(train), pipeline);
  }
  if (replica <= 0) {
    // Kept encoded, decoded (central crops) at each evaluation: a decoded
    // ImageNet validation set at 299x299 would need 50 GB.
    ASSIGN_OR_RETURN(std::shared_ptr<const ImageShard> test,
                     OpenImageShard(options, options.test_data, 0, 1));
    ImagePipelineOptions eval = pipeline;
    eval.train = false;
    eval.shuffle = false;
    input->test_examples = test->size();
    input->test_source = Pipelines(std::move(test), eval);
  }
  return absl::OkStatus();
}

// Criteo click logs: replica r's shard of --train_data (every replica reads
// the files in order, keeping its lines), the whole of --test_data for the
// chief and the evaluator.
absl::Status OpenCriteo(const InputOptions& options, int replica, int num_replicas,
                        WorkerInput* input) {
  if (options.synthetic) {
    return absl::InvalidArgumentError(
        "--data_format=criteo reads files (psrt_make_criteo writes synthetic ones), not "
        "--synthetic_data");
  }
  auto files_of = [](const std::string& flag,
                     const std::string& spec) -> absl::StatusOr<CriteoReader::Options> {
    if (spec.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--data_format=criteo needs --", flag, " (Criteo-format files: plain or gzip, a "
          "comma-separated list or a glob)"));
    }
    CriteoReader::Options reader;
    ASSIGN_OR_RETURN(reader.files, ExpandDataFiles(spec));
    return reader;
  };
  input->streamed = true;
  if (replica >= 0) {
    ASSIGN_OR_RETURN(CriteoReader::Options train, files_of("train_data", options.train_data));
    train.shard = replica;
    train.num_shards = num_replicas;
    train.skip_malformed = options.skip_malformed;
    // Opened now, so that a missing file fails the task at start.
    RETURN_IF_ERROR(CriteoReader::Open(train).status());
    // Parsed on a thread of its own while the step before runs.
    input->train_source = [train]() -> absl::StatusOr<std::unique_ptr<BatchSource>> {
      ASSIGN_OR_RETURN(std::unique_ptr<CriteoBatchSource> source, CriteoBatchSource::Open(train));
      return std::unique_ptr<BatchSource>(
          std::make_unique<PrefetchingBatchSource>(std::move(source), nullptr));
    };
    LOG(INFO) << "input: Criteo logs in " << train.files.size() << " file(s), shard " << replica
              << " of " << num_replicas;
  }
  if (replica <= 0) {
    ASSIGN_OR_RETURN(CriteoReader::Options test, files_of("test_data", options.test_data));
    test.skip_malformed = options.skip_malformed;
    ASSIGN_OR_RETURN(input->test_examples, CountCriteoExamples(test));
    input->test_source = [test]() -> absl::StatusOr<std::unique_ptr<BatchSource>> {
      ASSIGN_OR_RETURN(std::unique_ptr<CriteoBatchSource> source, CriteoBatchSource::Open(test));
      return std::unique_ptr<BatchSource>(std::move(source));
    };
    LOG(INFO) << "input: " << input->test_examples << " Criteo test examples";
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<InputOptions::Format> ParseInputFormat(const std::string& name) {
  if (name == "auto") return InputOptions::Format::kAuto;
  if (name == "mnist") return InputOptions::Format::kMnist;
  if (name == "images") return InputOptions::Format::kImages;
  if (name == "criteo") return InputOptions::Format::kCriteo;
  return absl::InvalidArgumentError("--data_format: \"" + name +
                                    "\" is not auto, mnist, images or criteo");
}

absl::StatusOr<WorkerInput> OpenWorkerInput(const InputOptions& options, int replica,
                                            int num_replicas) {
  WorkerInput input;
  if (options.format == InputOptions::Format::kCriteo) {
    RETURN_IF_ERROR(OpenCriteo(options, replica, num_replicas, &input));
    return input;
  }
  ASSIGN_OR_RETURN(const bool image_records, ReadsImageRecords(options));
  if (image_records) {
    RETURN_IF_ERROR(OpenImageRecords(options, replica, num_replicas, &input));
    return input;
  }
  const int64_t pixels = int64_t{options.height} * options.width * options.channels;
  const int64_t synthetic_examples = std::max<int64_t>(options.batch_size, num_replicas);
  if (replica >= 0) {
    if (options.synthetic) {
      input.train =
          SyntheticDataset(synthetic_examples, pixels, options.num_classes, options.seed);
    } else {
      ASSIGN_OR_RETURN(input.train, ReadDataset(options, options.train_data, "train"));
    }
    input.train_examples = input.train.size();
  }
  if (replica <= 0) {  // The chief and the evaluator.
    if (options.synthetic) {
      input.test =
          SyntheticDataset(synthetic_examples, pixels, options.num_classes, options.seed + 1);
    } else {
      ASSIGN_OR_RETURN(input.test, ReadDataset(options, options.test_data, "t10k"));
    }
  }
  return input;
}

}  // namespace psrt
