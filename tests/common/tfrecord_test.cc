#include "common/tfrecord.h"

#include <sys/stat.h>
#include <zlib.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace psrt {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string TestPath(const std::string& name) {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  return absl::StrCat(testing::TempDir(), "/tfrecord_test_", info->name(), "_",
                      name);
}

void WriteRaw(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), bytes.size());
  ASSERT_TRUE(f.good()) << path;
}

std::string ReadRaw(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string Gzip(const std::string& bytes) {
  const std::string path = TestPath("gzip_scratch");
  gzFile f = gzopen(path.c_str(), "wb");
  EXPECT_NE(f, nullptr);
  EXPECT_EQ(gzwrite(f, bytes.data(), bytes.size()), int(bytes.size()));
  EXPECT_EQ(gzclose(f), Z_OK);
  return ReadRaw(path);
}

absl::Status WriteRecords(const std::string& path,
                          const std::vector<std::string>& records,
                          TFRecordCompression compression =
                              TFRecordCompression::kNone) {
  TFRecordWriterOptions options;
  options.compression = compression;
  auto writer = TFRecordWriter::Open(path, options);
  if (!writer.ok()) return writer.status();
  for (const std::string& r : records) {
    absl::Status s = (*writer)->Write(r);
    if (!s.ok()) return s;
  }
  return (*writer)->Close();
}

// Records of assorted sizes, binary bytes included.
std::vector<std::string> SampleRecords() {
  std::string big(100000, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 31);
  return {"", "x", std::string("\0\xff\n\r\x1f\x8b", 6), big, "last record"};
}

// Two records of 5 data bytes: record 0 at offset 0, record 1 at 21.
constexpr size_t kRecordBytes = 12 + 5 + 4;
std::string TwoSmallRecords() {
  std::string bytes;
  AppendTFRecord("first", &bytes);
  AppendTFRecord("secnd", &bytes);
  return bytes;
}

// Reads `path` to the end; expects InvalidArgument and returns the message.
std::string ReadError(const std::string& path) {
  absl::StatusOr<std::vector<std::string>> records = ReadTFRecordFile(path);
  EXPECT_FALSE(records.ok()) << "read " << records->size() << " records";
  if (records.ok()) return "";
  EXPECT_EQ(records.status().code(), absl::StatusCode::kInvalidArgument)
      << records.status();
  return std::string(records.status().message());
}

TEST(TFRecordTest, RoundTrip) {
  const std::string path = TestPath("round_trip.tfrecord");
  const std::vector<std::string> records = SampleRecords();
  ASSERT_TRUE(WriteRecords(path, records).ok());

  auto reader = TFRecordReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::string record;
  uint64_t offset = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ((*reader)->offset(), offset);
    EXPECT_EQ((*reader)->records_read(), static_cast<int64_t>(i));
    auto more = (*reader)->ReadRecord(&record);
    ASSERT_TRUE(more.ok()) << more.status();
    ASSERT_TRUE(*more);
    EXPECT_EQ(record, records[i]) << i;
    offset += 16 + records[i].size();
  }
  auto more = (*reader)->ReadRecord(&record);
  ASSERT_TRUE(more.ok()) << more.status();
  EXPECT_FALSE(*more);
  EXPECT_EQ((*reader)->offset(), ReadRaw(path).size());
  // The end stays the end.
  EXPECT_FALSE(*(*reader)->ReadRecord(&record));
}

TEST(TFRecordTest, GzipRoundTrip) {
  const std::string path = TestPath("round_trip.tfrecord.gz");
  const std::vector<std::string> records = SampleRecords();
  ASSERT_TRUE(WriteRecords(path, records, TFRecordCompression::kGzip).ok());
  const std::string bytes = ReadRaw(path);
  ASSERT_GE(bytes.size(), 2u);
  EXPECT_EQ(bytes.substr(0, 2), "\x1f\x8b");
  EXPECT_LT(bytes.size(), 50000u);  // The big record is periodic.
  auto read = ReadTFRecordFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, records);
}

// Bytes written by TensorBoard's Python RecordWriter (an independent
// implementation): an empty record, then "hello, tfrecord".
constexpr char kTensorBoardRecordsHex[] =
    "000000000000000029039807d8ea82a2"
    "0f000000000000006d532b09"
    "68656c6c6f2c2074667265636f7264"
    "9f4df5c3";

