#include "worker/input/image_pipeline.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/tfrecord.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/example.pb.h"
#include "worker/input/image_decoder.h"
#include "worker/input/image_records.h"
#include "worker/input/synthetic_images.h"

namespace psrt {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kClasses = 4;

std::string TestDir() {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  const std::string dir = absl::StrCat(testing::TempDir(), "/image_pipeline_test_",
                                       info->name(), "_", ::getpid());
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

// `files` files of `per_file` build_image_data.py records of 24x20 JPEGs;
// record k of file f has label 1 + (f * per_file + k) % kClasses. Records
// listed in `corrupt` ({file, record}) hold a truncated JPEG.
std::vector<std::string> WriteRecords(const std::string& dir, int files, int per_file,
                                      std::vector<std::pair<int, int>> corrupt = {},
                                      bool gzip = false) {
  std::vector<std::string> paths;
  for (int f = 0; f < files; ++f) {
    const std::string path = absl::StrFormat("%s/train-%05d-of-%05d", dir, f, files);
    TFRecordWriterOptions writer_options;
    if (gzip) writer_options.compression = TFRecordCompression::kGzip;
    auto writer = TFRecordWriter::Open(path, writer_options);
    EXPECT_TRUE(writer.ok());
    for (int k = 0; k < per_file; ++k) {
      const int n = f * per_file + k;
      const Image image = SyntheticImage(n % kClasses, kClasses, 24, 20, n);
      ImageRecord record;
      record.encoded = *EncodeJpeg(image, 90);
      for (auto [cf, ck] : corrupt) {
        if (cf == f && ck == k) record.encoded.resize(record.encoded.size() / 2);
      }
      record.label = 1 + n % kClasses;
      record.format = "JPEG";
      record.height = 24;
      record.width = 20;
      record.channels = 3;
      record.colorspace = "RGB";
      record.text = absl::StrCat("class_", n % kClasses);
      record.filename = absl::StrCat("img_", n, ".jpg");
      EXPECT_TRUE((*writer)->Write(SerializeImageExample(record)).ok());
    }
    EXPECT_TRUE((*writer)->Close().ok());
    paths.push_back(path);
  }
  return paths;
}

std::shared_ptr<const ImageShard> Shard(const std::vector<std::string>& files, int shard = 0,
                                        int shards = 1, bool in_memory = true) {
  ImageShardOptions options;
  options.in_memory = in_memory;
  options.shard = shard;
  options.num_shards = shards;
  options.num_classes = kClasses;
  absl::StatusOr<ImageShard> read = ReadImageShard(files, options);
  EXPECT_TRUE(read.ok()) << read.status();
  return std::make_shared<const ImageShard>(std::move(*read));
}

ImagePipelineOptions Options(int threads) {
  ImagePipelineOptions options;
  options.height = 16;
  options.width = 16;
  options.channels = 3;
  options.batch_size = 7;  // Batches straddle the epochs of 30 examples.
  options.threads = threads;
  options.prefetch_batches = 3;
  options.seed = 42;
  return options;
}

struct Batch {
  std::vector<float> images;
  std::vector<int32_t> labels;
  bool operator==(const Batch& o) const { return images == o.images && labels == o.labels; }
};

std::vector<Batch> Take(BatchSource* source, int batches, int batch_size) {
  std::vector<Batch> out;
  Tensor images;
  std::vector<int32_t> labels;
  for (int b = 0; b < batches; ++b) {
    absl::Status status = source->NextBatch(batch_size, &images, &labels);
    EXPECT_TRUE(status.ok()) << status;
    if (!status.ok()) break;
    out.push_back({std::vector<float>(images.data(), images.data() + images.num_elements()),
                   labels});
  }
  return out;
}

TEST(ImageRecordsTest, ReadsTheBuildImageDataFormat) {
  const std::string dir = TestDir();
  const std::vector<std::string> files = WriteRecords(dir, 1, 3);
  EXPECT_TRUE(*IsImageRecordFile(files[0]));
  absl::StatusOr<std::vector<std::string>> records = ReadTFRecordFile(files[0]);
  ASSERT_TRUE(records.ok());
  absl::StatusOr<ImageRecord> r = ParseImageExample((*records)[2]);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->label, 3);
  EXPECT_EQ(r->text, "class_2");
  EXPECT_EQ(r->filename, "img_2.jpg");
  EXPECT_EQ(r->format, "JPEG");
  EXPECT_EQ(r->height, 24);
  EXPECT_EQ(r->width, 20);
  EXPECT_EQ(r->channels, 3);
  EXPECT_EQ(DetectImageFormat(r->encoded), ImageFormat::kJpeg);
  const std::shared_ptr<const ImageShard> shard = Shard(files);
  EXPECT_THAT(shard->labels, ElementsAre(0, 1, 2));  // label_offset 1.
  EXPECT_EQ(shard->Where(1), files[0] + ": record 1");
}

TEST(ImageRecordsTest, MissingFeaturesAndBadLabelsNameFileAndRecord) {
  const std::string dir = TestDir();
  const std::string path = dir + "/bad";
  {
    auto writer = *TFRecordWriter::Open(path);
    ImageRecord good;
    good.encoded = "x";
    good.label = 1;
    ASSERT_TRUE(writer->Write(SerializeImageExample(good)).ok());
    tf::Example no_label;
    (*no_label.mutable_features()->mutable_feature())["image/encoded"]
        .mutable_bytes_list()->add_value("x");
    ASSERT_TRUE(writer->Write(no_label.SerializeAsString()).ok());
    ASSERT_TRUE(writer->Close().ok());
  }
  ImageShardOptions options;
  options.num_classes = 2;
  absl::StatusOr<ImageShard> read = ReadImageShard({path}, options);
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(read.status().message(),
              HasSubstr(path + ": record 1: missing feature \"image/class/label\" (present: "
                               "image/encoded)"));
  options.label_offset = 0;
  options.num_classes = 1;
  read = ReadImageShard({path}, options);
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(read.status().message(),
              HasSubstr(path + ": record 0: label 1 - label_offset 0 = 1 is outside [0, 1)"));
  // An MNIST-style file is not an image record file.
  const std::string mnist = dir + "/mnist";
  auto writer = *TFRecordWriter::Open(mnist);
  tf::Example example;
  (*example.mutable_features()->mutable_feature())["image_raw"].mutable_bytes_list()->add_value(
      "x");
  ASSERT_TRUE(writer->Write(example.SerializeAsString()).ok());
  ASSERT_TRUE(writer->Close().ok());
  EXPECT_FALSE(*IsImageRecordFile(mnist));
}

TEST(ImageRecordsTest, ShardsByFileOrElseByRecord) {
  const std::string dir = TestDir();
  const std::vector<std::string> files = WriteRecords(dir, 4, 3);
  const std::shared_ptr<const ImageShard> one = Shard(files, 1, 2);
  EXPECT_TRUE(one->sharded_by_file);
  EXPECT_THAT(one->files, ElementsAre(files[1], files[3]));
  EXPECT_EQ(one->size(), 6);
  // 4 files, 3 shards: shard 0 takes files 0 and 3.
  EXPECT_THAT(Shard(files, 0, 3)->files, ElementsAre(files[0], files[3]));
  // 4 files, 5 shards: of the 12 records, shard 2 takes records 2 and 7
  // (file 0 record 2, file 2 record 1).
  const std::shared_ptr<const ImageShard> by_record = Shard(files, 2, 5);
  EXPECT_FALSE(by_record->sharded_by_file);
  ASSERT_EQ(by_record->size(), 2);
  EXPECT_EQ(by_record->Where(0), files[0] + ": record 2");
  EXPECT_EQ(by_record->Where(1), files[2] + ": record 1");
}

TEST(ImagePipelineTest, BatchesDoNotDependOnThreads) {
  const std::string dir = TestDir();
  const auto shard = Shard(WriteRecords(dir, 2, 15));
  ImagePipeline one(shard, Options(1));
  ImagePipeline four(shard, Options(4));
  const std::vector<Batch> a = Take(&one, 10, 7);  // 70 examples: 2+ epochs.
  const std::vector<Batch> b = Take(&four, 10, 7);
  ASSERT_EQ(a.size(), 10u);
  EXPECT_TRUE(a == b);
  // Each epoch is a permutation of the shard: its labels are the shard's.
  std::vector<int32_t> first_epoch;
  for (int i = 0; i < 30; ++i) first_epoch.push_back(a[i / 7].labels[i % 7]);
  std::vector<int32_t> labels = shard->labels;
  std::sort(first_epoch.begin(), first_epoch.end());
  std::sort(labels.begin(), labels.end());
  EXPECT_EQ(first_epoch, labels);
  // Another seed, another order.
  ImagePipelineOptions other = Options(2);
  other.seed = 43;
  ImagePipeline reseeded(shard, other);
  EXPECT_FALSE(Take(&reseeded, 10, 7) == a);
  EXPECT_FALSE(one.NextBatch(8, nullptr, nullptr).ok());  // Wrong batch size.
}

TEST(ImagePipelineTest, SkipEqualsConsuming) {
  const std::string dir = TestDir();
  const auto shard = Shard(WriteRecords(dir, 2, 15));
  ImagePipeline consumed(shard, Options(2));
  const std::vector<Batch> all = Take(&consumed, 9, 7);
  ImagePipeline skipped(shard, Options(3));
  ASSERT_TRUE(skipped.Skip(5 * 7).ok());
  EXPECT_TRUE(Take(&skipped, 2, 7) == std::vector<Batch>(all.begin() + 5, all.begin() + 7));
  // After batches were prefetched too.
  ASSERT_TRUE(skipped.Skip(7).ok());
  EXPECT_TRUE(Take(&skipped, 1, 7)[0] == all[8]);
}

TEST(ImagePipelineTest, EvaluationCropsTheCenterWithoutFlips) {
  const std::string dir = TestDir();
  const auto shard = Shard(WriteRecords(dir, 1, 5));
  ImagePipelineOptions options = Options(2);
  absl::StatusOr<Dataset> data = DecodeImageDataset(shard, options);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->size(), 5);
  EXPECT_EQ(data->images.dim(1), 16 * 16 * 3);
  EXPECT_THAT(data->labels, ElementsAre(0, 1, 2, 3, 0));
  // Record 3, decoded and cropped here.
  Image image = *DecodeImage(shard->encoded[3], 3);
  std::vector<float> expected(16 * 16 * 3);
  CropResizeFlip(image, CentralCrop(24, 20, 0.875), 16, 16, false, expected.data());
  EXPECT_EQ(std::vector<float>(data->images.data() + 3 * 768, data->images.data() + 4 * 768),
            expected);
}

