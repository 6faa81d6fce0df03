// Tensor frames: the encoding of InitRequest, PullResponse and PushRequest
// (see proto/psrt.proto) as gRPC byte buffers, without copying tensor bytes
// through protobuf.
//
// A frame is the protobuf encoding of a message with a header (field 1) and a
// tensor_data bytes field (field 2), written in that order:
//   0x0A varint(len(header)) header-bytes 0x12 varint(len(data)) data
// Encoding references the caller's tensor memory directly (no copy); decoding
// parses the small header and copies the data straight into its destination.
// Both ends therefore move tensor bytes once, into memory that is reused from
// step to step, never into a fresh per-message allocation.
#ifndef PSRT_COMMON_TENSOR_FRAME_H_
#define PSRT_COMMON_TENSOR_FRAME_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/byte_source.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace psrt {

// Builds a frame from `header` and the concatenation of `chunks`. The chunk
// memory is referenced, not copied: it must stay valid and unchanged until
// `release` runs, which happens once gRPC (and every copy of the returned
// buffer) has dropped its last reference, exactly once, on any thread. Note
// that a call can complete (deadline, cancellation) while gRPC's write path
// still holds the data. Without `release`, the caller must otherwise know
// that no reference remains.
grpc::ByteBuffer EncodeTensorFrame(
    const google::protobuf::MessageLite& header,
    const std::vector<absl::Span<const char>>& chunks,
    std::function<void()> release = nullptr);

// Reads a frame. Open() parses the header; the data is then a ByteSource.
class TensorFrameReader : public ByteSource {
 public:
  // Errors: InvalidArgument when the bytes are not a frame of this shape.
  absl::Status Open(const grpc::ByteBuffer& buffer,
                    google::protobuf::MessageLite* header);
  // ByteSource: the tensor_data bytes.
  size_t size() const override { return data_size_; }
  void ReadAt(size_t offset, absl::Span<char> dst) const override;

 private:
  // Parsing the header: a cursor over the slices.
  bool ReadByte(uint8_t* b);
  bool ReadVarint(uint64_t* v);
  // REQUIRES: n <= the bytes after the cursor.
  void CopyBytes(char* dst, size_t n);
  size_t Consumed() const;  // Bytes before the cursor.

  std::vector<grpc::Slice> slices_;
  size_t slice_ = 0;   // Cursor: current slice ...
  size_t offset_ = 0;  // ... and offset within it.
  size_t data_size_ = 0;
  // The data as pieces of slices: piece i starts at data offset
  // piece_start_[i] and at piece_ptr_[i].
  std::vector<size_t> piece_start_;
  std::vector<const char*> piece_ptr_;
};

}  // namespace psrt

#endif  // PSRT_COMMON_TENSOR_FRAME_H_
