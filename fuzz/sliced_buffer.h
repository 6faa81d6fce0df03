// A grpc::ByteBuffer holding given bytes cut into slices of `piece` bytes
// (one slice when piece is 0; none for no bytes), the way the network may hand a message to
// the PS service; for the fuzz targets of the frame decoder.
#ifndef PSRT_FUZZ_SLICED_BUFFER_H_
#define PSRT_FUZZ_SLICED_BUFFER_H_

#include <algorithm>
#include <vector>

#include "absl/strings/string_view.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace psrt {
namespace fuzz {

inline grpc::ByteBuffer SlicedByteBuffer(absl::string_view bytes, size_t piece) {
  if (piece == 0) piece = std::max<size_t>(bytes.size(), 1);
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += piece) {
    slices.emplace_back(bytes.data() + at, std::min(piece, bytes.size() - at));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

}  // namespace fuzz
}  // namespace psrt

#endif  // PSRT_FUZZ_SLICED_BUFFER_H_
