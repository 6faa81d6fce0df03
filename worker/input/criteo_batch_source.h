// CriteoBatchSource: a replica's batches of Criteo click logs
// (criteo_reader.h) as the CTR models take them: the dense features as the
// batch's "images" [batch, 13] (log(1 + x)), the labels (0 or 1), and the
// categorical ids as sparse_ids() [batch, 26]. It reads its shard of the
// files in order (the lines i % num_shards == shard), starting the next
// epoch where the files end; a shard with no line is an error.
//
// Thread safety: not thread-safe; one consumer calls it.
#ifndef PSRT_WORKER_INPUT_CRITEO_BATCH_SOURCE_H_
#define PSRT_WORKER_INPUT_CRITEO_BATCH_SOURCE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/input/batch_source.h"
#include "worker/input/criteo_reader.h"

namespace psrt {

class CriteoBatchSource : public BatchSource {
 public:
  // CriteoReader::Open's errors.
  static absl::StatusOr<std::unique_ptr<CriteoBatchSource>> Open(CriteoReader::Options options);

  absl::Status NextBatch(int batch_size, Tensor* images, std::vector<int32_t>* labels) override;
  absl::Status Skip(int64_t examples) override;
  absl::Span<const uint64_t> sparse_ids() const override { return ids_; }

 private:
  explicit CriteoBatchSource(std::unique_ptr<CriteoReader> reader);
  // Appends up to `n` examples to the batch (the next epoch's when the
  // files end); n of them unless the shard holds none.
  absl::Status Append(int n);

  std::unique_ptr<CriteoReader> reader_;
  CtrBatch read_;   // The reader's last batch.
  CtrBatch batch_;  // The batch being made.
  std::vector<uint64_t> ids_;
};

// The examples in `files` (all shards), read once: the size of a test set.
absl::StatusOr<int64_t> CountCriteoExamples(const CriteoReader::Options& options);

}  // namespace psrt

#endif  // PSRT_WORKER_INPUT_CRITEO_BATCH_SOURCE_H_
