#include "common/wire_dtype.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace psrt {
namespace {

uint32_t Bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
}

float FromBits(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

uint16_t Encode(float x) {
  uint16_t out;
  EncodeBf16({&x, 1}, {&out, 1});
  return out;
}

TEST(WireDtypeTest, EncodeRoundsToNearestEven) {
  EXPECT_EQ(Encode(1.0f), 0x3f80);
  EXPECT_EQ(Encode(-2.0f), 0xc000);
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: to the even one, 1.
  EXPECT_EQ(Encode(FromBits(0x3f808000u)), 0x3f80);
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up.
  EXPECT_EQ(Encode(FromBits(0x3f818000u)), 0x3f82);
  // Just above halfway rounds up, just below rounds down.
  EXPECT_EQ(Encode(FromBits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(Encode(FromBits(0x3f807fffu)), 0x3f80);
  // Subnormals and zero keep their bits' top half.
  EXPECT_EQ(Encode(0.0f), 0x0000);
  EXPECT_EQ(Encode(-0.0f), 0x8000);
  EXPECT_EQ(Encode(FromBits(0x00010000u)), 0x0001);
}

TEST(WireDtypeTest, NonFiniteStaysNonFiniteAndOverflowBecomesInf) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(Encode(inf), 0x7f80);
  EXPECT_EQ(Encode(-inf), 0xff80);
  // A NaN whose payload sits in the low half must not round into Inf.
  const uint16_t nan = Encode(FromBits(0x7f800001u));
  EXPECT_EQ(nan & 0x7f80, 0x7f80);
  EXPECT_NE(nan & 0x007f, 0);
  EXPECT_TRUE(std::isnan(FromBits(uint32_t{nan} << 16)));
  // The largest float is beyond bfloat16's range: Inf, which the ps refuses.
  EXPECT_EQ(Encode(std::numeric_limits<float>::max()), 0x7f80);
}

TEST(WireDtypeTest, DecodeIsExactAndRoundTripsWithinHalfAnUlp) {
  std::vector<float> values;
  for (int i = -2000; i <= 2000; ++i) values.push_back(i * 0.37f - 1e-3f * i * i);
  std::vector<uint16_t> wire(values.size());
  std::vector<float> back(values.size());
  EncodeBf16(values, absl::MakeSpan(wire));
  DecodeBf16(wire, absl::MakeSpan(back));
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(Bits(back[i]), uint32_t{wire[i]} << 16);
    // 8 significant bits: at most half an ulp, 2^-8 of the value.
    EXPECT_LE(std::fabs(back[i] - values[i]), std::fabs(values[i]) * (1.0f / 256)) << i;
  }
}

TEST(WireDtypeTest, Fp16RoundsToNearestEvenAndOverflowsToInf) {
  auto encode = [](float x) {
    uint16_t out;
    EncodeFp16({&x, 1}, {&out, 1});
    return out;
  };
  EXPECT_EQ(encode(1.0f), 0x3c00);
  EXPECT_EQ(encode(-2.0f), 0xc000);
  EXPECT_EQ(encode(65504.0f), 0x7bff);  // The largest half.
  EXPECT_EQ(encode(1e6f), 0x7c00);      // Beyond it: Inf, which a ps refuses.
  EXPECT_EQ(encode(std::numeric_limits<float>::infinity()), 0x7c00);
  // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: to the even one, 1.
  EXPECT_EQ(encode(1.0f + 1.0f / 2048), 0x3c00);
  EXPECT_EQ(encode(1.0f + 3.0f / 2048), 0x3c02);
  const uint16_t nan = encode(std::nanf(""));
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
  std::vector<float> values;
  for (int i = -2000; i <= 2000; ++i) values.push_back(i * 0.37f - 1e-3f * i * i);
  std::vector<uint16_t> wire(values.size());
  std::vector<float> back(values.size());
  EncodeFp16(values, absl::MakeSpan(wire));
  DecodeFp16(wire, absl::MakeSpan(back));
  for (size_t i = 0; i < values.size(); ++i) {
    // 11 significant bits: at most half an ulp, 2^-11 of the value.
    EXPECT_LE(std::fabs(back[i] - values[i]), std::fabs(values[i]) * (1.0f / 2048)) << i;
  }
}

// The software float16 path (machines without F16C, and any compiler) gives
// the same bits as the F16C one, over every half, across float's range, and
// densely where rounding meets subnormals, the exponent carry and Inf.
TEST(WireDtypeTest, PortableFp16MatchesTheF16cPath) {
  std::vector<uint16_t> halves(1 << 16);
  for (size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<uint16_t>(i);
  std::vector<float> fast(halves.size()), portable(halves.size());
  DecodeFp16(halves, absl::MakeSpan(fast));
  DecodeFp16Portable(halves, absl::MakeSpan(portable));
  for (size_t i = 0; i < halves.size(); ++i) {
    if (std::isnan(fast[i])) {
      EXPECT_TRUE(std::isnan(portable[i])) << i;
    } else {
      EXPECT_EQ(Bits(fast[i]), Bits(portable[i])) << i;
    }
  }
  std::vector<float> values;
  for (uint32_t bits = 0; bits < 0xff800000u; bits += 0x1357u) values.push_back(FromBits(bits));
  // Every 13th float from 2^-26 (below half's smallest subnormal) to 2^-13, every
  // 3rd from 1 to 4, and every one from 65504 up to Inf, with both signs.
  for (uint32_t bits = 0x32800000u; bits <= 0x39000000u; bits += 13) values.push_back(FromBits(bits));
  for (uint32_t bits = 0x3f800000u; bits <= 0x40800000u; bits += 3) values.push_back(FromBits(bits));
  for (uint32_t bits = 0x477fe000u; bits <= 0x7f800000u; bits += 0x101u) values.push_back(FromBits(bits));
  const size_t positive = values.size();
  for (size_t i = 0; i < positive; ++i) values.push_back(-values[i]);
  values.push_back(FromBits(0x7f800000u));  // Inf.
  values.push_back(FromBits(0x7fc00000u));  // Quiet NaNs, with payloads.
  values.push_back(FromBits(0xffd5a000u));
  values.push_back(FromBits(0x7f812345u));  // Signalling.
  std::vector<uint16_t> a(values.size()), b(values.size());
  EncodeFp16(values, absl::MakeSpan(a));
  EncodeFp16Portable(values, absl::MakeSpan(b));
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(a[i], b[i]) << values[i] << " (bits " << std::hex << Bits(values[i]) << ")";
  }
}

TEST(WireDtypeTest, WireAsFloatSourceDecodesAnyWholeFloatRange) {
  // More elements than the decoder's staging buffer holds at once.
  const size_t n = 40000;
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = static_cast<float>(i % 256) - 128.0f;
  for (proto::DataType dtype : {proto::DT_BFLOAT16, proto::DT_HALF}) {
    std::vector<uint16_t> wire(n);
    EncodeWire(dtype, values, absl::MakeSpan(wire));
    SpanByteSource bytes(absl::Span<const char>(reinterpret_cast<const char*>(wire.data()),
                                                n * sizeof(uint16_t)));
    WireAsFloatSource floats(bytes, dtype);
    ASSERT_EQ(floats.size(), n * sizeof(float));
    std::vector<float> out(n - 7);
    floats.ReadAt(7 * sizeof(float),
                  {reinterpret_cast<char*>(out.data()), out.size() * sizeof(float)});
    // Small integers are exact in both formats.
    for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], values[i + 7]) << i;
  }
}

TEST(WireDtypeTest, ParsesTheFlag) {
  EXPECT_EQ(*ParseWireDtype("fp32"), proto::DT_FLOAT);
  EXPECT_EQ(*ParseWireDtype("bfloat16"), proto::DT_BFLOAT16);
  EXPECT_EQ(*ParseWireDtype("bf16"), proto::DT_BFLOAT16);
  EXPECT_EQ(*ParseWireDtype("fp16"), proto::DT_HALF);
  EXPECT_EQ(WireDtypeName(proto::DT_HALF), "fp16");
  EXPECT_EQ(WireBytesPerElement(proto::DT_HALF), 2u);
  absl::StatusOr<proto::DataType> bad = ParseWireDtype("fp8");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--wire_dtype: \"fp8\""), std::string::npos);
  EXPECT_EQ(WireBytesPerElement(proto::DT_BFLOAT16), 2u);
  EXPECT_EQ(WireBytesPerElement(proto::DT_FLOAT), 4u);
}

}  // namespace
}  // namespace psrt
