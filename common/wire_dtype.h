// Wire data types of tensor bytes in pushes and pulls: float32 as the model
// holds it, or a 16-bit format that halves the bytes moved:
//  - bfloat16 (the top 16 bits of a float32, rounded to nearest even):
//    float32's range, 8 significant bits;
//  - float16 (IEEE binary16): 11 significant bits, but magnitudes above
//    65504 become Inf (which a ps refuses as non-finite) and below 6e-8
//    become 0.
// The ps keeps float32 values, optimizer state and checkpoints either way:
// 16-bit formats exist only on the wire (psrt_worker --wire_dtype).
//
// Thread safety: free functions; WireAsFloatSource's ReadAt may run
// concurrently, as ByteSource's may.
#ifndef PSRT_COMMON_WIRE_DTYPE_H_
#define PSRT_COMMON_WIRE_DTYPE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/byte_source.h"
#include "proto/psrt.pb.h"

namespace psrt {

// "fp32" (or "float32"), "bf16" (or "bfloat16") and "fp16" (or "float16");
// InvalidArgument naming the flag otherwise.
absl::StatusOr<proto::DataType> ParseWireDtype(absl::string_view name);
// "fp32", "bf16" or "fp16".
absl::string_view WireDtypeName(proto::DataType dtype);
// DT_FLOAT, DT_BFLOAT16 or DT_HALF.
bool IsWireDtype(proto::DataType dtype);
// Bytes per element on the wire: 4 for DT_FLOAT, 2 for the 16-bit ones.
size_t WireBytesPerElement(proto::DataType dtype);

// Round to nearest even; NaN stays NaN, and a finite value beyond the
// format's range becomes Inf (so a ps still refuses it as non-finite).
// REQUIRES: to.size() == from.size().
void EncodeBf16(absl::Span<const float> from, absl::Span<uint16_t> to);
void DecodeBf16(absl::Span<const uint16_t> from, absl::Span<float> to);
void EncodeFp16(absl::Span<const float> from, absl::Span<uint16_t> to);
void DecodeFp16(absl::Span<const uint16_t> from, absl::Span<float> to);
// The float16 conversions of machines without F16C (software, slow),
// which EncodeFp16 and DecodeFp16 use there; exposed so that the tests
// check them against the F16C ones.
void EncodeFp16Portable(absl::Span<const float> from, absl::Span<uint16_t> to);
void DecodeFp16Portable(absl::Span<const uint16_t> from, absl::Span<float> to);
// The one of the two above for `dtype`. REQUIRES: dtype is DT_BFLOAT16 or
// DT_HALF.
void EncodeWire(proto::DataType dtype, absl::Span<const float> from, absl::Span<uint16_t> to);
void DecodeWire(proto::DataType dtype, absl::Span<const uint16_t> from, absl::Span<float> to);

// The float32 bytes of a ByteSource that holds a 16-bit wire format: size()
// is twice the source's, and ReadAt decodes. REQUIRES of ReadAt: offset and
// dst.size() are multiples of 4, and dst is aligned, for whole floats.
class WireAsFloatSource : public ByteSource {
 public:
  // REQUIRES: `wire` outlives this; its size is even; dtype is DT_BFLOAT16
  // or DT_HALF.
  WireAsFloatSource(const ByteSource& wire, proto::DataType dtype);
  size_t size() const override { return wire_.size() * 2; }
  void ReadAt(size_t offset, absl::Span<char> dst) const override;

 private:
  const ByteSource& wire_;
  const proto::DataType dtype_;
};

}  // namespace psrt

#endif  // PSRT_COMMON_WIRE_DTYPE_H_
