#include "worker/input/criteo_batch_source.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace psrt {
namespace {

constexpr int kReadBlock = 4096;  // Examples a Skip reads at a time.

}  // namespace

absl::StatusOr<std::unique_ptr<CriteoBatchSource>> CriteoBatchSource::Open(
    CriteoReader::Options options) {
  ASSIGN_OR_RETURN(std::unique_ptr<CriteoReader> reader, CriteoReader::Open(std::move(options)));
  return std::unique_ptr<CriteoBatchSource>(new CriteoBatchSource(std::move(reader)));
}

CriteoBatchSource::CriteoBatchSource(std::unique_ptr<CriteoReader> reader)
    : reader_(std::move(reader)) {}

absl::Status CriteoBatchSource::Append(int n) {
  bool rewound = false;
  int64_t malformed_before_epoch = 0;  // Lines skipped before the last rewind.
  while (n > 0) {
    RETURN_IF_ERROR(reader_->Read(n, &read_));
    if (read_.size() == 0) {
      if (rewound) {  // A whole epoch without an example.
        const int64_t skipped = reader_->malformed_lines() - malformed_before_epoch;
        return absl::FailedPreconditionError(absl::StrCat(
            "Criteo input: this worker's shard of the files holds no example (fewer lines "
            "than workers?)",
            skipped > 0 ? absl::StrCat("; its ", skipped,
                                       " lines were malformed and skipped (--malformed_lines=skip)")
                        : ""));
      }
      malformed_before_epoch = reader_->malformed_lines();
      RETURN_IF_ERROR(reader_->Rewind());
      rewound = true;
      continue;
    }
    rewound = false;
    batch_.dense.insert(batch_.dense.end(), read_.dense.begin(), read_.dense.end());
    batch_.ids.insert(batch_.ids.end(), read_.ids.begin(), read_.ids.end());
    batch_.labels.insert(batch_.labels.end(), read_.labels.begin(), read_.labels.end());
    n -= read_.size();
  }
  return absl::OkStatus();
}

absl::Status CriteoBatchSource::NextBatch(int batch_size, Tensor* images,
                                          std::vector<int32_t>* labels) {
  batch_.dense.clear();
  batch_.ids.clear();
  batch_.labels.clear();
  RETURN_IF_ERROR(Append(batch_size));
  images->Resize({batch_size, kCriteoDenseFields});
  std::copy(batch_.dense.begin(), batch_.dense.end(), images->data());
  labels->assign(batch_.labels.begin(), batch_.labels.end());
  ids_.swap(batch_.ids);
  return absl::OkStatus();
}

absl::Status CriteoBatchSource::Skip(int64_t examples) {
  while (examples > 0) {
    batch_.dense.clear();
    batch_.ids.clear();
    batch_.labels.clear();
    const int n = static_cast<int>(std::min<int64_t>(examples, kReadBlock));
    RETURN_IF_ERROR(Append(n));
    examples -= n;
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CountCriteoExamples(const CriteoReader::Options& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<CriteoReader> reader, CriteoReader::Open(options));
  CtrBatch batch;
  int64_t count = 0;
  do {
    RETURN_IF_ERROR(reader->Read(kReadBlock, &batch));
    count += batch.size();
  } while (batch.size() > 0);
  if (count == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Criteo input: ", absl::StrJoin(options.files, ", "), " holds no example",
                     reader->malformed_lines() > 0
                         ? absl::StrCat(" (", reader->malformed_lines(), " malformed lines skipped)")
                         : ""));
  }
  return count;
}

}  // namespace psrt
