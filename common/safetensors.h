// Safetensors files: named float32 tensors in the format of Hugging Face's
// `safetensors` package, so Python users load psrt's files with ordinary
// tools (safetensors.numpy.load_file).
//
// Layout: an unsigned little-endian 64-bit header length N; N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [784, 512], "data_offsets": [b, e]},
//    ..., "__metadata__": {"key": "value"}}
// padded with spaces to a multiple of 8; then the tensor bytes, where tensor
// "name" occupies [8 + N + b, 8 + N + e). Offsets are contiguous and
// non-overlapping; psrt writes the tensors in the order given.
//
// Integrity: psrt adds "psrt_crc32" to __metadata__: zlib's CRC-32 of the
// whole file after the length, header included (computed with these ten
// decimal digits set to '0'). The reader checks it when present, so a
// corrupt file, header or data, is refused rather than loaded. Files from other writers have
// no checksum and are read as they are.
#ifndef PSRT_COMMON_SAFETENSORS_H_
#define PSRT_COMMON_SAFETENSORS_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tensor.h"

namespace psrt {

// A tensor to write: a name, a shape and the caller's float32 data.
struct NamedTensor {
  NamedTensor(std::string name, const Tensor* tensor)
      : name(std::move(name)), shape(tensor->shape()), data(tensor->data()) {}
  NamedTensor(std::string name, Shape shape, const float* data)
      : name(std::move(name)), shape(std::move(shape)), data(data) {}
  std::string name;
  Shape shape;
  const float* data;
};

// Writes durably with WriteFileAtomically (common/file_util.h: a hidden
// unique temporary file, fsynced and renamed; mode 0600), so a reader never
// sees a partial file.
absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<NamedTensor>& tensors,
                              std::map<std::string, std::string> metadata = {});

struct SafetensorsFile {
  std::vector<std::pair<std::string, Tensor>> tensors;  // In data-offset order.
  std::map<std::string, std::string> metadata;
  // The file carried psrt's checksum and it matched (a file without one,
  // from another tool, reads with this false).
  bool checksum_verified = false;
};

// Errors (InvalidArgument naming the file): short file, bad header length,
// malformed JSON, unknown dtype, offsets out of range or inconsistent with
// the shape, checksum mismatch (DataLoss).
absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path);

// The same for a file's bytes already in memory (ReadSafetensors reads the
// file and calls this); `path` only names them in error messages.
absl::StatusOr<SafetensorsFile> ParseSafetensors(absl::string_view bytes,
                                                 absl::string_view path);

}  // namespace psrt

#endif  // PSRT_COMMON_SAFETENSORS_H_
