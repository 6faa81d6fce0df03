// Fuzzes the IDX reader (worker/input/idx_dataset.h) with an images file and a
// labels file (plain or gzip), then batches what it reads as a worker does.
//
// Input: byte num_classes + 8 (so 0 and negative counts occur), U16 length
// of the images file, the images file, the labels file (the rest).
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "glog/logging.h"
#include "worker/input/idx_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  psrt::fuzz::InitOnce();
  psrt::fuzz::InputReader in(data, size);
  const int num_classes = static_cast<int>(in.Byte()) - 8;
  const absl::string_view images = in.Bytes(in.U16());
  const absl::string_view labels = in.Rest();
  const std::string images_path = psrt::fuzz::WriteScratchFile("images", images);
  const std::string labels_path = psrt::fuzz::WriteScratchFile("labels", labels);

  absl::StatusOr<psrt::Dataset> read =
      psrt::ReadIdxDataset(images_path, labels_path, num_classes);
  if (!read.ok()) return 0;
  const psrt::Dataset& dataset = *read;
  CHECK_EQ(dataset.images.num_elements(),
           dataset.size() * dataset.rows * dataset.cols);
  for (int32_t label : dataset.labels) CHECK(label >= 0 && label < num_classes);
  for (float v : dataset.images.flat()) CHECK(v >= 0 && v <= 1) << v;
  // What the trainer does with a training set that has an example for it
  // (Trainer::Run refuses one that has none): one worker's batches.
  if (dataset.size() == 0) return 0;
  psrt::BatchIterator batches(&dataset, 0, 1, /*shuffle=*/true, /*seed=*/1);
  psrt::Tensor batch;
  std::vector<int32_t> batch_labels;
  batches.NextBatch(3, &batch, &batch_labels);
  return 0;
}
