#include "worker/input/idx_dataset.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace psrt {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint32_t kImagesMagic = 0x00000803;
constexpr uint32_t kLabelsMagic = 0x00000801;
constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

// A fresh directory under the test temp dir, one per test.
std::string TestDir() {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  const std::string dir = testing::TempDir() + "/idx_dataset_test_" +
                          info->test_suite_name() + "_" + info->name();
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

void AppendBigEndian32(std::string* out, uint32_t v) {
  out->push_back(static_cast<char>(v >> 24));
  out->push_back(static_cast<char>(v >> 16));
  out->push_back(static_cast<char>(v >> 8));
  out->push_back(static_cast<char>(v));
}

std::string IdxBytes(uint32_t magic, const std::vector<uint32_t>& dims,
                     const std::string& data) {
  std::string out;
  AppendBigEndian32(&out, magic);
  for (uint32_t d : dims) AppendBigEndian32(&out, d);
  return out + data;
}

void WriteRaw(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), bytes.size());
  ASSERT_TRUE(f.good()) << path;
}

void WriteGzip(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(gzwrite(f, bytes.data(), bytes.size()),
            static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

std::string ReadRaw(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// A small set: 5 images of 2x3 pixels, pixel j of image i = 10*i + j, and
// labels 0, 1, 2, 3, 4.
constexpr int kN = 5, kRows = 2, kCols = 3;
std::string SmallPixels() {
  std::string pixels;
  for (int i = 0; i < kN; ++i) {
    for (int j = 0; j < kRows * kCols; ++j) pixels.push_back(char(10 * i + j));
  }
  pixels[kRows * kCols - 1] = char(255);  // Image 0's last pixel is 1.0f.
  return pixels;
}
std::string SmallImages() {
  return IdxBytes(kImagesMagic, {kN, kRows, kCols}, SmallPixels());
}
std::string SmallLabels() {
  return IdxBytes(kLabelsMagic, {kN}, std::string("\0\1\2\3\4", kN));
}

void ExpectSmallDataset(const Dataset& data) {
  EXPECT_EQ(data.size(), kN);
  EXPECT_EQ(data.rows, kRows);
  EXPECT_EQ(data.cols, kCols);
  EXPECT_EQ(data.images.shape(), (Shape{kN, kRows * kCols}));
  EXPECT_THAT(data.labels, ElementsAre(0, 1, 2, 3, 4));
  const std::string pixels = SmallPixels();
  for (int k = 0; k < kN * kRows * kCols; ++k) {
    EXPECT_EQ(data.images.data()[k],
              static_cast<unsigned char>(pixels[k]) / 255.0f);
  }
  EXPECT_EQ(data.images.data()[kRows * kCols - 1], 1.0f);
  EXPECT_EQ(data.images.data()[0], 0.0f);
}

// Reads the dataset, expects InvalidArgument, returns the message.
std::string ReadError(const std::string& images, const std::string& labels,
                      int num_classes = 10) {
  absl::StatusOr<Dataset> data = ReadIdxDataset(images, labels, num_classes);
  EXPECT_FALSE(data.ok());
  if (data.ok()) return "";
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument)
      << data.status();
  return std::string(data.status().message());
}

TEST(IdxDatasetTest, ReadsPlainFiles) {
  const std::string dir = TestDir();
  WriteRaw(dir + "/images", SmallImages());
  WriteRaw(dir + "/labels", SmallLabels());
  auto data = ReadIdxDataset(dir + "/images", dir + "/labels");
  ASSERT_TRUE(data.ok()) << data.status();
  ExpectSmallDataset(*data);
}

TEST(IdxDatasetTest, ReadsGzippedFiles) {
  const std::string dir = TestDir();
  WriteGzip(dir + "/images.gz", SmallImages());
  WriteGzip(dir + "/labels.gz", SmallLabels());
  auto data = ReadIdxDataset(dir + "/images.gz", dir + "/labels.gz");
  ASSERT_TRUE(data.ok()) << data.status();
  ExpectSmallDataset(*data);
}

TEST(IdxDatasetTest, DetectsGzipByMagic) {
  const std::string dir = TestDir();
  WriteGzip(dir + "/images", SmallImages());  // No ".gz" in the name.
  WriteRaw(dir + "/labels", SmallLabels());
  auto data = ReadIdxDataset(dir + "/images", dir + "/labels");
  ASSERT_TRUE(data.ok()) << data.status();
  ExpectSmallDataset(*data);
}

TEST(IdxDatasetTest, ReadsConcatenatedGzipMembers) {
  const std::string dir = TestDir();
  const std::string images = SmallImages();
  WriteGzip(dir + "/a.gz", images.substr(0, 7));
  WriteGzip(dir + "/b.gz", images.substr(7));
  WriteRaw(dir + "/images.gz", ReadRaw(dir + "/a.gz") + ReadRaw(dir + "/b.gz"));
  WriteRaw(dir + "/labels", SmallLabels());
  auto data = ReadIdxDataset(dir + "/images.gz", dir + "/labels");
  ASSERT_TRUE(data.ok()) << data.status();
  ExpectSmallDataset(*data);
}

TEST(IdxDatasetTest, EmptySet) {
  const std::string dir = TestDir();
  WriteRaw(dir + "/images", IdxBytes(kImagesMagic, {0, 28, 28}, ""));
  WriteRaw(dir + "/labels", IdxBytes(kLabelsMagic, {0}, ""));
  auto data = ReadIdxDataset(dir + "/images", dir + "/labels");
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->size(), 0);
  EXPECT_EQ(data->images.shape(), (Shape{0, 784}));
}

TEST(IdxDatasetTest, MissingFile) {
  const std::string dir = TestDir();
  WriteRaw(dir + "/labels", SmallLabels());
  auto data = ReadIdxDataset(dir + "/nope", dir + "/labels");
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(data.status().message()), HasSubstr(dir + "/nope"));
}

