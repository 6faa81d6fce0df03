#include "common/safetensors.h"

#include <fstream>

#include "gtest/gtest.h"

namespace psrt {
namespace {

TEST(SafetensorsTest, RoundTrip) {
  Tensor a({2, 3});
  Tensor b({4});
  for (int i = 0; i < 6; ++i) a.data()[i] = i * 0.5f;
  for (int i = 0; i < 4; ++i) b.data()[i] = -i;
  const std::string path = testing::TempDir() + "/round_trip.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, {{"layer/w", &a}, {"layer/b", &b}},
                               {{"global_step", "7"}})
                  .ok());
  auto file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->tensors.size(), 2u);
  EXPECT_EQ(file->tensors[0].first, "layer/w");
  EXPECT_EQ(file->tensors[0].second.shape(), (Shape{2, 3}));
  EXPECT_EQ(file->tensors[0].second.data()[5], 2.5f);
  EXPECT_EQ(file->tensors[1].first, "layer/b");
  EXPECT_EQ(file->tensors[1].second.data()[3], -3.0f);
  EXPECT_EQ(file->metadata.at("global_step"), "7");
}

TEST(SafetensorsTest, RefusesTruncatedFile) {
  Tensor a({100});
  const std::string path = testing::TempDir() + "/truncated.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, {{"a", &a}}).ok());
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  for (size_t keep : {size_t{4}, size_t{20}, bytes.size() - 1}) {
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), keep);
    auto file = ReadSafetensors(path);
    EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << keep;
    EXPECT_NE(file.status().message().find(path), absl::string_view::npos);
  }
}

TEST(SafetensorsTest, RefusesAFlippedDataBit) {
  Tensor a({64});
  const std::string path = testing::TempDir() + "/flipped.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, {{"a", &a}}).ok());
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  const std::streamoff last = f.tellg() - std::streamoff{1};
  f.seekp(last);
  f.put('\x01');
  f.close();
  auto file = ReadSafetensors(path);
  EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(file.status().message().find("corrupt"), absl::string_view::npos);
}

TEST(SafetensorsTest, ReadsEmptyTensorsAtAnyPosition) {
  Tensor a({3}), empty({0, 4}), b({2});
  const std::string path = testing::TempDir() + "/empty.safetensors";
  for (int i = 0; i < 20; ++i) {  // Names hash differently; order must not matter.
    ASSERT_TRUE(WriteSafetensors(path, {{"a" + std::to_string(i), &a},
                                        {"z" + std::to_string(i), &empty},
                                        {"b" + std::to_string(i), &b}})
                    .ok());
    auto file = ReadSafetensors(path);
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ(file->tensors.size(), 3u);
  }
}

TEST(SafetensorsTest, RefusesAChangedHeader) {
  Tensor a({4});
  const std::string path = testing::TempDir() + "/header.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, {{"a", &a}}, {{"step", "1234"}}).ok());
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t at = bytes.find("1234");
  ASSERT_NE(at, std::string::npos);
  bytes[at] = '9';  // Still valid JSON, a different step.
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  EXPECT_EQ(ReadSafetensors(path).status().code(), absl::StatusCode::kDataLoss);
}

// A file of `header` JSON and `data_bytes` zero bytes.
std::string FileBytes(const std::string& header, size_t data_bytes) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(uint64_t{header.size()} >> (8 * i));
  return bytes + header + std::string(data_bytes, '\0');
}

TEST(SafetensorsTest, ParsesBytesInMemory) {
  auto file = ParseSafetensors(
      FileBytes(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8), "mem");
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->tensors.size(), 1u);
  EXPECT_EQ(file->tensors[0].second.shape(), (Shape{2}));
}

// Found by fuzz/safetensors_fuzzer.cc: offsets such as -16 were cast to
// size_t (undefined behavior); non-integer or non-number dimensions were
// truncated or read as 0.
TEST(SafetensorsTest, RefusesOffsetsAndDimensionsThatAreNotIndices) {
  for (const char* tensor : {
           R"("shape":[2],"data_offsets":[-16,8])",
           R"("shape":[2],"data_offsets":[0,1e300])",
           R"("shape":[2],"data_offsets":[0.5,8])",
           R"("shape":[2],"data_offsets":["0",8])",
           R"("shape":[2],"data_offsets":{"0":8})",
           R"("shape":[1.5],"data_offsets":[0,4])",
           R"("shape":["2"],"data_offsets":[0,8])",
           R"("shape":[-2],"data_offsets":[0,8])",
           R"("shape":2,"data_offsets":[0,8])",
       }) {
    const std::string header = std::string(R"({"t":{"dtype":"F32",)") + tensor + "}}";
    auto file = ParseSafetensors(FileBytes(header, 8), "mem");
    EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << header;
    EXPECT_NE(file.status().message().find("mem: tensor \"t\""), absl::string_view::npos)
        << file.status();
  }
}

}  // namespace
}  // namespace psrt
