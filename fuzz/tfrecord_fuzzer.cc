// Fuzzes the TFRecord reader (common/tfrecord.h; plain and gzip files) and
// the tf.train.Example decoding of TFRecord input (worker/input/tfrecord_dataset.h)
// with the input as the file.
#include <string>
#include <vector>

#include "common/tfrecord.h"
#include "fuzz/fuzz_util.h"
#include "glog/logging.h"
#include "worker/input/tfrecord_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  psrt::fuzz::InitOnce();
  const std::string path = psrt::fuzz::WriteScratchFile(
      "data.tfrecord", {reinterpret_cast<const char*>(data), size});

  absl::StatusOr<std::vector<std::string>> records = psrt::ReadTFRecordFile(path);
  if (records.ok()) {
    // A plain file that reads cleanly re-encodes to itself (a gzip file's
    // compressed bytes depend on the compressor).
    const bool gzip_magic = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
    if (!gzip_magic) {
      std::string encoded;
      for (const std::string& r : *records) psrt::AppendTFRecord(r, &encoded);
      CHECK(encoded == absl::string_view(reinterpret_cast<const char*>(data), size))
          << "a TFRecord file read cleanly but does not re-encode to itself";
    }
  }

  absl::StatusOr<psrt::Dataset> dataset = psrt::ReadTFRecordDataset(path, 10);
  if (dataset.ok()) {
    CHECK(records.ok());
    CHECK_EQ(dataset->size(), static_cast<int64_t>(records->size()));
    CHECK_EQ(dataset->images.num_elements(),
             dataset->size() * dataset->rows * dataset->cols);
    psrt::BatchIterator batches(&*dataset, 0, 1, /*shuffle=*/false, /*seed=*/1);
    psrt::Tensor batch;
    std::vector<int32_t> labels;
    batches.NextBatch(2, &batch, &labels);
  }
  return 0;
}
