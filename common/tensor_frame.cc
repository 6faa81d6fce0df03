#include "common/tensor_frame.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>

#include "glog/logging.h"

namespace psrt {
namespace {

constexpr uint8_t kHeaderTag = (1 << 3) | 2;  // Field 1, length-delimited.
constexpr uint8_t kDataTag = (2 << 3) | 2;    // Field 2, length-delimited.

void AppendVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// Runs the release callback when gRPC drops the last data slice of a frame.
struct Releaser {
  std::atomic<int> refs{0};
  std::function<void()> release;
};

void UnrefReleaser(void* user_data) {
  auto* releaser = static_cast<Releaser*>(user_data);
  if (releaser->refs.fetch_sub(1) == 1) {
    releaser->release();
    delete releaser;
  }
}

}  // namespace

grpc::ByteBuffer EncodeTensorFrame(
    const google::protobuf::MessageLite& header,
    const std::vector<absl::Span<const char>>& chunks,
    std::function<void()> release) {
  size_t data_size = 0;
  for (const auto& chunk : chunks) data_size += chunk.size();

  std::string prefix;
  const std::string header_bytes = header.SerializeAsString();
  prefix.push_back(static_cast<char>(kHeaderTag));
  AppendVarint(header_bytes.size(), &prefix);
  prefix += header_bytes;
  prefix.push_back(static_cast<char>(kDataTag));
  AppendVarint(data_size, &prefix);

  std::vector<grpc::Slice> slices;
  slices.reserve(chunks.size() + 1);
  slices.emplace_back(prefix);  // Copied: small.
  Releaser* releaser = nullptr;
  if (release) {
    releaser = new Releaser;
    releaser->release = std::move(release);
    releaser->refs = 1;  // Held until every data slice is made.
  }
  for (const auto& chunk : chunks) {
    if (chunk.empty()) continue;
    char* data = const_cast<char*>(chunk.data());
    if (releaser != nullptr) {
      releaser->refs.fetch_add(1);
      slices.emplace_back(data, chunk.size(), UnrefReleaser, releaser);
    } else {
      slices.emplace_back(data, chunk.size(), grpc::Slice::STATIC_SLICE);
    }
  }
  if (releaser != nullptr) UnrefReleaser(releaser);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

absl::Status TensorFrameReader::Open(const grpc::ByteBuffer& buffer,
                                     google::protobuf::MessageLite* header) {
  slices_.clear();
  piece_start_.clear();
  piece_ptr_.clear();
  slice_ = offset_ = data_size_ = 0;
  if (!buffer.Dump(&slices_).ok()) {
    return absl::InvalidArgumentError("tensor frame: unreadable byte buffer");
  }
  uint8_t tag = 0;
  uint64_t header_size = 0;
  if (!ReadByte(&tag) || tag != kHeaderTag || !ReadVarint(&header_size)) {
    return absl::InvalidArgumentError(
        "tensor frame: expected the header (field 1) first");
  }
  const size_t total = buffer.Length();
  if (header_size > total - Consumed()) {
    return absl::InvalidArgumentError("tensor frame: header length past the end");
  }
  std::string header_bytes(header_size, '\0');
  CopyBytes(header_bytes.data(), header_size);
  if (!header->ParseFromString(header_bytes)) {
    return absl::InvalidArgumentError("tensor frame: malformed header");
  }
  uint64_t data_size = 0;
  if (Consumed() == total) return absl::OkStatus();  // No tensor_data field.
  if (!ReadByte(&tag) || tag != kDataTag || !ReadVarint(&data_size)) {
    return absl::InvalidArgumentError(
        "tensor frame: expected tensor_data (field 2) after the header");
  }
  if (data_size != total - Consumed()) {
    return absl::InvalidArgumentError(
        "tensor frame: tensor_data length does not match the message size");
  }
  data_size_ = data_size;
  size_t start = 0;
  for (size_t i = slice_; i < slices_.size(); ++i) {
    const size_t skip = i == slice_ ? offset_ : 0;
    if (slices_[i].size() == skip) continue;
    piece_start_.push_back(start);
    piece_ptr_.push_back(reinterpret_cast<const char*>(slices_[i].begin()) + skip);
    start += slices_[i].size() - skip;
  }
  piece_start_.push_back(start);  // Sentinel: the end.
  return absl::OkStatus();
}

void TensorFrameReader::ReadAt(size_t offset, absl::Span<char> dst) const {
  CHECK_LE(offset + dst.size(), data_size_);
  // The last piece that starts at or before `offset`.
  size_t i = std::upper_bound(piece_start_.begin(), piece_start_.end(), offset) -
             piece_start_.begin() - 1;
  char* out = dst.data();
  size_t n = dst.size();
  while (n > 0) {
    const size_t within = offset - piece_start_[i];
    const size_t take = std::min(n, piece_start_[i + 1] - offset);
    std::memcpy(out, piece_ptr_[i] + within, take);
    out += take;
    offset += take;
    n -= take;
    ++i;
  }
}

bool TensorFrameReader::ReadByte(uint8_t* b) {
  while (slice_ < slices_.size() && offset_ == slices_[slice_].size()) {
    ++slice_;
    offset_ = 0;
  }
  if (slice_ == slices_.size()) return false;
  *b = slices_[slice_].begin()[offset_++];
  return true;
}

bool TensorFrameReader::ReadVarint(uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    uint8_t b = 0;
    if (!ReadByte(&b)) return false;
    *v |= uint64_t{b & 0x7fu} << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

size_t TensorFrameReader::Consumed() const {
  size_t consumed = offset_;
  for (size_t i = 0; i < slice_; ++i) consumed += slices_[i].size();
  return consumed;
}

void TensorFrameReader::CopyBytes(char* dst, size_t n) {
  while (n > 0) {
    CHECK_LT(slice_, slices_.size());  // Callers check lengths first.
    const grpc::Slice& s = slices_[slice_];
    const size_t take = std::min(n, s.size() - offset_);
    std::memcpy(dst, s.begin() + offset_, take);
    dst += take;
    n -= take;
    offset_ += take;
    if (offset_ == s.size()) {
      ++slice_;
      offset_ = 0;
    }
  }
}

}  // namespace psrt
