#include "common/wire_dtype.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace psrt {

absl::StatusOr<proto::DataType> ParseWireDtype(absl::string_view name) {
  if (name == "fp32" || name == "float32") return proto::DT_FLOAT;
  if (name == "bf16" || name == "bfloat16") return proto::DT_BFLOAT16;
  if (name == "fp16" || name == "float16") return proto::DT_HALF;
  return absl::InvalidArgumentError(
      absl::StrCat("--wire_dtype: \"", name, "\" is not fp32, bf16 or fp16"));
}

absl::string_view WireDtypeName(proto::DataType dtype) {
  switch (dtype) {
    case proto::DT_BFLOAT16:
      return "bf16";
    case proto::DT_HALF:
      return "fp16";
    default:
      return "fp32";
  }
}

bool IsWireDtype(proto::DataType dtype) {
  return dtype == proto::DT_FLOAT || dtype == proto::DT_BFLOAT16 || dtype == proto::DT_HALF;
}

size_t WireBytesPerElement(proto::DataType dtype) {
  return dtype == proto::DT_BFLOAT16 || dtype == proto::DT_HALF ? 2 : 4;
}

// Branch-free, so that the loops vectorize (the file is built with -O3), and
// cloned for AVX-512 and AVX2 machines, chosen at load time.
#define PSRT_VECTOR_CLONES __attribute__((target_clones("arch=skylake-avx512", "avx2", "default")))

PSRT_VECTOR_CLONES void EncodeBf16(absl::Span<const float> from, absl::Span<uint16_t> to) {
  CHECK_EQ(from.size(), to.size());
  const float* in = from.data();
  uint16_t* out = to.data();
  for (size_t i = 0; i < from.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &in[i], sizeof(bits));
    const uint32_t rounded = bits + 0x7fffu + ((bits >> 16) & 1u);
    const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
    // A quiet NaN keeps its sign; rounding could carry a NaN into Inf.
    out[i] = static_cast<uint16_t>(nan ? (bits >> 16) | 0x40u : rounded >> 16);
  }
}

PSRT_VECTOR_CLONES void DecodeBf16(absl::Span<const uint16_t> from, absl::Span<float> to) {
  CHECK_EQ(from.size(), to.size());
  const uint16_t* in = from.data();
  float* out = to.data();
  for (size_t i = 0; i < from.size(); ++i) {
    const uint32_t bits = uint32_t{in[i]} << 16;
    std::memcpy(&out[i], &bits, sizeof(bits));
  }
}

namespace {

// float16 with F16C (every CPU with AVX2 has it): eight at a time, rounding
// to nearest even, NaN and Inf kept.
__attribute__((target("avx2,f16c"))) void EncodeFp16F16c(const float* in, uint16_t* out,
                                                         size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = _cvtss_sh(in[i], _MM_FROUND_TO_NEAREST_INT);
}

__attribute__((target("avx2,f16c"))) void DecodeFp16F16c(const uint16_t* in, float* out,
                                                         size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) out[i] = _cvtsh_ss(in[i]);
}

bool HasF16c() {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
}

}  // namespace