TEST(ImagePipelineTest, CorruptImageStopsNamingFileAndRecord) {
  const std::string dir = TestDir();
  const std::vector<std::string> files = WriteRecords(dir, 1, 10, {{0, 3}});
  ImagePipelineOptions options = Options(2);
  options.shuffle = false;
  ImagePipeline pipeline(Shard(files), options);
  Tensor images;
  std::vector<int32_t> labels;
  absl::Status status = pipeline.NextBatch(7, &images, &labels);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr(files[0] + ": record 3: JPEG: "));
}

TEST(ImagePipelineTest, CorruptImagesAreSkippedDeterministicallyAndCounted) {
  const std::string dir = TestDir();
  const std::vector<std::string> files = WriteRecords(dir, 1, 10, {{0, 3}, {0, 4}});
  const auto shard = Shard(files);
  ImagePipelineOptions options = Options(1);
  options.skip_corrupt = true;
  options.shuffle = false;
  options.train = false;
  ImagePipeline one(shard, options);
  const std::vector<Batch> a = Take(&one, 3, 7);
  // Records 3 and 4 are replaced by record 5, the next good one.
  ASSERT_EQ(a.size(), 3u);
  EXPECT_THAT(a[0].labels, ElementsAre(0, 1, 2, 1, 1, 1, 2));
  EXPECT_EQ(std::vector<float>(a[0].images.begin() + 3 * 768, a[0].images.begin() + 4 * 768),
            std::vector<float>(a[0].images.begin() + 5 * 768, a[0].images.begin() + 6 * 768));
  EXPECT_EQ(one.stats().corrupt_skipped, 2);  // Once each, over 2 epochs.
  options.threads = 4;
  ImagePipeline four(shard, options);
  EXPECT_TRUE(Take(&four, 3, 7) == a);
}