TEST(IdxDatasetTest, TruncatedHeader) {
  const std::string dir = TestDir();
  WriteRaw(dir + "/images", SmallImages().substr(0, 10));
  WriteRaw(dir + "/labels", SmallLabels());
  EXPECT_EQ(ReadError(dir + "/images", dir + "/labels"),
            dir + "/images: short header: an IDX images header is 16 bytes, "
                  "got 10");
  WriteRaw(dir + "/images", SmallImages());
  WriteRaw(dir + "/labels", "");
  EXPECT_THAT(ReadError(dir + "/images", dir + "/labels"),
              AllOf(HasSubstr(dir + "/labels: short header"),
                    HasSubstr("8 bytes, got 0")));
}

TEST(IdxDatasetTest, TruncatedData) {
  const std::string dir = TestDir();
  const std::string images = SmallImages();
  WriteRaw(dir + "/images", images.substr(0, images.size() - 1));
  WriteRaw(dir + "/labels", SmallLabels());
  EXPECT_EQ(ReadError(dir + "/images", dir + "/labels"),
            dir + "/images: truncated data: expected 30 bytes (5 x 2 x 3) "
                  "after the 16-byte header, got 29");
}

TEST(IdxDatasetTest, HugeDimensionsAreTruncatedData) {
  const std::string dir = TestDir();
  WriteRaw(dir + "/images",
           IdxBytes(kImagesMagic, {0xffffffff, 0xffffffff, 0xffffffff}, "x"));
  WriteRaw(dir + "/labels", SmallLabels());
  EXPECT_THAT(ReadError(dir + "/images", dir + "/labels"),
              AllOf(HasSubstr("truncated data: expected "
                              "79228162458924105385300197375 bytes"),
                    HasSubstr("got 1")));
}

TEST(IdxDatasetTest, BadMagic) {
  const std::string dir = TestDir();
  WriteRaw(dir + "/images", SmallLabels());  // Swapped files.
  WriteRaw(dir + "/labels", SmallImages());
  EXPECT_THAT(ReadError(dir + "/images", dir + "/labels"),
              AllOf(HasSubstr(dir + "/images: bad magic 0x00000801"),
                    HasSubstr("expected 0x00000803")));
  WriteRaw(dir + "/images", SmallImages());
  EXPECT_THAT(ReadError(dir + "/images", dir + "/labels"),
              AllOf(HasSubstr(dir + "/labels: bad magic 0x00000803"),
                    HasSubstr("expected 0x00000801")));
  WriteRaw(dir + "/labels", IdxBytes(0x1234abcd, {kN}, std::string("\0\1\2\3\4", kN)));
  EXPECT_THAT(ReadError(dir + "/images", dir + "/labels"),
              HasSubstr("bad magic 0x1234abcd"));
}

TEST(IdxDatasetTest, TrailingBytes) {
  const std::string dir = TestDir();
  WriteRaw(dir + "/images", SmallImages() + "xy");
  WriteRaw(dir + "/labels", SmallLabels());
  EXPECT_EQ(ReadError(dir + "/images", dir + "/labels"),
            dir + "/images: 2 trailing bytes after the 30 data bytes "
                  "(5 x 2 x 3)");
}