// Elsewhere, in integer arithmetic (any compiler: clang 14 has no _Float16
// on x86), bit for bit what F16C gives: round to nearest even, subnormals,
// Inf, and NaN kept NaN with its top payload bits and the quiet bit set.
namespace {

uint16_t FloatToHalf(float value) {
  uint32_t x;
  std::memcpy(&x, &value, sizeof(x));
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) {  // NaN.
    return sign | 0x7e00u | static_cast<uint16_t>((x >> 13) & 0x3ffu);
  }
  if (x >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520: Inf (or Inf).
  if (x < 0x38800000u) {
    // Below 2^-14, a subnormal half or zero: adding 0.5 lines the half's
    // last bit up with the float's, and the float adder rounds to nearest
    // even, which is the half's rounding.
    float sum;
    std::memcpy(&sum, &x, sizeof(sum));
    sum += 0.5f;
    uint32_t bits;
    std::memcpy(&bits, &sum, sizeof(bits));
    return sign | static_cast<uint16_t>(bits - 0x3f000000u);
  }
  // Normal: rebias the exponent, and round the 13 bits dropped to nearest
  // even (a carry into the exponent is the right result, up to Inf).
  const uint32_t odd = (x >> 13) & 1u;
  x += 0xc8000fffu + odd;  // (15 - 127) << 23, plus the rounding.
  return sign | static_cast<uint16_t>(x >> 13);
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {  // Inf, or NaN made quiet.
    bits = sign | 0x7f800000u | (mantissa << 13) | (mantissa != 0 ? 0x400000u : 0);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else {
    // Zero or subnormal, mantissa * 2^-24: exact in a float.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    std::memcpy(&bits, &magnitude, sizeof(bits));
    bits |= sign;
  }
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

}  // namespace

void EncodeFp16Portable(absl::Span<const float> from, absl::Span<uint16_t> to) {
  CHECK_EQ(from.size(), to.size());
  for (size_t i = 0; i < from.size(); ++i) to[i] = FloatToHalf(from[i]);
}

void DecodeFp16Portable(absl::Span<const uint16_t> from, absl::Span<float> to) {
  CHECK_EQ(from.size(), to.size());
  for (size_t i = 0; i < from.size(); ++i) to[i] = HalfToFloat(from[i]);
}

void EncodeFp16(absl::Span<const float> from, absl::Span<uint16_t> to) {
  CHECK_EQ(from.size(), to.size());
  if (!HasF16c()) return EncodeFp16Portable(from, to);
  EncodeFp16F16c(from.data(), to.data(), from.size());
}

void DecodeFp16(absl::Span<const uint16_t> from, absl::Span<float> to) {
  CHECK_EQ(from.size(), to.size());
  if (!HasF16c()) return DecodeFp16Portable(from, to);
  DecodeFp16F16c(from.data(), to.data(), from.size());
}

void EncodeWire(proto::DataType dtype, absl::Span<const float> from, absl::Span<uint16_t> to) {
  CHECK(dtype == proto::DT_BFLOAT16 || dtype == proto::DT_HALF) << dtype;
  dtype == proto::DT_HALF ? EncodeFp16(from, to) : EncodeBf16(from, to);
}

void DecodeWire(proto::DataType dtype, absl::Span<const uint16_t> from, absl::Span<float> to) {
  CHECK(dtype == proto::DT_BFLOAT16 || dtype == proto::DT_HALF) << dtype;
  dtype == proto::DT_HALF ? DecodeFp16(from, to) : DecodeBf16(from, to);
}

WireAsFloatSource::WireAsFloatSource(const ByteSource& wire, proto::DataType dtype)
    : wire_(wire), dtype_(dtype) {
  CHECK(dtype == proto::DT_BFLOAT16 || dtype == proto::DT_HALF) << dtype;
}

void WireAsFloatSource::ReadAt(size_t offset, absl::Span<char> dst) const {
  CHECK_EQ(offset % sizeof(float), 0u);
  CHECK_EQ(dst.size() % sizeof(float), 0u);
  // Decoded through a small per-thread buffer: no allocation per read. On
  // the heap, not in static TLS (which every thread's stack must hold).
  constexpr size_t kStaging = 16 << 10;  // Elements.
  thread_local std::vector<uint16_t> buffer(kStaging);
  uint16_t* staging = buffer.data();
  const size_t first = offset / sizeof(float);
  const size_t n = dst.size() / sizeof(float);
  float* out = reinterpret_cast<float*>(dst.data());
  for (size_t done = 0; done < n;) {
    const size_t count = std::min(kStaging, n - done);
    wire_.ReadAt((first + done) * sizeof(uint16_t),
                 {reinterpret_cast<char*>(staging), count * sizeof(uint16_t)});
    DecodeWire(dtype_, {staging, count}, {out + done, count});
    done += count;
  }
}

}  // namespace psrt
