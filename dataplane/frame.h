// Data-plane frames: how tensor bytes travel between workers and parameter
// servers beside gRPC, over connections of our own (frame_connection.h).
//
// A frame is a fixed 48-byte header, then `meta_size` bytes of metadata (a
// small serialized protobuf: a PushHeader, a PullRequest, ...; or an error's
// text), then `data_size` bytes of tensor data, which the receiver reads
// straight into their destination. All integers are little-endian:
//
//   offset  size  field
//        0     4  magic "PSDP"
//        4     1  version (kFrameVersion)
//        5     1  kind (FrameKind)
//        6     2  method (FrameMethod)
//        8     4  stripe: the shard of the ps process the frame is for
//       12     4  meta_size
//       16     8  request_id: a reply names its request's
//       24     8  data_size
//       32     4  status: an absl::StatusCode, 0 but in an error reply
//       36     8  reserved, zero
//       44     4  CRC-32C of bytes 0..43
//
// The checksum guards the header only (TCP guards the bytes; a header read
// out of step with the stream is what it catches). DecodeFrameHeader refuses
// anything else, naming the field: a frame parser faces bytes from whoever
// can connect, before the connection is authenticated.
//
// Thread safety: pure functions.
#ifndef PSRT_DATAPLANE_FRAME_H_
#define PSRT_DATAPLANE_FRAME_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace psrt {
namespace dataplane {

constexpr size_t kFrameHeaderBytes = 48;
constexpr uint8_t kFrameVersion = 1;
// Metadata is a small header; tensor bytes go in the data.
constexpr uint32_t kMaxMetaBytes = 1 << 20;

enum class FrameKind : uint8_t {
  kHello = 1,       // Client -> server, first on a connection: the credentials.
  kHelloReply = 2,  // Server -> client: accepted (status 0) or why not.
  kRequest = 3,
  kReply = 4,  // status 0: meta and data are the answer; else meta is
               // the error's text.
};

enum class FrameMethod : uint16_t {
  kNone = 0,  // Hello frames.
  kPush = 1,
  kPull = 2,
  kRingSegment = 3,  // A segment of a ring collective, worker to worker.
};

struct FrameHeader {
  FrameKind kind = FrameKind::kRequest;
  FrameMethod method = FrameMethod::kNone;
  uint32_t stripe = 0;
  uint32_t meta_size = 0;
  uint64_t request_id = 0;
  uint64_t data_size = 0;
  uint32_t status = 0;  // absl::StatusCode.
};

void EncodeFrameHeader(const FrameHeader& header, char (&out)[kFrameHeaderBytes]);

// Parses a header, refusing (DataLoss, naming the field) a wrong magic,
// version, kind, method or checksum, metadata over kMaxMetaBytes, data over
// `max_data_bytes`, or a status that is no absl::StatusCode.
absl::Status DecodeFrameHeader(absl::Span<const char> bytes, uint64_t max_data_bytes,
                               FrameHeader* header);

}  // namespace dataplane
}  // namespace psrt

#endif  // PSRT_DATAPLANE_FRAME_H_