TEST(IdxDatasetTest, CorruptGzip) {
  const std::string dir = TestDir();
  // Enough data that the deflate stream has a body worth corrupting.
  std::string pixels;
  for (int i = 0; i < 100 * 28 * 28; ++i) pixels.push_back(char(i * 7 % 251));
  WriteGzip(dir + "/good.gz",
            IdxBytes(kImagesMagic, {100, 28, 28}, pixels));
  const std::string good = ReadRaw(dir + "/good.gz");
  ASSERT_GT(good.size(), 100u);
  WriteRaw(dir + "/labels", SmallLabels());

  std::string flipped = good;
  flipped[good.size() / 2] ^= 0x55;
  WriteRaw(dir + "/images.gz", flipped);
  EXPECT_THAT(ReadError(dir + "/images.gz", dir + "/labels"),
              HasSubstr(dir + "/images.gz: corrupt gzip stream"));

  WriteRaw(dir + "/images.gz", good.substr(0, good.size() / 2));
  EXPECT_THAT(ReadError(dir + "/images.gz", dir + "/labels"),
              AllOf(HasSubstr(dir + "/images.gz: corrupt gzip stream: "
                                    "truncated"),
                    HasSubstr(std::to_string(good.size() / 2))));

  WriteRaw(dir + "/images.gz", good + "junk");
  EXPECT_THAT(ReadError(dir + "/images.gz", dir + "/labels"),
              AllOf(HasSubstr("corrupt gzip stream"),
                    HasSubstr("4 bytes of garbage")));

  std::string bad_crc = good;
  bad_crc[good.size() - 8] ^= 1;  // The trailer's CRC-32.
  WriteRaw(dir + "/images.gz", bad_crc);
  EXPECT_THAT(ReadError(dir + "/images.gz", dir + "/labels"),
              HasSubstr("corrupt gzip stream: incorrect data check"));

  WriteRaw(dir + "/images.gz", SmallImages());  // Named .gz, not gzip.
  EXPECT_THAT(ReadError(dir + "/images.gz", dir + "/labels"),
              AllOf(HasSubstr("corrupt gzip stream"), HasSubstr("1f 8b")));
}

TEST(IdxDatasetTest, CountMismatch) {
  const std::string dir = TestDir();
  WriteRaw(dir + "/images", SmallImages());
  WriteRaw(dir + "/labels", IdxBytes(kLabelsMagic, {4}, std::string("\0\1\2\3", 4)));
  EXPECT_EQ(ReadError(dir + "/images", dir + "/labels"),
            "image count 5 in " + dir + "/images does not match label count "
            "4 in " + dir + "/labels");
}

TEST(IdxDatasetTest, LabelOutOfRange) {
  const std::string dir = TestDir();
  WriteRaw(dir + "/images", SmallImages());
  WriteRaw(dir + "/labels", IdxBytes(kLabelsMagic, {kN}, std::string("\0\1\2\12\4", kN)));
  EXPECT_EQ(ReadError(dir + "/images", dir + "/labels"),
            dir + "/labels: label 10 at index 3 is out of range for 10 "
                  "classes (must be 0..9)");
  WriteRaw(dir + "/labels", SmallLabels());
  EXPECT_THAT(ReadError(dir + "/images", dir + "/labels", 4),
              HasSubstr("label 4 at index 4 is out of range for 4 classes"));
}

TEST(IdxDatasetTest, ZeroImageSize) {
  const std::string dir = TestDir();
  WriteRaw(dir + "/images", IdxBytes(kImagesMagic, {kN, 0, 3}, ""));
  WriteRaw(dir + "/labels", SmallLabels());
  EXPECT_THAT(ReadError(dir + "/images", dir + "/labels"),
              HasSubstr("bad image size 0 x 3"));
}

TEST(IdxLoadMnistSplitTest, FindsStandardNamesPreferringPlain) {
  const std::string dir = TestDir();
  // Plain images under the dotted spelling, gzipped labels; a gzipped copy
  // of the images with different contents must lose to the plain file.
  WriteRaw(dir + "/t10k-images.idx3-ubyte", SmallImages());
  WriteGzip(dir + "/t10k-images-idx3-ubyte.gz",
            IdxBytes(kImagesMagic, {1, 1, 1}, "\1"));
  WriteGzip(dir + "/t10k-labels-idx1-ubyte.gz", SmallLabels());
  auto data = LoadMnistSplit(dir + "/", "t10k");
  ASSERT_TRUE(data.ok()) << data.status();
  ExpectSmallDataset(*data);
}

