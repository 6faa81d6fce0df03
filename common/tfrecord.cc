#include "common/tfrecord.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"
#include "common/status_macros.h"

namespace psrt {
namespace {

// zlib counts in int/unsigned: move at most this much per call.
constexpr size_t kMaxIoChunk = size_t{1} << 30;
// zlib's buffer for reading and writing.
constexpr unsigned kBufferBytes = 256 << 10;
// A gzip stream does not say how long it is: a record is read in chunks of
// this size, so that a huge (but well-checksummed) length field cannot make
// the reader allocate more than the data that is really there, plus this.
constexpr size_t kGrowBytes = size_t{16} << 20;

void EncodeFixed64(uint64_t v, char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(v >> (8 * i));
}
void EncodeFixed32(uint32_t v, char* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>(v >> (8 * i));
}
uint64_t DecodeFixed64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | static_cast<unsigned char>(p[i]);
  return v;
}
uint32_t DecodeFixed32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = v << 8 | static_cast<unsigned char>(p[i]);
  return v;
}

uint32_t MaskedLengthCrc(const char* header) {
  return crc32c::Mask(crc32c::Value(header, 8));
}

// Whether the regular file `fd` (at offset 0) holds gzip data: it starts
// with the gzip magic and its first 12 bytes are not a record header.
bool IsGzip(int fd) {
  char head[kTFRecordHeaderBytes];
  const ssize_t n = ::pread(fd, head, sizeof(head), 0);
  if (n < 2 || head[0] != '\x1f' || head[1] != '\x8b') return false;
  return n < kTFRecordHeaderBytes ||
         DecodeFixed32(head + 8) != MaskedLengthCrc(head);
}

absl::Status ErrnoStatus(int err, absl::string_view what) {
  return absl::Status(absl::ErrnoToStatusCode(err),
                      absl::StrCat(what, ": ", std::strerror(err)));
}

}  // namespace

void AppendTFRecord(absl::string_view data, std::string* out) {
  char header[kTFRecordHeaderBytes];
  EncodeFixed64(data.size(), header);
  EncodeFixed32(crc32c::Mask(crc32c::Value(header, 8)), header + 8);
  char footer[kTFRecordFooterBytes];
  EncodeFixed32(crc32c::Mask(crc32c::Value(data)), footer);
  out->append(header, sizeof(header));
  out->append(data.data(), data.size());
  out->append(footer, sizeof(footer));
}

// ---------------------------------------------------------------- reader

absl::StatusOr<std::unique_ptr<TFRecordReader>> TFRecordReader::Open(
    const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    }
    return ErrnoStatus(err, absl::StrCat(path, ": cannot open"));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a TFRecord file (a directory)"));
  }
  if (S_ISREG(st.st_mode) && !IsGzip(fd)) {
    std::FILE* plain = ::fdopen(fd, "rb");
    if (plain == nullptr) {
      const int err = errno;
      ::close(fd);
      return ErrnoStatus(err, absl::StrCat(path, ": cannot open"));
    }
    std::setvbuf(plain, nullptr, _IOFBF, kBufferBytes);
    return std::unique_ptr<TFRecordReader>(new TFRecordReader(
        path, plain, nullptr, static_cast<int64_t>(st.st_size)));
  }
  // Gzip, or a pipe, which zlib sniffs (reading plain data through as is).
  gzFile gz = gzdopen(fd, "rb");
  if (gz == nullptr) {
    ::close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat(path, ": cannot allocate a zlib reader"));
  }
  gzbuffer(gz, kBufferBytes);
  return std::unique_ptr<TFRecordReader>(
      new TFRecordReader(path, nullptr, gz, -1));
}

TFRecordReader::TFRecordReader(std::string path, std::FILE* plain,
                               gzFile_s* gz, int64_t plain_size)
    : path_(std::move(path)), plain_(plain), gz_(gz), plain_size_(plain_size) {}

TFRecordReader::~TFRecordReader() {
  if (plain_ != nullptr) std::fclose(plain_);
  if (gz_ != nullptr) gzclose_r(gz_);
}

