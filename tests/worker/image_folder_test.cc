#include "worker/input/image_folder.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tfrecord.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/input/image_decoder.h"
#include "worker/input/image_records.h"
#include "worker/input/synthetic_images.h"

namespace psrt {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string TestDir() {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  const std::string dir =
      absl::StrCat(testing::TempDir(), "/image_folder_test_", info->name(), "_", ::getpid());
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

std::vector<ImageRecord> ReadAll(const std::vector<std::string>& files) {
  std::vector<ImageRecord> records;
  for (const std::string& file : files) {
    absl::StatusOr<std::vector<std::string>> serialized = ReadTFRecordFile(file);
    EXPECT_TRUE(serialized.ok()) << serialized.status();
    for (const std::string& s : *serialized) records.push_back(*ParseImageExample(s));
  }
  return records;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A few hundred generated images, 1 in 5 a PNG, through the converter.
TEST(ImageFolderTest, ConvertsClassFoldersWithBuildImageDataLabels) {
  const std::string dir = TestDir();
  SyntheticFolderOptions generate;
  generate.num_classes = 3;
  generate.per_class = 70;
  generate.height = 20;
  generate.width = 28;
  generate.png_every = 5;
  ASSERT_TRUE(WriteSyntheticImageFolder(dir + "/in", generate).ok());
  ImageFolderOptions options;
  options.in_dir = dir + "/in";
  options.out_dir = dir + "/out";
  options.train_shards = 3;
  options.validation_percent = 20;
  absl::StatusOr<ImageFolderSummary> summary = ConvertImageFolder(options);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_THAT(summary->classes, ElementsAre("class_00", "class_01", "class_02"));
  EXPECT_EQ(summary->train_examples, 168);
  EXPECT_EQ(summary->validation_examples, 42);
  EXPECT_EQ(summary->png_examples, 42);
  EXPECT_THAT(
      summary->files,
      ElementsAre(dir + "/out/train-00000-of-00003", dir + "/out/train-00001-of-00003",
                  dir + "/out/train-00002-of-00003", dir + "/out/validation-00000-of-00001"));
  EXPECT_EQ(Slurp(dir + "/out/labels.txt"), "class_00\nclass_01\nclass_02\n");

  const std::vector<ImageRecord> records = ReadAll(summary->files);
  ASSERT_EQ(records.size(), 210u);
  std::set<std::string> names;
  int png = 0;
  for (const ImageRecord& r : records) {
    // Labels 1..N in sorted folder order; the text names the folder.
    ASSERT_GE(r.label, 1);
    ASSERT_LE(r.label, 3);
    EXPECT_EQ(r.text, absl::StrCat("class_0", r.label - 1));
    EXPECT_EQ(r.height, 20);
    EXPECT_EQ(r.width, 28);
    EXPECT_EQ(r.channels, 3);
    EXPECT_EQ(r.colorspace, "RGB");
    // The bytes are the file's, as stored.
    EXPECT_EQ(r.encoded, Slurp(absl::StrCat(dir, "/in/", r.text, "/", r.filename)));
    const bool is_png = r.format == "PNG";
    EXPECT_EQ(DetectImageFormat(r.encoded), is_png ? ImageFormat::kPng : ImageFormat::kJpeg);
    png += is_png;
    names.insert(r.text + "/" + r.filename);
  }
  EXPECT_EQ(png, 42);
  EXPECT_EQ(names.size(), 210u);  // Every image once.
  // Shuffled before sharding: the first shard mixes the classes.
  std::set<int64_t> first_shard_labels;
  for (size_t i = 0; i < 56; ++i) first_shard_labels.insert(records[i].label);
  EXPECT_EQ(first_shard_labels.size(), 3u);

  // psrt reads them with class ids 0..2.
  ImageShardOptions read;
  read.num_classes = 3;
  absl::StatusOr<ImageShard> shard =
      ReadImageShard({summary->files.begin(), summary->files.end() - 1}, read);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(shard->size(), 168);
  for (int32_t label : shard->labels) EXPECT_TRUE(label >= 0 && label < 3);
}

TEST(ImageFolderTest, ThreadsWriteTheSameFiles) {
  const std::string dir = TestDir();
  SyntheticFolderOptions generate;
  generate.num_classes = 2;
  generate.per_class = 20;
  generate.height = generate.width = 12;
  ASSERT_TRUE(WriteSyntheticImageFolder(dir + "/in", generate).ok());
  std::vector<std::vector<std::string>> contents;
  for (int threads : {1, 3}) {
    ImageFolderOptions options;
    options.in_dir = dir + "/in";
    options.out_dir = absl::StrCat(dir, "/out", threads);
    options.train_shards = 4;
    options.validation_percent = 25;
    options.validation_shards = 2;
    options.threads = threads;
    absl::StatusOr<ImageFolderSummary> summary = ConvertImageFolder(options);
    ASSERT_TRUE(summary.ok()) << summary.status();
    ASSERT_EQ(summary->files.size(), 6u);
    EXPECT_EQ(summary->files[5], options.out_dir + "/validation-00001-of-00002");
    std::vector<std::string> bytes;
    for (const std::string& f : summary->files) bytes.push_back(Slurp(f));
    contents.push_back(bytes);
  }
  EXPECT_TRUE(contents[0] == contents[1]);  // Byte for byte.
}

TEST(ImageFolderTest, ABadImageNamesItsFile) {
  const std::string dir = TestDir();
  ::mkdir((dir + "/in").c_str(), 0755);
  ::mkdir((dir + "/in/cats").c_str(), 0755);
  std::ofstream(dir + "/in/cats/a.jpg") << *EncodeJpeg(SyntheticImage(0, 1, 8, 8, 1));
  std::ofstream(dir + "/in/cats/b.jpg") << "\xff\xd8\xff not really";
  std::ofstream(dir + "/in/cats/notes.txt") << "skipped";
  ImageFolderOptions options;
  options.in_dir = dir + "/in";
  options.out_dir = dir + "/out";
  options.train_shards = 1;
  absl::StatusOr<ImageFolderSummary> summary = ConvertImageFolder(options);
  ASSERT_FALSE(summary.ok());
  EXPECT_THAT(summary.status().message(), HasSubstr(dir + "/in/cats/b.jpg: JPEG: "));
  options.in_dir = dir + "/in/cats";  // No class folders.
  summary = ConvertImageFolder(options);
  ASSERT_FALSE(summary.ok());
  EXPECT_THAT(summary.status().message(), HasSubstr("holds no class folder"));
}

// A truncated JPEG among good images: skipped, counted and listed with
// skip_bad, across shards of train and validation; the rest converts.
TEST(ImageFolderTest, SkipBadLeavesOutAndListsWhatCannotBeDecoded) {
  const std::string dir = TestDir();
  SyntheticFolderOptions generate;
  generate.num_classes = 2;
  generate.per_class = 20;
  generate.height = generate.width = 12;
  ASSERT_TRUE(WriteSyntheticImageFolder(dir + "/in", generate).ok());
  // Cut one image in half; add one that is not an image at all.
  const std::string good = *EncodeJpeg(SyntheticImage(0, 1, 12, 12, 3));
  std::ofstream(dir + "/in/class_00/truncated.jpg") << good.substr(0, good.size() / 2);
  std::ofstream(dir + "/in/class_01/empty.png") << "";
  ImageFolderOptions options;
  options.in_dir = dir + "/in";
  options.out_dir = dir + "/out";
  options.train_shards = 2;
  options.validation_percent = 25;
  absl::StatusOr<ImageFolderSummary> summary = ConvertImageFolder(options);
  ASSERT_FALSE(summary.ok());  // Without skip_bad: the first bad file stops it.
  options.skip_bad = true;
  summary = ConvertImageFolder(options);
  ASSERT_TRUE(summary.ok()) << summary.status();
  ASSERT_EQ(summary->skipped.size(), 2u);
  EXPECT_EQ(summary->train_examples + summary->validation_examples, 40);
  std::vector<std::string> files;
  for (const std::string& f : summary->files) files.push_back(f);
  EXPECT_EQ(ReadAll(files).size(), 40u);
  const std::string list = Slurp(dir + "/out/skipped.txt");
  EXPECT_THAT(list, HasSubstr(dir + "/in/class_00/truncated.jpg: JPEG"));
  EXPECT_THAT(list, HasSubstr(dir + "/in/class_01/empty.png: "));
}

// The script and the binaries, end to end.
TEST(ImageFolderTest, ScriptConvertsAGeneratedFolder) {
  const std::string dir = TestDir();
  const std::string bin = PSRT_BIN_DIR;
  const std::string command = absl::StrCat(
      bin, "/psrt_make_images --out=", dir, "/in --classes=2 --per_class=30 --size=16 && ",
      "PSRT_BIN_DIR=", bin, " ", PSRT_SOURCE_DIR, "/scripts/images_to_tfrecord.sh --in ", dir,
      "/in --out ", dir, "/out --train_shards 2 > ", dir, "/log 2>&1");
  ASSERT_EQ(std::system(command.c_str()), 0) << Slurp(dir + "/log");
  EXPECT_THAT(Slurp(dir + "/log"), HasSubstr("wrote 60 train and 0 validation images"));
  const std::vector<ImageRecord> records =
      ReadAll({dir + "/out/train-00000-of-00002", dir + "/out/train-00001-of-00002"});
  EXPECT_EQ(records.size(), 60u);
  EXPECT_TRUE(*IsImageRecordFile(dir + "/out/train-00000-of-00002"));
}

}  // namespace
}  // namespace psrt
