// ByteSource: a sequential reader of the tensor bytes of one message.
//
// The parameter server consumes gradients from a ByteSource in small blocks,
// so that bytes go from the network buffers into the update with no
// message-sized copy in between. The gRPC adapter reads a message's slices
// (common/tensor_frame.h); tests read a plain span.
//
// Thread safety: not thread-safe.
#ifndef PSRT_COMMON_BYTE_SOURCE_H_
#define PSRT_COMMON_BYTE_SOURCE_H_

#include <cstddef>
#include <cstring>

#include "absl/types/span.h"
#include "glog/logging.h"

namespace psrt {

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Total bytes, read or not.
  virtual size_t size() const = 0;
  // Copies the next dst.size() bytes into dst.
  // REQUIRES: no more than size() bytes are read in all.
  virtual void Read(absl::Span<char> dst) = 0;
};

// A ByteSource over memory the caller keeps alive.
class SpanByteSource : public ByteSource {
 public:
  explicit SpanByteSource(absl::Span<const char> bytes) : bytes_(bytes) {}
  size_t size() const override { return bytes_.size(); }
  void Read(absl::Span<char> dst) override {
    CHECK_LE(offset_ + dst.size(), bytes_.size());
    std::memcpy(dst.data(), bytes_.data() + offset_, dst.size());
    offset_ += dst.size();
  }

 private:
  absl::Span<const char> bytes_;
  size_t offset_ = 0;
};

}  // namespace psrt

#endif  // PSRT_COMMON_BYTE_SOURCE_H_
