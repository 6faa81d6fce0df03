// Wire data types of tensor bytes in pushes and pulls: float32 as the model
// holds it, or bfloat16 (the top 16 bits of a float32, rounded to nearest
// even), which halves the bytes moved. The ps keeps float32 values,
// optimizer state and checkpoints either way: bfloat16 exists only on the
// wire (psrt_worker --wire_dtype).
//
// Thread safety: free functions; Bf16AsFloatSource's ReadAt may run
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

// "fp32" (or "float32") and "bf16" (or "bfloat16"); InvalidArgument naming
// the flag otherwise.
absl::StatusOr<proto::DataType> ParseWireDtype(absl::string_view name);
// "fp32" or "bf16".
absl::string_view WireDtypeName(proto::DataType dtype);
// Bytes per element on the wire: 4 for DT_FLOAT, 2 for DT_BFLOAT16.
size_t WireBytesPerElement(proto::DataType dtype);

// Round to nearest even; NaN stays NaN, and a finite value beyond
// bfloat16's range becomes Inf (so a ps still refuses it as non-finite).
// REQUIRES: to.size() == from.size().
void EncodeBf16(absl::Span<const float> from, absl::Span<uint16_t> to);
void DecodeBf16(absl::Span<const uint16_t> from, absl::Span<float> to);

// The float32 bytes of a ByteSource that holds bfloat16: size() is twice the
// source's, and ReadAt decodes. REQUIRES of ReadAt: offset and dst.size()
// are multiples of 4, and dst is aligned, for whole floats.
class Bf16AsFloatSource : public ByteSource {
 public:
  // REQUIRES: `bf16` outlives this; its size is even.
  explicit Bf16AsFloatSource(const ByteSource& bf16) : bf16_(bf16) {}
  size_t size() const override { return bf16_.size() * 2; }
  void ReadAt(size_t offset, absl::Span<char> dst) const override;

 private:
  const ByteSource& bf16_;
};

}  // namespace psrt

#endif  // PSRT_COMMON_WIRE_DTYPE_H_