// A plain file that starts with the gzip magic: its first record is
// 0x8b1f = 35615 bytes long (plus any multiple of 65536).
TEST(TFRecordTest, PlainFileStartingWithGzipMagicIsPlain) {
  for (size_t length : {size_t{0x8b1f}, size_t{0x088b1f}}) {
    const std::string path = TestPath("gzip_magic.tfrecord");
    const std::vector<std::string> records = {std::string(length, 'r'), "two"};
    ASSERT_TRUE(WriteRecords(path, records).ok());
    // 1f 8b 08 is even gzip's "deflate" header.
    const char head[] = {'\x1f', '\x8b', static_cast<char>(length >> 16)};
    ASSERT_EQ(ReadRaw(path).substr(0, 3), std::string(head, 3));
    auto read = ReadTFRecordFile(path);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(*read, records);
    // And its gzip compression is still read as gzip.
    ASSERT_TRUE(WriteRecords(path, records, TFRecordCompression::kGzip).ok());
    read = ReadTFRecordFile(path);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(*read, records);
  }
}

TEST(TFRecordTest, MatchesAnotherImplementationByteForByte) {
  const std::string expected = absl::HexStringToBytes(kTensorBoardRecordsHex);
  const std::string path = TestPath("tensorboard.tfrecord");
  ASSERT_TRUE(WriteRecords(path, {"", "hello, tfrecord"}).ok());
  EXPECT_EQ(absl::BytesToHexString(ReadRaw(path)), kTensorBoardRecordsHex);

  WriteRaw(path, expected);
  auto read = ReadTFRecordFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_THAT(*read, ElementsAre("", "hello, tfrecord"));
}

TEST(TFRecordTest, EmptyFileHasNoRecords) {
  const std::string path = TestPath("empty.tfrecord");
  WriteRaw(path, "");
  auto read = ReadTFRecordFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->empty());
}

TEST(TFRecordTest, MissingFileIsNotFound) {
  const std::string path = TestPath("missing.tfrecord");
  auto reader = TFRecordReader::Open(path);
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(reader.status().message(), HasSubstr(path));
}

TEST(TFRecordTest, TruncationAtEveryByteIsRefused) {
  const std::string bytes = TwoSmallRecords();
  const std::string path = TestPath("truncated.tfrecord");
  for (size_t keep = 1; keep < bytes.size(); ++keep) {
    SCOPED_TRACE(absl::StrCat("keep ", keep, " bytes"));
    WriteRaw(path, bytes.substr(0, keep));
    if (keep == kRecordBytes) {  // A record boundary: a clean end.
      auto read = ReadTFRecordFile(path);
      ASSERT_TRUE(read.ok()) << read.status();
      EXPECT_THAT(*read, ElementsAre("first"));
      continue;
    }
    const size_t record = keep < kRecordBytes ? 0 : 1;
    const size_t start = record * kRecordBytes;
    const size_t in_record = keep - start;
    const char* section = in_record < 8    ? "truncated length:"
                          : in_record < 12 ? "truncated length checksum at"
                          : in_record < 17 ? "truncated data:"
                                           : "truncated data checksum at";
    EXPECT_THAT(ReadError(path),
                AllOf(HasSubstr(path),
                      HasSubstr(absl::StrCat("record ", record,
                                             " at byte offset ", start, ":")),
                      HasSubstr(section)));
  }
}

TEST(TFRecordTest, EveryFlippedBitIsRefused) {
  const std::string bytes = TwoSmallRecords();
  const std::string path = TestPath("flipped.tfrecord");
  for (size_t byte = 0; byte < bytes.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      SCOPED_TRACE(absl::StrCat("byte ", byte, " bit ", bit));
      std::string corrupt = bytes;
      corrupt[byte] ^= static_cast<char>(1 << bit);
      WriteRaw(path, corrupt);
      const size_t record = byte / kRecordBytes;
      const size_t start = record * kRecordBytes;
      const size_t in_record = byte - start;
      const std::string where =
          in_record < 12
              ? absl::StrCat("bad length checksum at byte offset ", start + 8)
              : absl::StrCat("bad data checksum at byte offset ", start + 17);
      EXPECT_THAT(ReadError(path),
                  AllOf(HasSubstr(path),
                        HasSubstr(absl::StrCat("record ", record,
                                               " at byte offset ", start, ":")),
                        HasSubstr(where)));
    }
  }
}

