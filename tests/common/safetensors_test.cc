#include "common/safetensors.h"

#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

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

// Embedding ids: I64 and U64 tensors beside F32 ones, every bit kept.
TEST(SafetensorsTest, RoundTripsIntegerTensors) {
  const std::vector<int64_t> signed_ids = {0, -1, int64_t{1} << 62};
  const std::vector<uint64_t> unsigned_ids = {~uint64_t{0}, 7};
  Tensor values({3, 2});
  for (int i = 0; i < 6; ++i) values.data()[i] = i;
  const std::string path = testing::TempDir() + "/integers.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, {{"emb/ids", {3}, signed_ids.data()},
                                      {"emb/values", &values},
                                      {"other/ids", {2, 1}, unsigned_ids.data()}})
                  .ok());
  auto file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->checksum_verified);
  ASSERT_EQ(file->tensors.size(), 1u);
  EXPECT_EQ(file->tensors[0].first, "emb/values");
  ASSERT_EQ(file->integers.size(), 2u);
  EXPECT_EQ(file->integers[0].first, "emb/ids");
  EXPECT_EQ(file->integers[0].second.dtype, SafetensorsDtype::kI64);
  EXPECT_EQ(file->integers[0].second.shape, (Shape{3}));
  EXPECT_EQ(file->integers[0].second.values,
            (std::vector<uint64_t>{0, ~uint64_t{0}, uint64_t{1} << 62}));
  EXPECT_EQ(file->integers[1].second.dtype, SafetensorsDtype::kU64);
  EXPECT_EQ(file->integers[1].second.shape, (Shape{2, 1}));
  EXPECT_EQ(file->integers[1].second.values, unsigned_ids);
  // The header says what Python's safetensors expects.
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  EXPECT_NE(bytes.find(R"("emb/ids":{"dtype":"I64","shape":[3],"data_offsets":[0,24]})"),
            std::string::npos);
  EXPECT_NE(bytes.find(R"("other/ids":{"dtype":"U64","shape":[2,1],"data_offsets":[48,64]})"),
            std::string::npos);
  // An integer tensor's byte count is checked against its shape too.
  auto short_ints = ParseSafetensors(
      FileBytes(R"({"t":{"dtype":"I64","shape":[2],"data_offsets":[0,8]}})", 8), "mem");
  EXPECT_EQ(short_ints.status().code(), absl::StatusCode::kInvalidArgument);
  auto other = ParseSafetensors(
      FileBytes(R"({"t":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})", 8), "mem");
  EXPECT_NE(other.status().message().find("\"I32\""), absl::string_view::npos)
      << other.status();
}

// A produced tensor is written as the same tensor given whole; one whose
// producer gives too few or too many bytes, or a repeated name, is refused
// and leaves no file.
TEST(SafetensorsTest, WritesProducedTensorsAndRefusesWrongByteCounts) {
  std::vector<float> whole(3000);
  for (size_t i = 0; i < whole.size(); ++i) whole[i] = i * 0.25f;
  // Pieces of 1 float and one of 2 MiB-ish, to cross the writer's buffer.
  std::vector<float> big(600000, 1.5f);
  auto produce = [&](absl::FunctionRef<void(absl::string_view)> emit) {
    for (const float& f : whole) emit({reinterpret_cast<const char*>(&f), 4});
    emit({reinterpret_cast<const char*>(big.data()), big.size() * 4});
  };
  std::vector<float> expected = whole;
  expected.insert(expected.end(), big.begin(), big.end());
  const Shape shape = {static_cast<int64_t>(expected.size())};
  const std::string made = testing::TempDir() + "/produced.safetensors";
  const std::string given = testing::TempDir() + "/given.safetensors";
  ASSERT_TRUE(WriteSafetensors(made, {{"x", shape, SafetensorsDtype::kF32, produce}}).ok());
  ASSERT_TRUE(WriteSafetensors(given, {{"x", shape, expected.data()}}).ok());
  auto read = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(read(made), read(given));

  for (int64_t n : {int64_t{2}, static_cast<int64_t>(expected.size()) + 1}) {
    const std::string path = testing::TempDir() + "/wrong_count.safetensors";
    const absl::Status status =
        WriteSafetensors(path, {{"x", {n}, SafetensorsDtype::kF32, produce}});
    EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << n;
    EXPECT_NE(status.message().find("tensor \"x\""), absl::string_view::npos) << status;
    EXPECT_FALSE(std::ifstream(path).good());
  }
  const absl::Status twice = WriteSafetensors(
      testing::TempDir() + "/twice.safetensors", {{"x", shape, expected.data()},
                                                   {"x", shape, expected.data()}});
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(twice.message().find("\"x\" given twice"), absl::string_view::npos) << twice;
}

}  // namespace
}  // namespace psrt