TEST(IdxLoadMnistSplitTest, MissingFiles) {
  const std::string dir = TestDir();
  WriteRaw(dir + "/train-images-idx3-ubyte", SmallImages());
  auto data = LoadMnistSplit(dir, "train");
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(data.status().message()),
            "no train labels in " + dir +
                ": tried train-labels-idx1-ubyte, train-labels.idx1-ubyte, "
                "train-labels-idx1-ubyte.gz, train-labels.idx1-ubyte.gz");
}

TEST(IdxLoadMnistSplitTest, MissingDirectory) {
  const std::string dir = TestDir() + "/absent";
  auto data = LoadMnistSplit(dir, "train");
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(data.status().message()), HasSubstr(dir));
}

TEST(IdxLoadMnistSplitTest, UnknownSplit) {
  auto data = LoadMnistSplit(TestDir(), "test");
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(data.status().message()),
              AllOf(HasSubstr("\"test\""), HasSubstr("train, t10k")));
}

void ExpectFashionMnist(const std::string& split, int64_t n) {
  struct stat st;
  if (::stat(kFashionMnistDir, &st) != 0) {
    GTEST_SKIP() << kFashionMnistDir << " is missing";
  }
  const auto start = std::chrono::steady_clock::now();
  auto data = LoadMnistSplit(kFashionMnistDir, split);
  const double seconds = std::chrono::duration<double>(
                             std::chrono::steady_clock::now() - start)
                             .count();
  ASSERT_TRUE(data.ok()) << data.status();
  std::cout << "LoadMnistSplit(" << split << "): " << data->size()
            << " examples in " << seconds * 1e3 << " ms\n";
  testing::Test::RecordProperty("load_ms", static_cast<int>(seconds * 1e3));
  EXPECT_EQ(data->size(), n);
  EXPECT_EQ(data->rows, 28);
  EXPECT_EQ(data->cols, 28);
  EXPECT_EQ(data->images.shape(), (Shape{n, 784}));
  // Fashion-MNIST is balanced: n / 10 examples per class.
  std::vector<int64_t> per_class(10);
  for (int32_t label : data->labels) {
    ASSERT_GE(label, 0);
    ASSERT_LT(label, 10);
    ++per_class[label];
  }
  for (int64_t count : per_class) EXPECT_EQ(count, n / 10);
  const auto [lo, hi] =
      std::minmax_element(data->images.data(), data->images.data() + n * 784);
  EXPECT_EQ(*lo, 0.0f);
  EXPECT_EQ(*hi, 1.0f);
}

TEST(IdxLoadMnistSplitTest, RealFashionMnistTrain) {
  ExpectFashionMnist("train", 60000);
}

TEST(IdxLoadMnistSplitTest, RealFashionMnistT10k) {
  ExpectFashionMnist("t10k", 10000);
}

// ---- BatchIterator ----

// n examples of 2 features: example i is {i, -i} with label i % 3.
Dataset MakeDataset(int n) {
  Dataset data;
  data.rows = 1;
  data.cols = 2;
  data.images = Tensor({n, 2});
  for (int i = 0; i < n; ++i) {
    data.images.data()[2 * i] = i;
    data.images.data()[2 * i + 1] = -i;
    data.labels.push_back(i % 3);
  }
  return data;
}

// The example ids of the next `count` examples, checking images and labels
// agree.
std::vector<int> Take(BatchIterator* it, int batch_size, int count) {
  std::vector<int> ids;
  Tensor images;
  std::vector<int32_t> labels;
  while (static_cast<int>(ids.size()) < count) {
    it->NextBatch(batch_size, &images, &labels);
    EXPECT_EQ(images.shape(), (Shape{batch_size, 2}));
    EXPECT_EQ(labels.size(), static_cast<size_t>(batch_size));
    for (int b = 0; b < batch_size; ++b) {
      const int id = static_cast<int>(images.data()[2 * b]);
      EXPECT_EQ(images.data()[2 * b + 1], -id);
      EXPECT_EQ(labels[b], id % 3);
      ids.push_back(id);
    }
  }
  ids.resize(count);
  return ids;
}

TEST(BatchIteratorTest, UnshuffledOrderCrossesEpochs) {
  const Dataset data = MakeDataset(10);
  BatchIterator it(&data, 1, 3, /*shuffle=*/false, 0);  // Holds 1, 4, 7.
  EXPECT_THAT(Take(&it, 2, 8), ElementsAre(1, 4, 7, 1, 4, 7, 1, 4));
  BatchIterator whole(&data, 0, 1, false, 0);
  EXPECT_THAT(Take(&whole, 4, 12),
              ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1));
}

