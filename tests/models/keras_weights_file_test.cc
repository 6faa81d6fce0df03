#include "models/keras_weights_file.h"

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace psrt {
namespace {

using ::testing::HasSubstr;

const std::string kFixtures = PSRT_SOURCE_DIR "/tests/data/keras/weights/";

// A fresh, empty folder for one test.
std::string TestDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string dir = ::testing::TempDir() + "keras_weights_file_test_" + info->name();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

Tensor Filled(Shape shape, float first) {
  Tensor t(std::move(shape));
  for (int64_t i = 0; i < t.num_elements(); ++i) t.data()[i] = first + 0.25f * i;
  return t;
}

KerasWeightsEntry Entry(std::string path, std::string name, std::vector<Tensor> vars) {
  return {std::move(path), std::move(name), std::move(vars)};
}

std::vector<uint32_t> Bits(const Tensor& t) {
  std::vector<uint32_t> bits(t.num_elements());
  if (!bits.empty()) std::memcpy(bits.data(), t.data(), t.num_bytes());
  return bits;
}

void ExpectSameEntries(const std::vector<KerasWeightsEntry>& got,
                       const std::vector<const KerasWeightsEntry*>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t e = 0; e < got.size(); ++e) {
    SCOPED_TRACE(want[e]->path);
    EXPECT_EQ(got[e].path, want[e]->path);
    EXPECT_EQ(got[e].name, "");  // Names are written, not read.
    ASSERT_EQ(got[e].vars.size(), want[e]->vars.size());
    for (size_t v = 0; v < got[e].vars.size(); ++v) {
      EXPECT_EQ(got[e].vars[v].shape(), want[e]->vars[v].shape()) << "var " << v;
      EXPECT_EQ(Bits(got[e].vars[v]), Bits(want[e]->vars[v])) << "var " << v;
    }
  }
}

TEST(KerasWeightsFileTest, RoundTrip) {
  std::vector<KerasWeightsEntry> entries;
  entries.push_back(Entry("", "functional", {}));
  std::vector<Tensor> conv;
  conv.push_back(Filled({3, 3, 2, 4}, -5.0f));
  conv.push_back(Filled({4}, 1.0f));
  float* odd = conv[1].data();  // Bit patterns a conversion would change.
  odd[0] = -0.0f;
  odd[1] = std::numeric_limits<float>::denorm_min();
  odd[2] = std::numeric_limits<float>::infinity();
  odd[3] = std::numeric_limits<float>::quiet_NaN();
  entries.push_back(Entry("layers/sequential/layers/conv2d", "conv", std::move(conv)));
  std::vector<Tensor> dense;
  dense.push_back(Filled({3, 2}, 0.5f));
  dense.push_back(Filled({}, 7.0f));  // A scalar.
  entries.push_back(Entry("layers/dense_1", "dense \xc3\xa9", std::move(dense)));  // UTF-8.
  entries.push_back(Entry("layers/activation", "relu", {}));
  const std::string file = TestDir() + "/model.weights.h5";
  ASSERT_TRUE(WriteKerasWeights(file, entries).ok());

  const auto read = ReadKerasWeights(file);
  ASSERT_TRUE(read.ok()) << read.status();
  // In HDF5's order: by name, depth-first ("layers" before the root's "vars").
  ExpectSameEntries(*read, {&entries[3], &entries[2], &entries[1], &entries[0]});
}

TEST(KerasWeightsFileTest, RewritesWholeFile) {
  const std::string dir = TestDir();
  const std::string file = dir + "/model.weights.h5";
  std::vector<KerasWeightsEntry> first;
  first.push_back(Entry("layers/a", "a", {}));
  first.push_back(Entry("layers/b", "b", {}));
  ASSERT_TRUE(WriteKerasWeights(file, first).ok());
  std::vector<KerasWeightsEntry> second;
  second.push_back(Entry("layers/c", "c", {}));
  second[0].vars.push_back(Filled({2}, 3.0f));
  ASSERT_TRUE(WriteKerasWeights(file, second).ok());

  const auto read = ReadKerasWeights(file);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSameEntries(*read, {&second[0]});
  int files = 0;  // No temporary file left beside it.
  for (const auto& f : std::filesystem::directory_iterator(dir)) files += f.is_regular_file();
  EXPECT_EQ(files, 1);
}

TEST(KerasWeightsFileTest, RefusesPathGivenTwiceKeepingOldFile) {
  const std::string file = TestDir() + "/model.weights.h5";
  std::vector<KerasWeightsEntry> old;
  old.push_back(Entry("layers/dense", "d", {}));
  ASSERT_TRUE(WriteKerasWeights(file, old).ok());
  std::vector<KerasWeightsEntry> entries;
  entries.push_back(Entry("layers/dense", "d1", {}));
  entries.push_back(Entry("layers/dense", "d2", {}));
  const absl::Status status = WriteKerasWeights(file, entries);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(file));
  EXPECT_THAT(status.message(), HasSubstr("layers/dense/vars"));

  const auto read = ReadKerasWeights(file);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSameEntries(*read, {&old[0]});
}

