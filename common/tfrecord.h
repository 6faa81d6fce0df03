// TFRecord files: a sequence of binary records, TensorFlow's input and event
// file container (tf.io.TFRecordWriter / tf.data.TFRecordDataset).
//
// Format, each record in turn, integers little-endian:
//   uint64 length
//   uint32 masked_crc32c(length)   (of the 8 length bytes)
//   byte   data[length]
//   uint32 masked_crc32c(data)
// where masked_crc32c is crc32c::Mask(crc32c::Value(...)) (common/crc32c.h).
// There is no file header or footer; an empty file holds no records. A
// GZIP-compressed TFRecord file (TFRecordOptions(compression_type="GZIP"))
// is the gzip compression of that byte stream; the writer produces it on
// request, the reader detects it: a file is gzip when it starts with the gzip
// magic 1f 8b and its first 12 bytes are not a valid record header (a plain
// file's first record may well be 0x8b1f = 35615 bytes long).
//
// The reader refuses corrupt input with an InvalidArgument that names the
// file, the record's index and byte offset and what is wrong, e.g.
//   "/data/train.tfrecord: record 7 at byte offset 5712: bad data checksum at
//    byte offset 5724: stored 0x1c2d3e4f, computed 0x5a6b7c8d"
// (offsets count bytes of the uncompressed stream). A file that ends inside a
// record is "truncated"; only a file that ends exactly after a record (or is
// empty) ends cleanly.
#ifndef PSRT_COMMON_TFRECORD_H_
#define PSRT_COMMON_TFRECORD_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/file_system.h"

struct gzFile_s;  // zlib's file handle (zlib.h stays out of this header).

namespace psrt {

// The 12-byte header and 4-byte footer around every record's data.
constexpr int kTFRecordHeaderBytes = 12;
constexpr int kTFRecordFooterBytes = 4;

// TFRecordReader: reads one file's records in order.
//
// Thread safety: not thread-safe. The reader owns its open file.
class TFRecordReader {
 public:
  // Opens `path` (plain or gzip). NotFound naming the path if it is missing.
  static absl::StatusOr<std::unique_ptr<TFRecordReader>> Open(
      const std::string& path);
  ~TFRecordReader();
  TFRecordReader(const TFRecordReader&) = delete;
  TFRecordReader& operator=(const TFRecordReader&) = delete;

  // Reads the next record into *record (replacing its contents) and returns
  // true; returns false at the clean end of the file. Corrupt input is an
  // InvalidArgument as above; after an error every later call returns it.
  absl::StatusOr<bool> ReadRecord(std::string* record);

  const std::string& path() const { return path_; }
  // Byte offset of the next record, in the uncompressed stream.
  uint64_t offset() const { return offset_; }
  // Records read so far (the index of the next record).
  int64_t records_read() const { return records_read_; }

 private:
  TFRecordReader(std::string path, std::FILE* plain, gzFile_s* gz,
                 int64_t plain_size);
  // Reads up to n bytes; returns how many (fewer only at the end of input).
  absl::StatusOr<size_t> Read(char* dst, size_t n);
  absl::Status Corrupt(absl::string_view what);

  const std::string path_;
  // Exactly one is set: a plain file, or a gzip one read through zlib.
  std::FILE* const plain_;
  gzFile_s* const gz_;
  // A plain regular file's size at Open, which bounds its record lengths;
  // -1 otherwise.
  const int64_t plain_size_;
  uint64_t offset_ = 0;
  int64_t records_read_ = 0;
  absl::Status error_;  // Sticky.
};

// Reads back one record of an open plain (not gzip) TFRecord file: the
// record at byte `offset` whose data is `length` bytes, where a
// TFRecordReader found it. Header, data and footer are read into *scratch
// and checked (the length and both checksums); the data is returned as a
// view into *scratch. DataLoss, saying which, when the file is now shorter
// or the record no longer matches. Thread-safe as `file` is.
absl::StatusOr<absl::string_view> ReadTFRecordAt(const RandomAccessFile& file, int64_t offset,
                                                 int64_t length, std::string* scratch);

// Every record of a file, in order (the reader's errors).
absl::StatusOr<std::vector<std::string>> ReadTFRecordFile(
    const std::string& path);

enum class TFRecordCompression { kNone, kGzip };

struct TFRecordWriterOptions {
  TFRecordCompression compression = TFRecordCompression::kNone;
  // Refuse (AlreadyExists) instead of truncating an existing file.
  bool fail_if_exists = false;
};

// TFRecordWriter: appends records to a new file.
//
// Records are buffered; Flush() hands them to the operating system (so
// other processes see them), Close() flushes and closes (and finishes the
// gzip stream). The destructor closes too but cannot report errors.
// Thread safety: not thread-safe. The writer owns its open file.
class TFRecordWriter {
 public:
  // Creates (or truncates) `path`.
  static absl::StatusOr<std::unique_ptr<TFRecordWriter>> Open(
      const std::string& path, const TFRecordWriterOptions& options = {});
  ~TFRecordWriter();
  TFRecordWriter(const TFRecordWriter&) = delete;
  TFRecordWriter& operator=(const TFRecordWriter&) = delete;

  // After Close(), Write and Flush fail with FailedPrecondition.
  absl::Status Write(absl::string_view record);
  absl::Status Flush();
  // Idempotent.
  absl::Status Close();

  const std::string& path() const { return path_; }
  // Bytes written so far, before compression.
  uint64_t offset() const { return offset_; }

 private:
  TFRecordWriter(std::string path, gzFile_s* file);
  absl::Status WriteBytes(const char* data, size_t n);
  absl::Status IoError(absl::string_view op);

  const std::string path_;
  gzFile_s* file_;  // Plain files too ("transparent" mode); null once closed.
  uint64_t offset_ = 0;
};

// Encodes one record (header, data, footer) into *out, appending.
void AppendTFRecord(absl::string_view data, std::string* out);

}  // namespace psrt

#endif  // PSRT_COMMON_TFRECORD_H_
