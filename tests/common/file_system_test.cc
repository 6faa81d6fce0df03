#include "common/file_system.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/tfrecord.h"

namespace psrt {
namespace {

using ::testing::HasSubstr;

class FileSystemTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/file_system_test.", ::getpid());
    ::mkdir(dir_.c_str(), 0700);
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string Write(const std::string& name, const std::string& contents) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << contents;
    return path;
  }

  FileSystem* fs_ = FileSystem::Default();
  std::string dir_;
};

TEST_F(FileSystemTest, ReadsWholeFilesAndSaysWhyItCannot) {
  std::string big(200000, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7);
  EXPECT_EQ(*fs_->ReadFile(Write("big", big)), big);
  EXPECT_EQ(*fs_->ReadFile(Write("empty", "")), "");
  const absl::StatusOr<std::string> missing = fs_->ReadFile(dir_ + "/nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr(dir_ + "/nope: cannot open: No such file"));
  // A directory opens but does not read.
  const absl::StatusOr<std::string> directory = fs_->ReadFile(dir_);
  ASSERT_FALSE(directory.ok());
  EXPECT_TRUE(absl::IsDataLoss(directory.status())) << directory.status();
  EXPECT_THAT(std::string(directory.status().message()), HasSubstr(dir_ + ": read error"));
}

TEST_F(FileSystemTest, ReadsAtOffsetsAndRefusesToReadPastTheEnd) {
  const std::string path = Write("f", "0123456789");
  EXPECT_EQ(*fs_->FileSize(path), 10);
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> file = fs_->OpenRandomAccess(path);
  ASSERT_TRUE(file.ok()) << file.status();
  char buf[8];
  ASSERT_TRUE((*file)->ReadAt(3, 4, buf).ok());
  EXPECT_EQ(std::string(buf, 4), "3456");
  const absl::Status past = (*file)->ReadAt(8, 4, buf);
  EXPECT_TRUE(absl::IsDataLoss(past)) << past;
  EXPECT_THAT(std::string(past.message()), HasSubstr("the file ends at byte 10"));
  EXPECT_TRUE(absl::IsNotFound(fs_->OpenRandomAccess(dir_ + "/nope").status()));
  EXPECT_TRUE(absl::IsNotFound(fs_->FileSize(dir_ + "/nope").status()));
}

TEST_F(FileSystemTest, ListsADirectorySorted) {
  Write("b", "");
  Write("a", "");
  Write("c", "");
  EXPECT_THAT(*fs_->ListDirectory(dir_), ::testing::ElementsAre("a", "b", "c"));
  EXPECT_TRUE(absl::IsNotFound(fs_->ListDirectory(dir_ + "/nope").status()));
}

// A file whose bytes change under its reader: ReadTFRecordAt (which the
// image pipeline reads records back with) refuses it instead of returning
// other bytes.
class FlippingFile : public RandomAccessFile {
 public:
  FlippingFile(std::unique_ptr<RandomAccessFile> real, int64_t flip_at)
      : real_(std::move(real)), flip_at_(flip_at) {}
  absl::Status ReadAt(int64_t offset, size_t n, char* scratch) const override {
    absl::Status read = real_->ReadAt(offset, n, scratch);
    if (read.ok() && flip_at_ >= offset && flip_at_ < offset + static_cast<int64_t>(n)) {
      scratch[flip_at_ - offset] ^= 1;
    }
    return read;
  }

 private:
  std::unique_ptr<RandomAccessFile> real_;
  int64_t flip_at_;
};

TEST_F(FileSystemTest, ARecordReadBackIsCheckedAgainstItsChecksums) {
  const std::string path = dir_ + "/records";
  {
    auto writer = TFRecordWriter::Open(path, {});
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->Write("first").ok());
    ASSERT_TRUE((*writer)->Write("second record").ok());
    ASSERT_TRUE((*writer)->Close().ok());
  }
  const int64_t second = kTFRecordHeaderBytes + 5 + kTFRecordFooterBytes;
  std::string scratch;
  auto file = fs_->OpenRandomAccess(path);
  ASSERT_TRUE(file.ok());
  absl::StatusOr<absl::string_view> data = ReadTFRecordAt(**file, second, 13, &scratch);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(*data, "second record");
  // A flipped bit in the length, its checksum, the data or the footer.
  for (int64_t at : {int64_t{0}, int64_t{9}, int64_t{kTFRecordHeaderBytes + 3},
                     int64_t{kTFRecordHeaderBytes + 13}}) {
    FlippingFile flipping(*fs_->OpenRandomAccess(path), second + at);
    const absl::StatusOr<absl::string_view> bad = ReadTFRecordAt(flipping, second, 13, &scratch);
    ASSERT_FALSE(bad.ok()) << at;
    EXPECT_TRUE(absl::IsDataLoss(bad.status())) << bad.status();
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr("changed since it was indexed"));
  }
  // A file cut short since.
  const absl::StatusOr<absl::string_view> cut = ReadTFRecordAt(**file, second, 14, &scratch);
  ASSERT_FALSE(cut.ok());
  EXPECT_THAT(std::string(cut.status().message()), HasSubstr("the file ends at byte"));
}

}  // namespace
}  // namespace psrt