// Images left on disk (offsets only) give the same batches as images held
// in memory; gzip files are held in memory regardless.
TEST(ImagePipelineTest, ImagesReadFromDiskGiveTheSameBatches) {
  const std::string dir = TestDir();
  const std::vector<std::string> files = WriteRecords(dir, 2, 15);
  const auto disk = Shard(files, 0, 1, /*in_memory=*/false);
  ASSERT_EQ(disk->size(), 30);
  for (int64_t i = 0; i < disk->size(); ++i) ASSERT_TRUE(disk->encoded[i].empty()) << i;
  ImagePipeline from_disk(disk, Options(3));
  ImagePipeline from_memory(Shard(files), Options(2));
  EXPECT_TRUE(Take(&from_disk, 6, 7) == Take(&from_memory, 6, 7));

  const std::string gz = dir + "/gz";
  ::mkdir(gz.c_str(), 0755);
  const auto gzip = Shard(WriteRecords(gz, 1, 4, {}, /*gzip=*/true), 0, 1, false);
  for (int64_t i = 0; i < gzip->size(); ++i) EXPECT_FALSE(gzip->encoded[i].empty()) << i;
  ImagePipeline from_gzip(gzip, Options(1));
  EXPECT_EQ(Take(&from_gzip, 2, 7).size(), 2u);
}

