// CriteoReader and the synthetic Criteo writer: lines parsed as Criteo's
// logs define them (missing values, Criteo's negative counts, either hex
// case, CRLF), plain and gzip files, malformed lines named by file and line
// or counted and skipped, shards that partition the lines, rewinds, and
// generated files that read back with a planted AUC a model can learn.
#include "worker/input/criteo_reader.h"

#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/input/synthetic_criteo.h"

namespace psrt {
namespace {

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/criteo_reader_test_" + name;
}

void WritePlain(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

void WriteGzip(const std::string& path, const std::string& text) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, text.data(), text.size()), static_cast<int>(text.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

// A line with label `label`, counts I1 = i1 (others 0 or missing) and
// categories C1 = c1, C26 = c26 (others "00000000").
std::string Line(const std::string& label, const std::string& i1, const std::string& c1,
                 const std::string& c26) {
  std::string line = label + "\t" + i1;
  for (int j = 2; j <= kCriteoDenseFields; ++j) line += j == 13 ? "\t" : "\t3";
  line += "\t" + c1;
  for (int c = 2; c < kCriteoCategoricalFields; ++c) line += "\t00000000";
  return line + "\t" + c26 + "\n";
}

absl::StatusOr<std::unique_ptr<CriteoReader>> Open(std::vector<std::string> files, int shard = 0,
                                                   int num_shards = 1, bool skip = false) {
  CriteoReader::Options options;
  options.files = std::move(files);
  options.shard = shard;
  options.num_shards = num_shards;
  options.skip_malformed = skip;
  return CriteoReader::Open(options);
}

TEST(CriteoReaderTest, ParsesCountsCategoriesAndMissingValues) {
  const std::string path = TempPath("parse.txt");
  std::string last = Line("1", "7", "0a0b0c0d", "00000000");
  last.back() = '\r';  // CRLF's CR, and no newline at the end of the file.
  WritePlain(path, Line("1", "0", "68fd1e64", "DEADbeef") + Line("0", "-2", "", "") +
                       Line("0", "", "80e26c9b", "c9d4222a") + last);
  auto reader = Open({path});
  ASSERT_TRUE(reader.ok()) << reader.status();
  CtrBatch batch;
  ASSERT_TRUE((*reader)->Read(10, &batch).ok());
  ASSERT_EQ(batch.size(), 4);
  EXPECT_EQ(batch.labels, std::vector<int32_t>({1, 0, 0, 1}));
  EXPECT_EQ(batch.dense[0], 0.0f);                                  // log(1 + 0).
  EXPECT_FLOAT_EQ(batch.dense[1], std::log1p(3.0f));                // I2 = 3.
  EXPECT_EQ(batch.dense[12], 0.0f);                                 // I13 missing.
  EXPECT_EQ(batch.dense[13], 0.0f);                                 // A negative count.
  EXPECT_EQ(batch.dense[26], 0.0f);                                 // I1 missing.
  EXPECT_FLOAT_EQ(batch.dense[39], std::log1p(7.0f));
  EXPECT_EQ(batch.ids[0], CriteoId(0, 0x68fd1e64));
  EXPECT_EQ(batch.ids[25], CriteoId(25, 0xdeadbeef));               // Either case.
  EXPECT_EQ(batch.ids[26], CriteoId(0, kCriteoMissing));
  EXPECT_EQ(batch.ids[51], CriteoId(25, kCriteoMissing));
  // Equal hex in two fields: two ids.
  EXPECT_EQ(batch.ids[1], CriteoId(1, 0));
  EXPECT_EQ(batch.ids[2], CriteoId(2, 0));
  EXPECT_NE(batch.ids[1], batch.ids[2]);
  EXPECT_EQ(batch.ids[3 * 26 + 25], CriteoId(25, 0));               // Before the '\r'.
  ASSERT_TRUE((*reader)->Read(10, &batch).ok());
  EXPECT_EQ(batch.size(), 0);  // The end.
}

TEST(CriteoReaderTest, ReadsGzipAndPlainFilesInOrderAndRewinds) {
  std::string first, second;
  for (int i = 0; i < 5; ++i) first += Line(i % 2 ? "1" : "0", std::to_string(i), "", "");
  for (int i = 5; i < 12; ++i) second += Line("0", std::to_string(i), "", "");
  WriteGzip(TempPath("a.gz"), first);
  WritePlain(TempPath("b.txt"), second);
  auto reader = Open({TempPath("a.gz"), TempPath("b.txt")});
  ASSERT_TRUE(reader.ok()) << reader.status();
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<float> counts;
    CtrBatch batch;
    do {
      ASSERT_TRUE((*reader)->Read(4, &batch).ok());
      for (int n = 0; n < batch.size(); ++n) counts.push_back(batch.dense[n * 13]);
    } while (batch.size() == 4);
    ASSERT_EQ(counts.size(), 12u);
    for (int i = 0; i < 12; ++i) EXPECT_FLOAT_EQ(counts[i], std::log1p(float(i))) << i;
    ASSERT_TRUE((*reader)->Rewind().ok());
  }
}

TEST(CriteoReaderTest, ShardsPartitionTheLines) {
  std::string text;
  for (int i = 0; i < 23; ++i) text += Line("0", std::to_string(i), "", "");
  WritePlain(TempPath("shards.txt"), text);
  std::multiset<float> seen;
  for (int shard = 0; shard < 3; ++shard) {
    auto reader = Open({TempPath("shards.txt")}, shard, 3);
    ASSERT_TRUE(reader.ok()) << reader.status();
    CtrBatch batch;
    ASSERT_TRUE((*reader)->Read(100, &batch).ok());
    EXPECT_EQ(batch.size(), shard < 2 ? 8 : 7);
    for (int n = 0; n < batch.size(); ++n) seen.insert(batch.dense[n * 13]);
  }
  ASSERT_EQ(seen.size(), 23u);
  for (int i = 0; i < 23; ++i) EXPECT_EQ(seen.count(std::log1p(float(i))), 1u) << i;
  EXPECT_FALSE(Open({TempPath("shards.txt")}, 3, 3).ok());
}

TEST(CriteoReaderTest, AMalformedLineIsNamedOrCountedAndSkipped) {
  const std::string good = Line("1", "4", "", "");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"2" + good.substr(1), "label"},
      {Line("1", "4.5", "", ""), "I1 is \"4.5\""},
      {Line("1", "4", "12345", ""), "C1 is \"12345\""},
      {Line("1", "4", "1234567g", ""), "not 8 hex digits"},
      {good.substr(0, good.size() - 10) + "\n", "39 tab-separated fields"},
      {"\n", "an empty line"},
      {good.substr(0, good.size() - 1) + "\textra\n", "more than 40"},
  };
  for (const auto& [line, why] : bad) {
    const std::string path = TempPath("bad.txt");
    WritePlain(path, good + good + line + good);
    auto reader = Open({path});
    ASSERT_TRUE(reader.ok());
    CtrBatch batch;
    const absl::Status read = (*reader)->Read(10, &batch);
    EXPECT_EQ(read.code(), absl::StatusCode::kInvalidArgument) << why;
    EXPECT_NE(read.message().find(path + ":3: "), std::string::npos) << read;
    EXPECT_NE(read.message().find(why), std::string::npos) << read;

    auto skipping = Open({path}, 0, 1, /*skip=*/true);
    ASSERT_TRUE(skipping.ok());
    ASSERT_TRUE((*skipping)->Read(10, &batch).ok()) << why;
    EXPECT_EQ(batch.size(), 3) << why;
    EXPECT_EQ((*skipping)->malformed_lines(), 1) << why;
  }
  // A gzip file cut short is lost data, not an early end.
  std::string lines;
  for (int i = 0; i < 2000; ++i) lines += Line("1", std::to_string(i), "68fd1e64", "");
  WriteGzip(TempPath("whole.gz"), lines);
  std::string bytes;
  {
    std::ifstream in(TempPath("whole.gz"), std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  WritePlain(TempPath("cut.gz"), bytes.substr(0, bytes.size() / 2));
  auto cut = Open({TempPath("cut.gz")});
  ASSERT_TRUE(cut.ok());
  CtrBatch batch;
  absl::Status read;
  do {
    read = (*cut)->Read(100, &batch);
  } while (read.ok() && batch.size() > 0);
  EXPECT_EQ(read.code(), absl::StatusCode::kDataLoss) << read;
  EXPECT_NE(read.message().find("cut.gz"), std::string::npos) << read;

  auto missing = Open({TempPath("no_such_file.gz")});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("no_such_file.gz"), std::string::npos);
}