// small.weights.h5: what Keras 3.15 writes (scripts/gen_keras_fixtures.py,
// keras_weights_fixture) for Input (8, 8, 3), Conv2D(4, 3, name="c1"),
// BatchNormalization(name="bn"), Activation("relu"), DepthwiseConv2D(3,
// name="dw"), SeparableConv2D(4, 1, name="sep"), GlobalAveragePooling2D(),
// LayerNormalization(name="ln"), Dense(2, name="d"). Variable k of the file
// (in the order read), element i, holds float(0.001 * (i + 1) + k).
TEST(KerasWeightsFileTest, ReadsKerasFile) {
  struct Want {
    std::string path;
    std::string name;
    std::vector<Shape> shapes;
  };
  const std::vector<Want> want = {
      {"layers/activation", "activation", {}},
      {"layers/batch_normalization", "bn", {{4}, {4}, {4}, {4}}},
      {"layers/conv2d", "c1", {{3, 3, 3, 4}, {4}}},
      {"layers/dense", "d", {{4, 2}, {2}}},
      {"layers/depthwise_conv2d", "dw", {{3, 3, 4, 1}, {4}}},
      {"layers/global_average_pooling2d", "global_average_pooling2d", {}},
      {"layers/input_layer", "input_layer", {}},
      {"layers/layer_normalization", "ln", {{4}, {4}}},
      {"layers/separable_conv2d", "sep", {{1, 1, 4, 1}, {1, 1, 4, 4}, {4}}},
      {"", "functional", {}},
  };
  const auto read = ReadKerasWeights(kFixtures + "small.weights.h5");
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), want.size());
  int k = 0;
  for (size_t e = 0; e < want.size(); ++e) {
    const KerasWeightsEntry& entry = (*read)[e];
    SCOPED_TRACE(want[e].path);
    EXPECT_EQ(entry.path, want[e].path);
    EXPECT_EQ(entry.name, "");
    ASSERT_EQ(entry.vars.size(), want[e].shapes.size());
    for (size_t v = 0; v < entry.vars.size(); ++v, ++k) {
      const Tensor& var = entry.vars[v];
      ASSERT_EQ(var.shape(), want[e].shapes[v]) << "var " << v;
      for (int64_t i = 0; i < var.num_elements(); ++i) {
        ASSERT_EQ(var.data()[i], static_cast<float>(0.001 * (i + 1) + k))
            << "var " << v << " element " << i;
      }
    }
  }
  EXPECT_EQ(k, 15);
}

void ExpectRefused(const std::string& file, absl::StatusCode code, const std::string& what) {
  const auto read = ReadKerasWeights(file);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), code) << read.status();
  EXPECT_THAT(read.status().message(), HasSubstr(file));
  EXPECT_THAT(read.status().message(), HasSubstr(what));
}

TEST(KerasWeightsFileTest, RefusesMissingGarbageAndTruncatedFiles) {
  const std::string dir = TestDir();
  ExpectRefused(dir + "/missing.weights.h5", absl::StatusCode::kNotFound, "no such file");

  const std::string garbage = dir + "/garbage.weights.h5";
  std::ofstream(garbage) << std::string(4096, 'x');
  ExpectRefused(garbage, absl::StatusCode::kDataLoss, "not an HDF5 file");

  const std::string truncated = dir + "/truncated.weights.h5";
  std::filesystem::copy_file(kFixtures + "small.weights.h5", truncated);
  std::filesystem::resize_file(truncated, std::filesystem::file_size(truncated) / 2);
  ExpectRefused(truncated, absl::StatusCode::kDataLoss, "damaged");
}

TEST(KerasWeightsFileTest, RefusesOtherTypesAndMissingVars) {
  ExpectRefused(kFixtures + "float64.weights.h5", absl::StatusCode::kInvalidArgument,
                "dataset layers/dense/vars/0 is not float32");
  ExpectRefused(kFixtures + "gap.weights.h5", absl::StatusCode::kInvalidArgument,
                "no layers/dense/vars/1");
}

}  // namespace
}  // namespace psrt
