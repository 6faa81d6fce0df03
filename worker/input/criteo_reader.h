// CriteoReader: examples of Criteo's click logs (the Display Advertising
// Challenge and Terabyte data sets) for CTR models. One example per line,
// tab-separated:
//
//   label \t I1 ... I13 \t C1 ... C26
//
// label 0 or 1; I1..I13 integer counts; C1..C26 eight hex digits (a hashed
// category); any I or C may be empty (missing). An example becomes:
//   - dense[13]: log(1 + x) for a count x, 0 when missing (a negative count,
//     which Criteo's own files hold in I2, counts as 0, as DLRM reads it);
//   - ids[26]: a 64-bit id per categorical field, keyed by the field
//     (CriteoId), so that one table can hold every field and equal hex
//     values of two fields stay apart; a missing value has an id of its own
//     per field;
//   - label.
// Files are plain or gzip (told apart by their first bytes), read as a
// stream in order; a worker reads its shard: the lines whose index over all
// files, counted from 0, is shard modulo num_shards. A malformed line (a
// field count other than 40, a label other than 0 or 1, a count that is not
// an integer, a category that is not 8 hex digits) is InvalidArgument
// naming the file and line, or, with skip_malformed, counted and skipped
// (the first 10 logged with file, line and fault, then each power of ten).
//
// Thread safety: not thread-safe; one reader per consumer.
#ifndef PSRT_WORKER_INPUT_CRITEO_READER_H_
#define PSRT_WORKER_INPUT_CRITEO_READER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace psrt {

constexpr int kCriteoDenseFields = 13;
constexpr int kCriteoCategoricalFields = 26;

// The id of categorical field `field` (0..25) holding `value` (the 8 hex
// digits' 32 bits), or, with value = kCriteoMissing, the field's missing
// value: (field << 33) | value.
constexpr uint64_t kCriteoMissing = uint64_t{1} << 32;
constexpr uint64_t CriteoId(int field, uint64_t value) {
  return (static_cast<uint64_t>(field) << 33) | value;
}

// A batch of examples, row-major: dense [n, 13], ids [n, 26], labels [n].
struct CtrBatch {
  std::vector<float> dense;
  std::vector<uint64_t> ids;
  std::vector<int32_t> labels;
  int size() const { return static_cast<int>(labels.size()); }
};

class CriteoReader {
 public:
  struct Options {
    std::vector<std::string> files;  // Read in this order.
    int shard = 0;                   // This reader's lines: index % num_shards == shard.
    int num_shards = 1;
    bool skip_malformed = false;     // Count and skip, instead of failing.
  };

  // InvalidArgument for a shard outside [0, num_shards) or no files;
  // NotFound (naming it) for a file that cannot be opened, found here or
  // when the reader reaches it.
  static absl::StatusOr<std::unique_ptr<CriteoReader>> Open(Options options);
  ~CriteoReader();
  CriteoReader(const CriteoReader&) = delete;
  CriteoReader& operator=(const CriteoReader&) = delete;

  // Replaces *batch with up to `batch_size` examples of this shard, from
  // where the last call stopped; fewer (0 at the end) when the files end:
  // Rewind starts the next epoch. A malformed line, or a file that cannot
  // be read, is the error (the examples before it in this call are lost).
  absl::Status Read(int batch_size, CtrBatch* batch);
  // Back to the first line of the first file.
  absl::Status Rewind();

  // Malformed lines skipped so far (with skip_malformed), over all epochs.
  int64_t malformed_lines() const { return malformed_; }

 private:
  explicit CriteoReader(Options options);
  // The next line of this shard into line_, with its file and number;
  // false at the end of the files.
  absl::StatusOr<bool> NextLine();
  absl::Status OpenFile(size_t index);

  const Options options_;
  struct File;
  std::unique_ptr<File> file_;  // The open file, if any.
  size_t file_index_ = 0;       // options_.files[file_index_] is open.
  int64_t line_in_file_ = 0;    // 1-based number of line_ in its file.
  int64_t line_index_ = 0;      // Lines seen over all files this epoch.
  std::string line_;
  int64_t malformed_ = 0;
};

// Parses one line (without its newline) into dense[13], ids[26] and *label;
// InvalidArgument saying what is wrong with it (which field).
absl::Status ParseCriteoLine(absl::string_view line, float* dense, uint64_t* ids,
                             int32_t* label);

}  // namespace psrt

#endif  // PSRT_WORKER_INPUT_CRITEO_READER_H_