TEST(SyntheticCriteoTest, WritesReadableLinesWithALearnablePlantedModel) {
  SyntheticCriteoOptions options;
  options.rows = 20000;
  options.max_vocabulary = 1000;
  const std::string path = TempPath("synthetic.gz");
  auto summary = WriteSyntheticCriteo(path, options);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->rows, 20000);
  // About a quarter click, as in Criteo's logs; the model is learnable but
  // not trivial.
  EXPECT_GT(summary->positives, 2000);
  EXPECT_LT(summary->positives, 10000);
  EXPECT_GT(summary->planted_auc, 0.7);
  EXPECT_LT(summary->planted_auc, 0.95);

  auto reader = Open({path});
  ASSERT_TRUE(reader.ok()) << reader.status();
  CtrBatch batch;
  ASSERT_TRUE((*reader)->Read(30000, &batch).ok());
  ASSERT_EQ(batch.size(), 20000);
  int64_t positives = 0, missing = 0;
  std::set<uint64_t> field_ids[kCriteoCategoricalFields];
  for (int n = 0; n < batch.size(); ++n) {
    positives += batch.labels[n];
    for (int c = 0; c < kCriteoCategoricalFields; ++c) {
      const uint64_t id = batch.ids[n * kCriteoCategoricalFields + c];
      ASSERT_EQ(id >> 33, static_cast<uint64_t>(c));
      if ((id & ((uint64_t{1} << 33) - 1)) == kCriteoMissing) ++missing;
      field_ids[c].insert(id);
    }
  }
  EXPECT_EQ(positives, summary->positives);
  EXPECT_GT(missing, 0);
  // Vocabularies grow field by field up to max_vocabulary (+1: missing).
  EXPECT_LE(field_ids[0].size(), 11u);
  EXPECT_GT(field_ids[25].size(), 200u);
  EXPECT_LE(field_ids[25].size(), 1001u);

  // The same seeds write the same file; another seed other rows of the
  // same model (its best AUC about the same).
  auto again = WriteSyntheticCriteo(TempPath("again.gz"), options);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->positives, summary->positives);
  EXPECT_EQ(again->planted_auc, summary->planted_auc);
  options.seed = 2;
  auto other = WriteSyntheticCriteo(TempPath("other.gz"), options);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->positives, summary->positives);
  EXPECT_NEAR(other->planted_auc, summary->planted_auc, 0.02);
  EXPECT_FALSE(WriteSyntheticCriteo(TempPath("none.gz"), {0, 1, 1, 100}).ok());
}

}  // namespace
}  // namespace psrt