TEST(TFRecordTest, ErrorsAreSticky) {
  std::string bytes = TwoSmallRecords();
  bytes[kRecordBytes + 14] ^= 1;  // Record 1's data.
  const std::string path = TestPath("sticky.tfrecord");
  WriteRaw(path, bytes);
  auto reader = TFRecordReader::Open(path);
  ASSERT_TRUE(reader.ok());
  std::string record;
  ASSERT_TRUE(*(*reader)->ReadRecord(&record));
  EXPECT_EQ(record, "first");
  const absl::Status first = (*reader)->ReadRecord(&record).status();
  EXPECT_EQ(first.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*reader)->ReadRecord(&record).status(), first);
}

// A length field with a good checksum but far more bytes than the file has:
// refused as truncated, without allocating the claimed length.
std::string HugeLengthHeader() {
  std::string header(12, '\0');
  const uint64_t length = uint64_t{1} << 50;
  for (int i = 0; i < 8; ++i) header[i] = static_cast<char>(length >> (8 * i));
  const uint32_t crc = crc32c::Mask(crc32c::Value(header.data(), 8));
  for (int i = 0; i < 4; ++i) header[8 + i] = static_cast<char>(crc >> (8 * i));
  return header + "a few data bytes";
}

TEST(TFRecordTest, HugeLengthIsTruncatedData) {
  const std::string path = TestPath("huge.tfrecord");
  WriteRaw(path, HugeLengthHeader());
  EXPECT_THAT(ReadError(path),
              AllOf(HasSubstr(path), HasSubstr("record 0 at byte offset 0"),
                    HasSubstr("truncated data: the length field says "
                              "1125899906842624 bytes at byte offset 12, the "
                              "file ends after 16")));
  WriteRaw(path, Gzip(HugeLengthHeader()));
  EXPECT_THAT(ReadError(path),
              AllOf(HasSubstr(path), HasSubstr("truncated data"),
                    HasSubstr("the file ends after 16")));
}

TEST(TFRecordTest, CorruptGzipIsRefused) {
  const std::string path = TestPath("corrupt.tfrecord.gz");
  std::vector<std::string> records;
  for (int i = 0; i < 50; ++i) records.push_back(absl::StrCat("record ", i));
  ASSERT_TRUE(WriteRecords(path, records, TFRecordCompression::kGzip).ok());
  const std::string bytes = ReadRaw(path);

  WriteRaw(path, bytes.substr(0, bytes.size() - 9));  // Cut the stream.
  EXPECT_THAT(ReadError(path),
              AllOf(HasSubstr(path), HasSubstr("truncated gzip stream")));
  // Damaged compressed data (the 10-byte gzip header and 8-byte trailer left
  // alone): zlib or a record checksum notices.
  for (size_t pos = 10; pos + 8 < bytes.size(); pos += 7) {
    std::string corrupt = bytes;
    corrupt[pos] ^= 0x10;
    WriteRaw(path, corrupt);
    EXPECT_THAT(ReadError(path), HasSubstr(path)) << pos;
  }
}

TEST(TFRecordTest, WriterRefusesMisuse) {
  const std::string path = TestPath("misuse.tfrecord");
  auto writer = TFRecordWriter::Open(path);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Write("a").ok());
  ASSERT_TRUE((*writer)->Flush().ok());
  EXPECT_EQ((*writer)->offset(), 17u);
  EXPECT_EQ(ReadRaw(path).size(), 17u);  // Flushed: visible to readers.
  ASSERT_TRUE((*writer)->Close().ok());
  EXPECT_TRUE((*writer)->Close().ok());
  EXPECT_EQ((*writer)->Write("b").code(),
            absl::StatusCode::kFailedPrecondition);

  TFRecordWriterOptions exclusive;
  exclusive.fail_if_exists = true;
  auto again = TFRecordWriter::Open(path, exclusive);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(again.status().message(), HasSubstr(path));

  auto bad_dir = TFRecordWriter::Open(TestPath("no/such/dir/x.tfrecord"));
  EXPECT_FALSE(bad_dir.ok());
  EXPECT_THAT(bad_dir.status().message(), HasSubstr("no/such/dir/x.tfrecord"));
}

}  // namespace
}  // namespace psrt