absl::StatusOr<size_t> TFRecordReader::Read(char* dst, size_t n) {
  if (plain_ != nullptr) {
    const size_t got = std::fread(dst, 1, n, plain_);
    if (got < n && std::ferror(plain_)) {
      return ErrnoStatus(errno, absl::StrCat(path_, ": read error at byte ",
                                             offset_ + got));
    }
    return got;
  }
  size_t done = 0;
  while (done < n) {
    const unsigned want =
        static_cast<unsigned>(std::min(n - done, kMaxIoChunk));
    const int got = gzread(gz_, dst + done, want);
    if (got > 0) done += got;
    if (got == static_cast<int>(want)) continue;
    int errnum = Z_OK;
    const char* msg = gzerror(gz_, &errnum);
    if (errnum == Z_ERRNO) {
      return ErrnoStatus(errno, absl::StrCat(path_, ": read error at byte ",
                                             offset_ + done));
    }
    if (errnum == Z_BUF_ERROR) {  // zlib's "unexpected end of file".
      return Corrupt(absl::StrCat("truncated gzip stream: it ends at "
                                  "uncompressed byte offset ",
                                  offset_ + done));
    }
    if (errnum != Z_OK) {
      // zlib names the file "<fd:N>" (it was opened by descriptor): drop it.
      absl::string_view why = msg;
      if (absl::StartsWith(why, "<fd:") && why.find(": ") != why.npos) {
        why.remove_prefix(why.find(": ") + 2);
      }
      return Corrupt(absl::StrCat("corrupt gzip stream: ", why,
                                  " (reading past uncompressed byte offset ",
                                  offset_ + done, ")"));
    }
    if (got <= 0) break;  // End of input.
  }
  return done;
}

absl::Status TFRecordReader::Corrupt(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(
      path_, ": record ", records_read_, " at byte offset ", offset_, ": ",
      what));
}

absl::StatusOr<bool> TFRecordReader::ReadRecord(std::string* record) {
  if (!error_.ok()) return error_;
  auto fail = [&](absl::Status status) {
    error_ = std::move(status);
    return error_;
  };
  char header[kTFRecordHeaderBytes];
  absl::StatusOr<size_t> got = Read(header, sizeof(header));
  if (!got.ok()) return fail(got.status());
  if (*got == 0) return false;  // Clean end: right after a record.
  if (*got < 8) {
    return fail(Corrupt(absl::StrCat("truncated length: ", *got,
                                     " of its 8 bytes present")));
  }
  if (*got < sizeof(header)) {
    return fail(Corrupt(absl::StrCat("truncated length checksum at byte offset ",
                                     offset_ + 8, ": ", *got - 8,
                                     " of its 4 bytes present")));
  }
  const uint64_t length = DecodeFixed64(header);
  const uint32_t stored_length_crc = DecodeFixed32(header + 8);
  const uint32_t length_crc = MaskedLengthCrc(header);
  if (stored_length_crc != length_crc) {
    return fail(Corrupt(absl::StrFormat(
        "bad length checksum at byte offset %d: stored 0x%08x, computed "
        "0x%08x from length %d (corrupt length or checksum)",
        offset_ + 8, stored_length_crc, length_crc, length)));
  }
  const uint64_t data_offset = offset_ + kTFRecordHeaderBytes;
  auto truncated_data = [&](uint64_t have) {
    return Corrupt(absl::StrCat("truncated data: the length field says ",
                                length, " bytes at byte offset ", data_offset,
                                ", the file ends after ", have));
  };
  if (plain_size_ >= 0 &&
      length > static_cast<uint64_t>(plain_size_) - std::min<uint64_t>(
                                                        data_offset, plain_size_)) {
    return fail(truncated_data(plain_size_ - data_offset));
  }
  record->clear();
  while (record->size() < length) {
    const size_t have = record->size();
    const size_t want = static_cast<size_t>(
        plain_size_ >= 0 ? length - have
                         : std::min<uint64_t>(length - have, kGrowBytes));
    record->resize(have + want);
    absl::StatusOr<size_t> n = Read(record->data() + have, want);
    if (!n.ok()) return fail(n.status());
    if (*n < want) {
      record->resize(have + *n);
      return fail(truncated_data(record->size()));
    }
  }
  char footer[kTFRecordFooterBytes];
  got = Read(footer, sizeof(footer));
  if (!got.ok()) return fail(got.status());
  if (*got < sizeof(footer)) {
    return fail(Corrupt(absl::StrCat("truncated data checksum at byte offset ",
                                     data_offset + length, ": ", *got,
                                     " of its 4 bytes present")));
  }
  const uint32_t stored_crc = DecodeFixed32(footer);
  const uint32_t crc = crc32c::Mask(crc32c::Value(*record));
  if (stored_crc != crc) {
    return fail(Corrupt(absl::StrFormat(
        "bad data checksum at byte offset %d: stored 0x%08x, computed 0x%08x "
        "over the %d data bytes (corrupt data or checksum)",
        data_offset + length, stored_crc, crc, length)));
  }
  offset_ = data_offset + length + kTFRecordFooterBytes;
  ++records_read_;
  return true;
}

