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

// Elsewhere the compiler's _Float16 conversions (libgcc's, in software):
// slow, but the same rounding.
void EncodeFp16Portable(absl::Span<const float> from, absl::Span<uint16_t> to) {
  CHECK_EQ(from.size(), to.size());
  for (size_t i = 0; i < from.size(); ++i) {
    const _Float16 h = static_cast<_Float16>(from[i]);
    std::memcpy(&to[i], &h, sizeof(h));
  }
}

void DecodeFp16Portable(absl::Span<const uint16_t> from, absl::Span<float> to) {
  CHECK_EQ(from.size(), to.size());
  for (size_t i = 0; i < from.size(); ++i) {
    _Float16 h;
    std::memcpy(&h, &from[i], sizeof(h));
    to[i] = static_cast<float>(h);
  }
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
