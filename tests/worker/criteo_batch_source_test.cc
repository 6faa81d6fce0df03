// CriteoBatchSource: Criteo lines as the CTR models' batches (dense
// features as images, labels, ids), epochs, Skip, a replica's shard, and
// the ids through PrefetchingBatchSource.
#include "worker/input/criteo_batch_source.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/input/prefetching_batch_source.h"

namespace psrt {
namespace {

// Lines whose C1 is the line's index in hex and whose label is index % 2.
std::string WriteLines(const std::string& name, int n) {
  const std::string path = ::testing::TempDir() + "/criteo_batch_source_test_" + name;
  std::ofstream out(path);
  for (int i = 0; i < n; ++i) {
    out << (i % 2) << "\t" << i;
    for (int j = 1; j < kCriteoDenseFields; ++j) out << "\t";
    char hex[9];
    std::snprintf(hex, sizeof(hex), "%08x", i);
    out << "\t" << hex;
    for (int c = 1; c < kCriteoCategoricalFields; ++c) out << "\t";
    out << "\n";
  }
  return path;
}

CriteoReader::Options Files(const std::string& path, int shard = 0, int shards = 1) {
  CriteoReader::Options options;
  options.files = {path};
  options.shard = shard;
  options.num_shards = shards;
  return options;
}

// The C1 values (line indices) of a batch's ids.
std::vector<int> Lines(absl::Span<const uint64_t> ids) {
  std::vector<int> lines;
  for (size_t i = 0; i < ids.size(); i += kCriteoCategoricalFields) {
    lines.push_back(static_cast<int>(ids[i] - CriteoId(0, 0)));
  }
  return lines;
}

TEST(CriteoBatchSourceTest, BatchesWrapIntoTheNextEpoch) {
  auto source = CriteoBatchSource::Open(Files(WriteLines("epochs", 5)));
  ASSERT_TRUE(source.ok()) << source.status();
  Tensor images;
  std::vector<int32_t> labels;
  ASSERT_TRUE((*source)->NextBatch(3, &images, &labels).ok());
  EXPECT_EQ(images.shape(), (Shape{3, kCriteoDenseFields}));
  EXPECT_EQ((*source)->sparse_ids().size(), 3u * kCriteoCategoricalFields);
  EXPECT_EQ(Lines((*source)->sparse_ids()), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(labels, (std::vector<int32_t>{0, 1, 0}));
  EXPECT_FLOAT_EQ(images.data()[kCriteoDenseFields * 2], std::log(3.0f));  // log(1 + 2)
  ASSERT_TRUE((*source)->NextBatch(3, &images, &labels).ok());
  EXPECT_EQ(Lines((*source)->sparse_ids()), (std::vector<int>{3, 4, 0}));
  // A missing category has its field's own id.
  EXPECT_EQ((*source)->sparse_ids()[1], CriteoId(1, kCriteoMissing));
}

TEST(CriteoBatchSourceTest, SkipLandsWhereBatchesWould) {
  const std::string path = WriteLines("skip", 7);
  auto read = CriteoBatchSource::Open(Files(path, 1, 2));  // Lines 1, 3, 5.
  auto skipped = CriteoBatchSource::Open(Files(path, 1, 2));
  ASSERT_TRUE(read.ok() && skipped.ok());
  Tensor images;
  std::vector<int32_t> labels;
  for (int i = 0; i < 2; ++i) ASSERT_TRUE((*read)->NextBatch(2, &images, &labels).ok());
  ASSERT_TRUE((*skipped)->Skip(4).ok());
  ASSERT_TRUE((*read)->NextBatch(2, &images, &labels).ok());
  ASSERT_TRUE((*skipped)->NextBatch(2, &images, &labels).ok());
  EXPECT_EQ(Lines((*read)->sparse_ids()), (std::vector<int>{3, 5}));
  EXPECT_EQ(Lines((*skipped)->sparse_ids()), Lines((*read)->sparse_ids()));
}

TEST(CriteoBatchSourceTest, AShardWithoutLinesIsAnError) {
  auto source = CriteoBatchSource::Open(Files(WriteLines("empty", 1), 1, 2));
  ASSERT_TRUE(source.ok());
  Tensor images;
  std::vector<int32_t> labels;
  const absl::Status status = (*source)->NextBatch(2, &images, &labels);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
}

// Every line malformed and skipped: the error says so, and how many, rather
// than blaming the number of workers alone; the counting pass says the same.
TEST(CriteoBatchSourceTest, AShardOfSkippedLinesSaysHowManyWereSkipped) {
  const std::string path = ::testing::TempDir() + "/criteo_batch_source_test_malformed";
  std::ofstream(path) << "1\tnot a Criteo line\n2\tnor this\n";
  CriteoReader::Options options = Files(path);
  options.skip_malformed = true;
  auto source = CriteoBatchSource::Open(options);
  ASSERT_TRUE(source.ok()) << source.status();
  Tensor images;
  std::vector<int32_t> labels;
  const absl::Status status = (*source)->NextBatch(2, &images, &labels);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(status.message().find("; its 2 lines were malformed and skipped (--malformed_lines=skip)"),
            std::string::npos)
      << status;
  const absl::StatusOr<int64_t> count = CountCriteoExamples(options);
  EXPECT_EQ(count.status().code(), absl::StatusCode::kInvalidArgument) << count.status();
  EXPECT_NE(count.status().message().find(path + " holds no example (2 malformed lines skipped)"),
            std::string::npos)
      << count.status();
}

TEST(CriteoBatchSourceTest, PrefetchingKeepsEachBatchsIds) {
  const std::string path = WriteLines("prefetch", 10);
  auto inner = CriteoBatchSource::Open(Files(path));
  ASSERT_TRUE(inner.ok());
  PrefetchingBatchSource source(*std::move(inner), nullptr);
  Tensor images;
  std::vector<int32_t> labels;
  for (int batch = 0; batch < 4; ++batch) {
    ASSERT_TRUE(source.NextBatch(2, &images, &labels).ok());
    EXPECT_EQ(Lines(source.sparse_ids()),
              (std::vector<int>{(2 * batch) % 10, (2 * batch + 1) % 10}));
  }
  EXPECT_EQ(CountCriteoExamples(Files(path)).value(), 10);
}

}  // namespace
}  // namespace psrt