absl::StatusOr<absl::string_view> ReadTFRecordAt(const RandomAccessFile& file, int64_t offset,
                                                 int64_t length, std::string* scratch) {
  const int64_t n = kTFRecordHeaderBytes + length + kTFRecordFooterBytes;
  scratch->resize(n);
  absl::Status read = file.ReadAt(offset, n, scratch->data());
  if (!read.ok()) {
    return absl::DataLossError(absl::StrCat("reading the record at byte offset ", offset,
                                            ", indexed before: ", read.message()));
  }
  const char* header = scratch->data();
  const absl::string_view data(header + kTFRecordHeaderBytes, length);
  if (DecodeFixed64(header) != static_cast<uint64_t>(length) ||
      DecodeFixed32(header + 8) != MaskedLengthCrc(header) ||
      DecodeFixed32(data.data() + length) != crc32c::Mask(crc32c::Value(data))) {
    return absl::DataLossError(absl::StrCat(
        "the record at byte offset ", offset, " changed since it was indexed (its length "
        "or data checksum does not match)"));
  }
  return data;
}

absl::StatusOr<std::vector<std::string>> ReadTFRecordFile(
    const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<TFRecordReader> reader,
                   TFRecordReader::Open(path));
  std::vector<std::string> records;
  std::string record;
  for (;;) {
    ASSIGN_OR_RETURN(const bool more, reader->ReadRecord(&record));
    if (!more) break;
    records.push_back(std::move(record));
  }
  return records;
}

// ---------------------------------------------------------------- writer

absl::StatusOr<std::unique_ptr<TFRecordWriter>> TFRecordWriter::Open(
    const std::string& path, const TFRecordWriterOptions& options) {
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC |
                    (options.fail_if_exists ? O_EXCL : O_TRUNC);
  const int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) {
    const int err = errno;
    if (err == EEXIST) {
      return absl::AlreadyExistsError(absl::StrCat(path, ": already exists"));
    }
    return ErrnoStatus(err, absl::StrCat(path, ": cannot create"));
  }
  // "T": transparent, i.e. no compression; "6": gzip's default level.
  const char* mode =
      options.compression == TFRecordCompression::kGzip ? "wb6" : "wbT";
  gzFile file = gzdopen(fd, mode);
  if (file == nullptr) {
    ::close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat(path, ": cannot allocate a zlib writer"));
  }
  gzbuffer(file, kBufferBytes);
  return std::unique_ptr<TFRecordWriter>(new TFRecordWriter(path, file));
}

TFRecordWriter::TFRecordWriter(std::string path, gzFile_s* file)
    : path_(std::move(path)), file_(file) {}

TFRecordWriter::~TFRecordWriter() { Close().IgnoreError(); }

absl::Status TFRecordWriter::IoError(absl::string_view op) {
  int errnum = Z_OK;
  const char* msg = gzerror(file_, &errnum);
  if (errnum == Z_ERRNO) {
    return ErrnoStatus(errno, absl::StrCat(path_, ": ", op, " failed"));
  }
  return absl::InternalError(
      absl::StrCat(path_, ": ", op, " failed: ", msg));
}

absl::Status TFRecordWriter::WriteBytes(const char* data, size_t n) {
  while (n > 0) {
    const unsigned chunk = static_cast<unsigned>(std::min(n, kMaxIoChunk));
    if (gzwrite(file_, data, chunk) != static_cast<int>(chunk)) {
      return IoError("write");
    }
    data += chunk;
    n -= chunk;
  }
  return absl::OkStatus();
}

absl::Status TFRecordWriter::Write(absl::string_view record) {
  if (file_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": write after Close()"));
  }
  char header[kTFRecordHeaderBytes];
  EncodeFixed64(record.size(), header);
  EncodeFixed32(crc32c::Mask(crc32c::Value(header, 8)), header + 8);
  char footer[kTFRecordFooterBytes];
  EncodeFixed32(crc32c::Mask(crc32c::Value(record)), footer);
  RETURN_IF_ERROR(WriteBytes(header, sizeof(header)));
  RETURN_IF_ERROR(WriteBytes(record.data(), record.size()));
  RETURN_IF_ERROR(WriteBytes(footer, sizeof(footer)));
  offset_ += kTFRecordHeaderBytes + record.size() + kTFRecordFooterBytes;
  return absl::OkStatus();
}

absl::Status TFRecordWriter::Flush() {
  if (file_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": flush after Close()"));
  }
  if (gzflush(file_, Z_SYNC_FLUSH) != Z_OK) return IoError("flush");
  return absl::OkStatus();
}

absl::Status TFRecordWriter::Close() {
  if (file_ == nullptr) return absl::OkStatus();
  gzFile file = file_;
  file_ = nullptr;
  const int ret = gzclose_w(file);
  if (ret == Z_ERRNO) {
    return ErrnoStatus(errno, absl::StrCat(path_, ": close failed"));
  }
  if (ret != Z_OK) {
    return absl::InternalError(
        absl::StrCat(path_, ": close failed (zlib code ", ret, ")"));
  }
  return absl::OkStatus();
}

}  // namespace psrt
