// The data-plane frame header: round trips, and every malformed header
// refused naming its fault.
#include "dataplane/frame.h"

#include <cstring>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace psrt {
namespace dataplane {
namespace {

using ::testing::HasSubstr;

FrameHeader Sample() {
  FrameHeader header;
  header.kind = FrameKind::kReply;
  header.method = FrameMethod::kPull;
  header.stripe = 3;
  header.meta_size = 17;
  header.request_id = 0x0102030405060708;
  header.data_size = 13'000'000;
  header.status = 0;
  return header;
}

std::string Encoded(const FrameHeader& header) {
  char bytes[kFrameHeaderBytes];
  EncodeFrameHeader(header, bytes);
  return std::string(bytes, kFrameHeaderBytes);
}

std::string Error(const std::string& bytes, uint64_t max_data = 1 << 30) {
  FrameHeader header;
  absl::Status status = DecodeFrameHeader(bytes, max_data, &header);
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  return std::string(status.message());
}

TEST(FrameTest, AHeaderRoundTripsLittleEndian) {
  const std::string bytes = Encoded(Sample());
  EXPECT_EQ(bytes.substr(0, 4), "PSDP");
  EXPECT_EQ(static_cast<uint8_t>(bytes[16]), 0x08);  // request_id's low byte first.
  FrameHeader back;
  ASSERT_TRUE(DecodeFrameHeader(bytes, 1 << 30, &back).ok());
  EXPECT_EQ(back.kind, FrameKind::kReply);
  EXPECT_EQ(back.method, FrameMethod::kPull);
  EXPECT_EQ(back.stripe, 3u);
  EXPECT_EQ(back.meta_size, 17u);
  EXPECT_EQ(back.request_id, 0x0102030405060708u);
  EXPECT_EQ(back.data_size, 13'000'000u);
  EXPECT_EQ(back.status, 0u);
}

TEST(FrameTest, MalformedHeadersAreRefusedNamingTheField) {
  const std::string good = Encoded(Sample());
  EXPECT_THAT(Error(good.substr(0, 40)), HasSubstr("a header is 48 bytes, got 40"));
  std::string bad = good;
  bad[0] = 'G';  // An HTTP/2 client ("GET", "PRI * HTTP/2.0") at the data port.
  EXPECT_THAT(Error(bad), HasSubstr("no PSDP magic"));
  bad = good;
  bad[20] ^= 1;  // Any changed byte: the checksum.
  EXPECT_THAT(Error(bad), HasSubstr("header checksum mismatch"));
  FrameHeader header = Sample();
  header.data_size = 2000;
  EXPECT_THAT(Error(Encoded(header), 1000),
              HasSubstr("data of 2000 bytes, more than the limit of 1000"));
  header = Sample();
  header.meta_size = kMaxMetaBytes + 1;
  EXPECT_THAT(Error(Encoded(header)), HasSubstr("metadata of 1048577 bytes"));
  header = Sample();
  header.kind = static_cast<FrameKind>(9);
  EXPECT_THAT(Error(Encoded(header)), HasSubstr("unknown kind 9"));
  header = Sample();
  header.method = static_cast<FrameMethod>(7);
  EXPECT_THAT(Error(Encoded(header)), HasSubstr("unknown method 7"));
  header = Sample();
  header.status = 99;
  EXPECT_THAT(Error(Encoded(header)), HasSubstr("status 99 is no status code"));
}

}  // namespace
}  // namespace dataplane
}  // namespace psrt
