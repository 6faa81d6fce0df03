// ByteSource: random access to the tensor bytes of one received message.
//
// The parameter server consumes gradients from a ByteSource in small blocks,
// on several threads at once, so that bytes go from the network buffers into
// the update with no message-sized copy in between. The gRPC adapter reads a
// message's slices (common/tensor_frame.h); tests read a plain span.
//
// Thread safety: ReadAt is const and may run concurrently.
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
  // Copies bytes [offset, offset + dst.size()) into dst.
  // REQUIRES: offset + dst.size() <= size().
  virtual void ReadAt(size_t offset, absl::Span<char> dst) const = 0;
  // Bytes [offset, offset + n) where they lie in one piece of memory that
  // stays valid while the source does; null when they do not (read them
  // with ReadAt). REQUIRES: offset + n <= size().
  virtual const char* InPlace(size_t offset, size_t n) const {
    (void)offset;
    (void)n;
    return nullptr;
  }
};

// A ByteSource over memory the caller keeps alive.
class SpanByteSource : public ByteSource {
 public:
  explicit SpanByteSource(absl::Span<const char> bytes) : bytes_(bytes) {}
  size_t size() const override { return bytes_.size(); }
  void ReadAt(size_t offset, absl::Span<char> dst) const override {
    CHECK_LE(offset + dst.size(), bytes_.size());
    std::memcpy(dst.data(), bytes_.data() + offset, dst.size());
  }
  const char* InPlace(size_t offset, size_t n) const override {
    CHECK_LE(offset + n, bytes_.size());
    return bytes_.data() + offset;
  }

 private:
  absl::Span<const char> bytes_;
};

// The first `size` bytes of another ByteSource, which must outlive it.
class PrefixByteSource : public ByteSource {
 public:
  // REQUIRES: size <= source.size().
  PrefixByteSource(const ByteSource& source, size_t size) : source_(source), size_(size) {
    CHECK_LE(size, source.size());
  }
  size_t size() const override { return size_; }
  void ReadAt(size_t offset, absl::Span<char> dst) const override {
    CHECK_LE(offset + dst.size(), size_);
    source_.ReadAt(offset, dst);
  }
  const char* InPlace(size_t offset, size_t n) const override {
    CHECK_LE(offset + n, size_);
    return source_.InPlace(offset, n);
  }

 private:
  const ByteSource& source_;
  size_t size_;
};

}  // namespace psrt

#endif  // PSRT_COMMON_BYTE_SOURCE_H_
