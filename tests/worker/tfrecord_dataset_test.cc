#include "worker/input/tfrecord_dataset.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tfrecord.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/example.pb.h"
#include "worker/input/idx_dataset.h"

namespace psrt {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

// A fresh directory per test.
std::string TestDir() {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  const std::string dir = absl::StrCat(testing::TempDir(), "/tfrecord_dataset_test_",
                                       info->name(), "_", ::getpid());
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

// 5 images of 2x3 pixels, pixel j of image i = (10*i + j) / 255; labels
// 4, 3, 2, 1, 0.
constexpr int kN = 5, kRows = 2, kCols = 3;
Dataset SmallDataset() {
  Dataset data;
  data.rows = kRows;
  data.cols = kCols;
  data.images.Resize({kN, kRows * kCols});
  for (int i = 0; i < kN; ++i) {
    for (int j = 0; j < kRows * kCols; ++j) {
      data.images.data()[i * kRows * kCols + j] = (10 * i + j) / 255.0f;
    }
    data.labels.push_back(kN - 1 - i);
  }
  data.images.data()[5] = 1.0f;
  return data;
}

void ExpectSameDataset(const Dataset& got, const Dataset& want) {
  EXPECT_EQ(got.rows, want.rows);
  EXPECT_EQ(got.cols, want.cols);
  EXPECT_EQ(got.labels, want.labels);
  ASSERT_EQ(got.images.shape(), want.images.shape());
  for (int64_t k = 0; k < want.images.num_elements(); ++k) {
    ASSERT_EQ(got.images.data()[k], want.images.data()[k]) << k;
  }
}

// Feature builders for hand-made records.
tf::Feature Int64s(std::vector<int64_t> values) {
  tf::Feature f;
  for (int64_t v : values) f.mutable_int64_list()->add_value(v);
  return f;
}
tf::Feature Bytes(const std::string& value) {
  tf::Feature f;
  f.mutable_bytes_list()->add_value(value);
  return f;
}
tf::Feature Floats(std::vector<float> values) {
  tf::Feature f;
  for (float v : values) f.mutable_float_list()->add_value(v);
  return f;
}

using FeatureMap = std::map<std::string, tf::Feature>;

// An MNIST-style example with `pixels` bytes of image and label 1.
FeatureMap Good(int pixels = 6) {
  return {{"image_raw", Bytes(std::string(pixels, '\x7f'))},
          {"label", Int64s({1})}};
}

void WriteExamples(const std::string& path, const std::vector<FeatureMap>& examples) {
  auto writer = TFRecordWriter::Open(path);
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (const FeatureMap& features : examples) {
    tf::Example e;
    for (const auto& [name, f] : features) {
      (*e.mutable_features()->mutable_feature())[name] = f;
    }
    ASSERT_TRUE((*writer)->Write(e.SerializeAsString()).ok());
  }
  ASSERT_TRUE((*writer)->Close().ok());
}

// Reads `path`, expects InvalidArgument, returns the message.
std::string ReadError(const std::string& path, int num_classes = 10) {
  absl::StatusOr<Dataset> data = ReadTFRecordDataset(path, num_classes);
  EXPECT_FALSE(data.ok());
  if (data.ok()) return "";
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument)
      << data.status();
  return std::string(data.status().message());
}

TEST(TFRecordDatasetTest, RoundTrip) {
  const std::string path = TestDir() + "/small.tfrecord";
  const Dataset want = SmallDataset();
  ASSERT_TRUE(WriteTFRecordDataset(want, path).ok());
  absl::StatusOr<Dataset> got = ReadTFRecordDataset(path);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSameDataset(*got, want);

  // The records are what convert_to_records.py writes.
  auto records = ReadTFRecordFile(path);
  ASSERT_TRUE(records.ok());
  ASSERT_EQ(records->size(), size_t{kN});
  tf::Example e;
  ASSERT_TRUE(e.ParseFromString((*records)[1]));
  const auto& f = e.features().feature();
  EXPECT_THAT(f.at("height").int64_list().value(), ElementsAre(kRows));
  EXPECT_THAT(f.at("width").int64_list().value(), ElementsAre(kCols));
  EXPECT_THAT(f.at("depth").int64_list().value(), ElementsAre(1));
  EXPECT_THAT(f.at("label").int64_list().value(), ElementsAre(3));
  EXPECT_EQ(f.at("image_raw").bytes_list().value(0),
            std::string("\x0a\x0b\x0c\x0d\x0e\x0f", 6));
}

TEST(TFRecordDatasetTest, ManyFilesGzipGlobDirectoryAndList) {
  const std::string dir = TestDir();
  const Dataset want = SmallDataset();
  TFRecordDatasetWriteOptions options;
  options.num_files = 3;
  options.compression = TFRecordCompression::kGzip;
  ASSERT_TRUE(WriteTFRecordDataset(want, dir + "/train", options).ok());
  for (const std::string& spec :
       {dir + "/train-*", dir, dir + "/",
        absl::StrCat(dir, "/train-00000-of-00003,", dir,
                     "/train-00001-of-00003, ", dir, "/train-0000[2]-of-*")}) {
    SCOPED_TRACE(spec);
    absl::StatusOr<Dataset> got = ReadTFRecordDataset(spec);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSameDataset(*got, want);
  }
  // Leftover temporary and hidden files in a directory are not data.
  std::ofstream(dir + "/train-00003-of-00003.tmp") << "partial";
  std::ofstream(dir + "/.hidden") << "x";
  auto files = ExpandDataFiles(dir);
  ASSERT_TRUE(files.ok());
  EXPECT_EQ(files->size(), 3u);
}

TEST(TFRecordDatasetTest, FeedsBatchIterator) {
  const std::string path = TestDir() + "/small.tfrecord";
  ASSERT_TRUE(WriteTFRecordDataset(SmallDataset(), path).ok());
  absl::StatusOr<Dataset> data = ReadTFRecordDataset(path);
  ASSERT_TRUE(data.ok());
  BatchIterator shard1(&*data, 1, 2, /*shuffle=*/false, 1);
  Tensor images;
  std::vector<int32_t> labels;
  shard1.NextBatch(3, &images, &labels);
  EXPECT_THAT(labels, ElementsAre(3, 1, 3));  // Examples 1, 3, 1.
  EXPECT_EQ(images.data()[0], 10 / 255.0f);
}

TEST(TFRecordDatasetTest, ShapeFromFeaturesOrSize) {
  const std::string dir = TestDir();
  struct Case {
    FeatureMap features;
    int rows, cols;
  };
  std::vector<Case> cases = {
      {Good(784), 28, 28},
      {Good(6), 1, 6},
      {{{"image_raw", Bytes(std::string(6, 'a'))}, {"label", Int64s({2})},
        {"height", Int64s({3})}, {"width", Int64s({2})}, {"depth", Int64s({1})}},
       3, 2},
      {{{"image_raw", Bytes(std::string(16, 'a'))}, {"label", Int64s({2})},
        {"pixels", Int64s({16})}},
       4, 4},
  };
  for (const Case& c : cases) {
    const std::string path = dir + "/shape.tfrecord";
    WriteExamples(path, {c.features, c.features});
    absl::StatusOr<Dataset> data = ReadTFRecordDataset(path);
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_EQ(data->rows, c.rows);
    EXPECT_EQ(data->cols, c.cols);
    EXPECT_EQ(data->size(), 2);
  }
}

TEST(TFRecordDatasetTest, BadRecordsNameFileRecordAndProblem) {
  const std::string path = TestDir() + "/bad.tfrecord";
  auto without = [](FeatureMap f, const std::string& name) {
    f.erase(name);
    return f;
  };
  auto with = [](FeatureMap f, const std::string& name, tf::Feature v) {
    f[name] = v;
    return f;
  };
  struct Case {
    FeatureMap bad;
    std::string message;
  };
  const std::vector<Case> cases = {
      {without(Good(), "image_raw"),
       "missing feature \"image_raw\" (present: label)"},
      {without(Good(), "label"), "missing feature \"label\" (present: image_raw)"},
      {{}, "missing feature \"image_raw\" (present: none)"},
      {with(Good(), "label", Floats({1})),
       "feature \"label\" is a float_list, expected an int64_list"},
      {with(Good(), "label", Int64s({1, 2})),
       "feature \"label\" has 2 values, expected 1"},
      {with(Good(), "label", Int64s({10})),
       "label 10 is out of range for 10 classes (must be 0..9)"},
      {with(Good(), "label", Int64s({-1})), "label -1 is out of range"},
      {with(Good(), "image_raw", Int64s({1})),
       "feature \"image_raw\" is an int64_list, expected a bytes_list"},
      {with(Good(), "image_raw", Bytes(std::string(5, 'x'))),
       "image shape 1 x 5 differs from 1 x 6 of " + path + " record 0"},
      {with(with(with(Good(), "height", Int64s({1})), "width", Int64s({6})),
            "image_raw", Bytes(std::string(5, 'x'))),
       "image_raw has 5 bytes, expected 6 (1 x 6)"},
      {with(Good(), "height", Int64s({2})), "missing feature \"width\""},
      {with(with(with(Good(), "height", Int64s({1})), "width", Int64s({2})),
            "depth", Int64s({3})),
       "depth 3: only single-channel images are supported"},
      {with(Good(), "image_raw", Bytes("\x89PNG\r\n\x1a\n")),
       "image shape 1 x 8 differs from 1 x 6 of " + path +
           " record 0 (image_raw looks like an encoded PNG/JPEG image"},
      {with(with(with(Good(), "height", Int64s({1})), "width", Int64s({6})),
            "image_raw", Bytes("\x89PNG\r\n\x1a\n")),
       "image_raw has 8 bytes, expected 6 (1 x 6) (image_raw looks like an "
       "encoded PNG/JPEG image; psrt reads raw uint8 pixels)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    // The bad example is record 2, after two good ones.
    WriteExamples(path, {Good(), Good(), c.bad});
    EXPECT_THAT(ReadError(path), AllOf(HasSubstr(path + ": record 2: "),
                                       HasSubstr(c.message)));
  }
  // A record that is not an Example at all.
  auto writer = TFRecordWriter::Open(path);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Write("\xff\xff\xff").ok());
  ASSERT_TRUE((*writer)->Close().ok());
  EXPECT_THAT(ReadError(path),
              HasSubstr(path + ": record 0: not a tf.train.Example"));
  // num_classes applies.
  WriteExamples(path, {with(Good(), "label", Int64s({3}))});
  EXPECT_THAT(ReadError(path, 3), HasSubstr("label 3 is out of range for 3 classes"));
}

TEST(TFRecordDatasetTest, CorruptFileNamesWhichFile) {
  const std::string dir = TestDir();
  TFRecordDatasetWriteOptions options;
  options.num_files = 2;
  ASSERT_TRUE(WriteTFRecordDataset(SmallDataset(), dir + "/d", options).ok());
  const std::string second = dir + "/d-00001-of-00002";
  std::string bytes;
  {
    std::ifstream in(second, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::ofstream(second, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), bytes.size() - 1);
  EXPECT_THAT(ReadError(dir + "/d-*"),
              AllOf(HasSubstr(second), HasSubstr("truncated data checksum")));
}

TEST(TFRecordDatasetTest, MissingAndEmptyInputs) {
  const std::string dir = TestDir();
  auto missing = ReadTFRecordDataset(dir + "/nope.tfrecord");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(dir + "/nope.tfrecord"));
  auto no_match = ReadTFRecordDataset(dir + "/train-*");
  EXPECT_EQ(no_match.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(no_match.status().message(), HasSubstr("matches no file"));
  auto empty_dir = ReadTFRecordDataset(dir);
  EXPECT_EQ(empty_dir.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadTFRecordDataset(" , ").status().code(),
            absl::StatusCode::kInvalidArgument);
  WriteExamples(dir + "/empty.tfrecord", {});
  EXPECT_THAT(ReadError(dir + "/empty.tfrecord"), HasSubstr("no records in"));
}

TEST(TFRecordDatasetTest, WriterRefusesPixelsThatAreNotBytes) {
  const std::string path = TestDir() + "/bad_pixels.tfrecord";
  for (float bad : {0.5f, -1.0f / 255, 256.0f / 255}) {
    Dataset data = SmallDataset();
    data.images.data()[8] = bad;
    absl::Status s = WriteTFRecordDataset(data, path);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr("example 1 pixel 2"));
    EXPECT_NE(::access(path.c_str(), F_OK), 0);  // Nothing left behind.
    EXPECT_NE(::access((path + ".tmp").c_str(), F_OK), 0);
  }
}

// The real Fashion-MNIST test set, IDX -> TFRecord -> Dataset, against the
// IDX reader.
TEST(TFRecordDatasetTest, FashionMnistMatchesIdxReader) {
  struct stat st;
  if (::stat(kFashionMnistDir, &st) != 0) {
    GTEST_SKIP() << kFashionMnistDir << " is not installed";
  }
  absl::StatusOr<Dataset> idx = LoadMnistSplit(kFashionMnistDir, "t10k");
  ASSERT_TRUE(idx.ok()) << idx.status();
  const std::string path = TestDir() + "/t10k.tfrecord";
  ASSERT_TRUE(WriteTFRecordDataset(*idx, path).ok());
  absl::StatusOr<Dataset> tfrecord = ReadTFRecordDataset(path);
  ASSERT_TRUE(tfrecord.ok()) << tfrecord.status();
  EXPECT_EQ(tfrecord->size(), 10000);
  EXPECT_EQ(tfrecord->rows, 28);
  ExpectSameDataset(*tfrecord, *idx);
}

// The command-line converter, on the same data.
TEST(TFRecordDatasetTest, ConverterToolMatchesIdxReader) {
  struct stat st;
  const std::string tool = std::string(PSRT_BIN_DIR) + "/psrt_idx_to_tfrecord";
  if (::stat(kFashionMnistDir, &st) != 0 || ::stat(tool.c_str(), &st) != 0) {
    GTEST_SKIP() << "needs " << kFashionMnistDir << " and " << tool;
  }
  const std::string out = TestDir() + "/t10k.tfrecord.gz";
  const std::string command =
      absl::StrCat(tool, " --data_dir=", kFashionMnistDir,
                   " --split=t10k --compression=gzip --out=", out, " >/dev/null");
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  absl::StatusOr<Dataset> idx = LoadMnistSplit(kFashionMnistDir, "t10k");
  ASSERT_TRUE(idx.ok()) << idx.status();
  absl::StatusOr<Dataset> tfrecord = ReadTFRecordDataset(out);
  ASSERT_TRUE(tfrecord.ok()) << tfrecord.status();
  ExpectSameDataset(*tfrecord, *idx);
}

}  // namespace
}  // namespace psrt