TEST(BatchIteratorTest, ShardsPartitionEachEpoch) {
  const Dataset data = MakeDataset(23);
  for (bool shuffle : {false, true}) {
    for (int num_shards : {1, 2, 3, 5}) {
      std::multiset<int> seen;
      for (int s = 0; s < num_shards; ++s) {
        const int shard_size = (23 - s + num_shards - 1) / num_shards;
        BatchIterator it(&data, s, num_shards, shuffle, 42);
        // Three epochs; each must hold exactly the shard's examples.
        const std::vector<int> ids = Take(&it, 1, 3 * shard_size);
        for (int e = 0; e < 3; ++e) {
          std::vector<int> epoch(ids.begin() + e * shard_size,
                                 ids.begin() + (e + 1) * shard_size);
          std::sort(epoch.begin(), epoch.end());
          for (int k = 0; k < shard_size; ++k) {
            EXPECT_EQ(epoch[k], s + k * num_shards)
                << "shuffle=" << shuffle << " shard " << s << "/" << num_shards;
          }
          if (e == 0) seen.insert(epoch.begin(), epoch.end());
        }
      }
      EXPECT_EQ(seen.size(), 23u);
      for (int i = 0; i < 23; ++i) EXPECT_EQ(seen.count(i), 1u) << i;
    }
  }
}

TEST(BatchIteratorTest, ShuffleIsAPermutationAndRepeatable) {
  const Dataset data = MakeDataset(100);
  BatchIterator a(&data, 0, 1, /*shuffle=*/true, 7);
  BatchIterator b(&data, 0, 1, /*shuffle=*/true, 7);
  BatchIterator c(&data, 0, 1, /*shuffle=*/true, 8);
  const std::vector<int> ids_a = Take(&a, 16, 200);
  const std::vector<int> ids_b = Take(&b, 16, 200);
  const std::vector<int> ids_c = Take(&c, 16, 200);
  EXPECT_EQ(ids_a, ids_b);
  EXPECT_NE(ids_a, ids_c);

  std::vector<int> epoch0(ids_a.begin(), ids_a.begin() + 100);
  std::vector<int> epoch1(ids_a.begin() + 100, ids_a.end());
  std::vector<int> identity(100);
  for (int i = 0; i < 100; ++i) identity[i] = i;
  EXPECT_NE(epoch0, identity);
  EXPECT_NE(epoch0, epoch1);  // A fresh order each epoch.
  std::sort(epoch0.begin(), epoch0.end());
  std::sort(epoch1.begin(), epoch1.end());
  EXPECT_EQ(epoch0, identity);
  EXPECT_EQ(epoch1, identity);
}

TEST(BatchIteratorTest, ReusesOutputStorage) {
  const Dataset data = MakeDataset(10);
  BatchIterator it(&data, 0, 2, false, 0);
  Tensor images;
  std::vector<int32_t> labels;
  it.NextBatch(4, &images, &labels);
  const float* storage = images.data();
  it.NextBatch(4, &images, &labels);
  EXPECT_EQ(images.data(), storage);
  it.NextBatch(2, &images, &labels);  // Smaller batch: same storage.
  EXPECT_EQ(images.data(), storage);
  EXPECT_EQ(images.shape(), (Shape{2, 2}));
  // 0 2 4 6 | 8 0 2 4 | 6 8
  EXPECT_EQ(images.data()[0], 6.0f);
  EXPECT_EQ(images.data()[2], 8.0f);
  EXPECT_THAT(labels, ElementsAre(0, 2));
}

TEST(SyntheticDatasetTest, RandomImagesAndLabelsFromTheSeedAlone) {
  const Dataset a = SyntheticDataset(6, 12, 10, 7);
  const Dataset b = SyntheticDataset(6, 12, 10, 7);
  const Dataset c = SyntheticDataset(6, 12, 10, 8);
  ASSERT_EQ(a.images.shape(), (Shape{6, 12}));
  ASSERT_EQ(a.size(), 6);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_TRUE(std::equal(a.images.flat().begin(), a.images.flat().end(), b.images.flat().begin()));
  EXPECT_FALSE(std::equal(a.images.flat().begin(), a.images.flat().end(),
                          c.images.flat().begin()));
  for (float x : a.images.flat()) {
    EXPECT_GE(x, 0.0f);
    EXPECT_LT(x, 1.0f);
  }
  for (int32_t y : SyntheticDataset(200, 1, 3, 1).labels) {
    EXPECT_GE(y, 0);
    EXPECT_LT(y, 3);
  }
}

}  // namespace
}  // namespace psrt
