// OpenWorkerInput: the one place that picks a worker's data format and
// opens its training and test data in the form the trainer takes.
//
// Formats: MNIST's IDX files in a directory (Fashion-MNIST by default),
// TFRecord files of tf.train.Example with 28x28-style flat images, image
// records as build_image_data.py writes them (JPEG/PNG, decoded by the image
// pipeline), or synthetic random data. kAuto reads image records when the
// first file of --train_data (else --test_data) holds them, else IDX or
// TFRecord data sets.
//
// What each replica opens: replica r >= 0 its shard of the training set
// (examples i % num_replicas == r, or the image files of shard r); the chief
// (replica 0) and the evaluator (replica -1) the whole test set as well; the
// evaluator no training set.
//
// Thread safety: a function; the WorkerInput it returns is not thread-safe.
#ifndef PSRT_WORKER_INPUT_INPUT_FACTORY_H_
#define PSRT_WORKER_INPUT_INPUT_FACTORY_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/input/batch_source.h"
#include "worker/input/dataset.h"

namespace psrt {

struct InputOptions {
  // kCriteo: Criteo click logs (criteo_batch_source.h) for the CTR models.
  enum class Format { kAuto, kMnist, kImages, kCriteo };
  Format format = Format::kAuto;
  std::string data_dir;    // IDX files (kMnist without train/test data).
  std::string train_data;  // TFRecord or image-record file pattern.
  std::string test_data;
  bool synthetic = false;  // Random images and labels instead of files.
  // The model's input: every data set must fit it.
  int height = 28;
  int width = 28;
  int channels = 1;
  int num_classes = 10;
  std::string model;  // For error messages.
  int batch_size = 100;
  bool shuffle = true;
  uint64_t seed = 1;
  // Image records.
  int decoder_threads = 0;  // 0: one per core.
  int prefetch_batches = 3;
  bool records_in_memory = true;  // Else offsets only, read back per image.
  bool skip_corrupt = false;
  int label_offset = 1;
  // Pixels read from files are byte / 255 * pixel_max: 1 ([0, 1], psrt's
  // models) or 255 ([0, 255], what Keras's image_dataset_from_directory
  // yields and Keras files with a Rescaling(1 / 255) first expect).
  float pixel_max = 1;
  // Criteo: count and skip malformed lines instead of failing.
  bool skip_malformed = false;
};

// "auto", "mnist", "images" or "criteo"; InvalidArgument naming
// --data_format else.
absl::StatusOr<InputOptions::Format> ParseInputFormat(const std::string& name);

// A replica's data. For IDX, TFRecord and synthetic data `train` and `test`
// hold the examples (the trainer shards `train`); for image records and
// Criteo logs (`streamed`) `train_source` and `test_source` make the
// replica's batch streams, and `test_examples` is the test set's size.
// Empty where the replica has none.
struct WorkerInput {
  bool streamed = false;
  Dataset train;
  Dataset test;
  BatchSourceFactory train_source;
  BatchSourceFactory test_source;
  int64_t test_examples = 0;
  // The whole training set's size (about, for image records; 0 for
  // Criteo logs, which are not counted ahead): what an epoch is.
  int64_t train_examples = 0;
};

// InvalidArgument naming the flag or file at fault: unreadable or corrupt
// data, images of another size than the model's, image records without
// both --train_data and --test_data, and so on.
absl::StatusOr<WorkerInput> OpenWorkerInput(const InputOptions& options,
                                            int replica, int num_replicas);

}  // namespace psrt

#endif  // PSRT_WORKER_INPUT_INPUT_FACTORY_H_
