#include "common/crc32c.h"

#include <string>

#include "gtest/gtest.h"

namespace psrt {
namespace {

// Bit at a time, straight from the definition: the oracle for the tables.
uint32_t SlowCrc32c(const std::string& data) {
  uint32_t crc = 0xffffffffu;
  for (unsigned char byte : data) {
    crc ^= byte;
    for (int i = 0; i < 8; ++i) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1)));
  }
  return ~crc;
}

TEST(Crc32cTest, StandardVectors) {
  EXPECT_EQ(crc32c::Value("123456789"), 0xe3069283u);  // The check value.
  EXPECT_EQ(crc32c::Value(""), 0u);
  EXPECT_EQ(crc32c::Value("a"), 0xc1d04330u);
  // RFC 3720 (iSCSI), B.4.
  EXPECT_EQ(crc32c::Value(std::string(32, '\0')), 0x8a9136aau);
  EXPECT_EQ(crc32c::Value(std::string(32, '\xff')), 0x62a8ab43u);
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(crc32c::Value(ascending), 0x46dd794eu);
  EXPECT_EQ(crc32c::Value(descending), 0x113fdb5cu);
}

TEST(Crc32cTest, MatchesBitwiseDefinitionAtEveryLengthAndAlignment) {
  std::string data;
  uint32_t x = 12345;
  for (int i = 0; i < 300; ++i) {
    x = x * 1103515245u + 12345u;
    data.push_back(static_cast<char>(x >> 16));
  }
  for (size_t start = 0; start < 9; ++start) {
    for (size_t n = 0; start + n <= data.size(); n += 7) {
      const std::string piece = data.substr(start, n);
      ASSERT_EQ(crc32c::Value(data.data() + start, n), SlowCrc32c(piece))
          << "start " << start << " length " << n;
    }
  }
}

TEST(Crc32cTest, ExtendComposes) {
  const std::string data = "The quick brown fox jumps over the lazy dog";
  const uint32_t whole = crc32c::Value(data);
  for (size_t split = 0; split <= data.size(); ++split) {
    const uint32_t head = crc32c::Value(data.data(), split);
    EXPECT_EQ(crc32c::Extend(head, data.data() + split, data.size() - split),
              whole)
        << split;
  }
}

TEST(Crc32cTest, MaskMatchesTFRecordFormula) {
  // ((crc >> 15) | (crc << 17)) + 0xa282ead8; values cross-checked with
  // TensorBoard's Python masked_crc32c.
  EXPECT_EQ(crc32c::Mask(0xe3069283u), 0xc78ab0e5u);
  EXPECT_EQ(crc32c::Mask(0u), 0xa282ead8u);
  EXPECT_EQ(crc32c::Mask(crc32c::Value(std::string(8, '\0'))), 0x07980329u);
  EXPECT_EQ(crc32c::Mask(crc32c::Value("a")), 0x28e46e78u);
  const uint32_t crc = crc32c::Value("123456789");
  EXPECT_NE(crc32c::Mask(crc), crc);
  EXPECT_NE(crc32c::Mask(crc32c::Mask(crc)), crc);
  EXPECT_EQ(crc32c::Unmask(crc32c::Mask(crc)), crc);
  EXPECT_EQ(crc32c::Unmask(crc32c::Mask(0xffffffffu)), 0xffffffffu);
}

}  // namespace
}  // namespace psrt
