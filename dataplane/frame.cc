#include "dataplane/frame.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"

namespace psrt {
namespace dataplane {
namespace {

constexpr char kMagic[4] = {'P', 'S', 'D', 'P'};
constexpr size_t kChecksumOffset = 44;

template <typename T>
void Put(char* out, size_t offset, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) {
    out[offset + i] = static_cast<char>(static_cast<uint64_t>(value) >> (8 * i));
  }
}

template <typename T>
T Get(const char* in, size_t offset) {
  uint64_t value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    value |= static_cast<uint64_t>(static_cast<uint8_t>(in[offset + i])) << (8 * i);
  }
  return static_cast<T>(value);
}

absl::Status Refused(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("data-plane frame: ", what));
}

}  // namespace

void EncodeFrameHeader(const FrameHeader& header, char (&out)[kFrameHeaderBytes]) {
  std::memset(out, 0, kFrameHeaderBytes);
  std::memcpy(out, kMagic, sizeof(kMagic));
  Put<uint8_t>(out, 4, kFrameVersion);
  Put<uint8_t>(out, 5, static_cast<uint8_t>(header.kind));
  Put<uint16_t>(out, 6, static_cast<uint16_t>(header.method));
  Put<uint32_t>(out, 8, header.stripe);
  Put<uint32_t>(out, 12, header.meta_size);
  Put<uint64_t>(out, 16, header.request_id);
  Put<uint64_t>(out, 24, header.data_size);
  Put<uint32_t>(out, 32, header.status);
  Put<uint32_t>(out, kChecksumOffset, crc32c::Value(out, kChecksumOffset));
}

absl::Status DecodeFrameHeader(absl::Span<const char> bytes, uint64_t max_data_bytes,
                               FrameHeader* header) {
  if (bytes.size() != kFrameHeaderBytes) {
    return Refused(absl::StrCat("a header is ", kFrameHeaderBytes, " bytes, got ", bytes.size()));
  }
  const char* in = bytes.data();
  if (std::memcmp(in, kMagic, sizeof(kMagic)) != 0) {
    return Refused("no PSDP magic (not a psrt data-plane peer, or a stream out of step)");
  }
  if (Get<uint32_t>(in, kChecksumOffset) != crc32c::Value(in, kChecksumOffset)) {
    return Refused("header checksum mismatch");
  }
  const uint8_t version = Get<uint8_t>(in, 4);
  if (version != kFrameVersion) {
    return Refused(absl::StrCat("version ", version, ", this build speaks ", kFrameVersion,
                                " (give every task the same psrt build)"));
  }
  const uint8_t kind = Get<uint8_t>(in, 5);
  if (kind < static_cast<uint8_t>(FrameKind::kHello) ||
      kind > static_cast<uint8_t>(FrameKind::kReply)) {
    return Refused(absl::StrCat("unknown kind ", kind));
  }
  const uint16_t method = Get<uint16_t>(in, 6);
  if (method > static_cast<uint16_t>(FrameMethod::kRingSegment)) {
    return Refused(absl::StrCat("unknown method ", method));
  }
  const uint32_t meta_size = Get<uint32_t>(in, 12);
  if (meta_size > kMaxMetaBytes) {
    return Refused(absl::StrCat("metadata of ", meta_size, " bytes, more than ", kMaxMetaBytes));
  }
  const uint64_t data_size = Get<uint64_t>(in, 24);
  if (data_size > max_data_bytes) {
    return Refused(
        absl::StrCat("data of ", data_size, " bytes, more than the limit of ", max_data_bytes));
  }
  const uint32_t status = Get<uint32_t>(in, 32);
  if (status > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
    return Refused(absl::StrCat("status ", status, " is no status code"));
  }
  if (Get<uint64_t>(in, 36) != 0) return Refused("reserved bytes are not zero");
  header->kind = static_cast<FrameKind>(kind);
  header->method = static_cast<FrameMethod>(method);
  header->stripe = Get<uint32_t>(in, 8);
  header->meta_size = meta_size;
  header->request_id = Get<uint64_t>(in, 16);
  header->data_size = data_size;
  header->status = status;
  return absl::OkStatus();
}

}  // namespace dataplane
}  // namespace psrt