// A record that changed on disk after the shard was indexed is a corrupt
// image: named, and stopping or skipped like one.
TEST(ImagePipelineTest, ARecordChangedOnDiskIsNamed) {
  const std::string dir = TestDir();
  const std::vector<std::string> files = WriteRecords(dir, 1, 10);
  const auto shard = Shard(files, 0, 1, /*in_memory=*/false);
  {
    std::fstream file(files[0], std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(shard->offset[2] + 12 + 100);
    file.put('\x5a');
  }
  ImagePipelineOptions options = Options(2);
  options.shuffle = false;
  ImagePipeline pipeline(shard, options);
  Tensor images;
  std::vector<int32_t> labels;
  absl::Status status = pipeline.NextBatch(7, &images, &labels);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat(files[0], ": record 2: the record at byte offset ",
                                     shard->offset[2], " changed since it was indexed")));
  options.skip_corrupt = true;
  ImagePipeline skipping(shard, options);
  EXPECT_EQ(Take(&skipping, 1, 7).size(), 1u);
  EXPECT_EQ(skipping.stats().corrupt_skipped, 1);
}

TEST(ImagePipelineTest, CountsTheTimeTheConsumerWaits) {
  const std::string dir = TestDir();
  const auto shard = Shard(WriteRecords(dir, 1, 20));
  ImagePipelineOptions options = Options(1);
  options.height = options.width = 64;  // Upsampling: some work per image.
  ImagePipeline pipeline(shard, options);
  Take(&pipeline, 1, 7);
  const ImagePipeline::Stats first = pipeline.stats();
  EXPECT_EQ(first.batches, 1);
  EXPECT_GT(first.wait, absl::ZeroDuration());  // Nothing was ready at the start.
  EXPECT_GT(first.busy, absl::ZeroDuration());
  // A slow step: the prefetched batches are ready when asked for.
  absl::SleepFor(absl::Milliseconds(300));
  Take(&pipeline, 2, 7);
  const ImagePipeline::Stats later = pipeline.stats();
  EXPECT_EQ(later.batches, 3);
  EXPECT_LT(later.wait - first.wait, absl::Milliseconds(100));
}

}  // namespace
}  // namespace psrt
