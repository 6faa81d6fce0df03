#include "common/wire_dtype.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace psrt {

absl::StatusOr<proto::DataType> ParseWireDtype(absl::string_view name) {
  if (name == "fp32" || name == "float32") return proto::DT_FLOAT;
  if (name == "bf16" || name == "bfloat16") return proto::DT_BFLOAT16;
  return absl::InvalidArgumentError(
      absl::StrCat("--wire_dtype: \"", name, "\" is not fp32 or bf16"));
}

absl::string_view WireDtypeName(proto::DataType dtype) {
  return dtype == proto::DT_BFLOAT16 ? "bf16" : "fp32";
}

size_t WireBytesPerElement(proto::DataType dtype) {
  return dtype == proto::DT_BFLOAT16 ? 2 : 4;
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

void Bf16AsFloatSource::ReadAt(size_t offset, absl::Span<char> dst) const {
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
    bf16_.ReadAt((first + done) * sizeof(uint16_t),
                 {reinterpret_cast<char*>(staging), count * sizeof(uint16_t)});
    DecodeBf16({staging, count}, {out + done, count});
    done += count;
  }
}

}  // namespace psrt
