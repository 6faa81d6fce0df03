#include "common/tensor_frame.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "proto/psrt.pb.h"

namespace psrt {
namespace {

proto::PushHeader Header() {
  proto::PushHeader header;
  header.set_replica(3);
  header.set_version(42);
  auto* meta = header.add_variables();
  meta->set_name("w");
  meta->set_dtype(proto::DT_FLOAT);
  meta->add_shape(5);
  return header;
}

// Re-slices a buffer into pieces of `piece` bytes, as the network might.
grpc::ByteBuffer Reslice(const grpc::ByteBuffer& in, size_t piece) {
  grpc::Slice flat;
  EXPECT_TRUE(in.DumpToSingleSlice(&flat).ok());
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < flat.size(); at += piece) {
    slices.push_back(flat.sub(at, std::min(flat.size(), at + piece)));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

TEST(TensorFrameTest, RoundTripsThroughAnySlicing) {
  std::vector<float> a = {1, 2, 3};
  std::vector<float> b = {4, 5};
  grpc::ByteBuffer frame = EncodeTensorFrame(
      Header(), {{reinterpret_cast<const char*>(a.data()), 12},
                 {reinterpret_cast<const char*>(b.data()), 8}});
  for (size_t piece : {size_t{1}, size_t{3}, size_t{7}, size_t{1000}}) {
    grpc::ByteBuffer sliced = Reslice(frame, piece);
    TensorFrameReader reader;
    proto::PushHeader header;
    ASSERT_TRUE(reader.Open(sliced, &header).ok()) << piece;
    EXPECT_EQ(header.version(), 42);
    EXPECT_EQ(header.variables(0).name(), "w");
    ASSERT_EQ(reader.size(), 20u);
    std::vector<float> got(5);
    // Read out of order and across slice boundaries.
    reader.ReadAt(8, {reinterpret_cast<char*>(got.data() + 2), 12});
    reader.ReadAt(0, {reinterpret_cast<char*>(got.data()), 8});
    EXPECT_EQ(got, (std::vector<float>{1, 2, 3, 4, 5})) << piece;
  }
}

TEST(TensorFrameTest, IsAnOrdinaryProtobufMessage) {
  std::vector<float> a = {1.5f, -2.5f};
  grpc::ByteBuffer frame =
      EncodeTensorFrame(Header(), {{reinterpret_cast<const char*>(a.data()), 8}});
  grpc::Slice flat;
  ASSERT_TRUE(frame.DumpToSingleSlice(&flat).ok());
  proto::PushRequest request;
  ASSERT_TRUE(request.ParseFromArray(flat.begin(), flat.size()));
  EXPECT_EQ(request.header().replica(), 3);
  ASSERT_EQ(request.tensor_data().size(), 8u);
  float back[2];
  std::memcpy(back, request.tensor_data().data(), 8);
  EXPECT_EQ(back[0], 1.5f);
  EXPECT_EQ(back[1], -2.5f);
}

TEST(TensorFrameTest, ReleaseRunsWhenGrpcDropsTheData) {
  std::vector<float> a = {1, 2};
  bool released = false;
  {
    grpc::ByteBuffer frame = EncodeTensorFrame(
        Header(), {{reinterpret_cast<const char*>(a.data()), 8}},
        [&released] { released = true; });
    EXPECT_FALSE(released);
    grpc::ByteBuffer copy = frame;  // gRPC holds its own reference.
    frame.Clear();
    EXPECT_FALSE(released);
  }
  EXPECT_TRUE(released);
}

TEST(TensorFrameTest, RefusesMalformedFrames) {
  auto open = [](const std::string& bytes) {
    grpc::Slice slice(bytes);
    grpc::ByteBuffer buffer(&slice, 1);
    TensorFrameReader reader;
    proto::PushHeader header;
    return reader.Open(buffer, &header);
  };
  proto::PushRequest request;
  *request.mutable_header() = Header();
  request.set_tensor_data(std::string(20, '\0'));
  const std::string good = request.SerializeAsString();
  ASSERT_TRUE(open(good).ok());
  EXPECT_FALSE(open("").ok());
  EXPECT_FALSE(open(good.substr(0, good.size() - 1)).ok());  // Truncated data.
  EXPECT_FALSE(open(good.substr(0, 5)).ok());                // Truncated header.
  EXPECT_FALSE(open(std::string("\x0a\x02\x00", 3)).ok());  // Header past the end.
  EXPECT_FALSE(open(std::string("\x0a\x00\x12\x05\x00", 5)).ok());  // Data past the end.
  EXPECT_FALSE(open(good + "x").ok());                       // Trailing bytes.
  std::string wrong_order = good;
  wrong_order[0] = 0x12;  // Data tag where the header belongs.
  EXPECT_EQ(open(wrong_order).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace psrt
