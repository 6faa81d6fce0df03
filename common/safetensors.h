// Safetensors files: named tensors in the format of Hugging Face's
// `safetensors` package, so Python users load psrt's files with ordinary
// tools (safetensors.numpy.load_file). psrt reads and writes float32 ("F32")
// and 64-bit integer tensors ("I64", "U64": embedding ids), little-endian.
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

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/file_util.h"
#include "common/tensor.h"

namespace psrt {

enum class SafetensorsDtype { kF32, kI64, kU64 };

// A tensor to write: a name, a shape, a dtype and the bytes, either the
// caller's (contiguous, `data`) or made while the file is written
// (`produce`, for a tensor gathered from elsewhere without a copy of it).
struct NamedTensor {
  // Calls `emit` with the tensor's bytes, in order, in pieces of any size;
  // they must add up to the shape's.
  using Producer = std::function<void(absl::FunctionRef<void(absl::string_view)> emit)>;

  NamedTensor(std::string name, const Tensor* tensor)
      : name(std::move(name)), shape(tensor->shape()), data(tensor->data()) {}
  NamedTensor(std::string name, Shape shape, const float* data)
      : name(std::move(name)), shape(std::move(shape)), data(data) {}
  NamedTensor(std::string name, Shape shape, const int64_t* data)
      : name(std::move(name)), shape(std::move(shape)), dtype(SafetensorsDtype::kI64),
        data(data) {}
  NamedTensor(std::string name, Shape shape, const uint64_t* data)
      : name(std::move(name)), shape(std::move(shape)), dtype(SafetensorsDtype::kU64),
        data(data) {}
  NamedTensor(std::string name, Shape shape, SafetensorsDtype dtype, Producer produce)
      : name(std::move(name)), shape(std::move(shape)), dtype(dtype),
        produce(std::move(produce)) {}

  size_t num_bytes() const;

  std::string name;
  Shape shape;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  const void* data = nullptr;
  Producer produce;  // When data is null.
};

// Writes durably with WriteFileAtomically (common/file_util.h: a hidden
// unique temporary file, fsynced and renamed; mode 0600), so a reader never
// sees a partial file. The tensors are streamed: nothing of their size is
// held in memory. InvalidArgument for a name given twice; Internal naming
// the tensor when a producer's bytes do not add up to its shape's.
absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<NamedTensor>& tensors,
                              std::map<std::string, std::string> metadata = {});

// WriteSafetensors in two steps, for a caller that must hold a lock while
// the tensors are read but not while they are made durable: every byte is
// written to the returned file, which the caller then Commit()s (or drops).
absl::StatusOr<std::unique_ptr<AtomicFile>> StartSafetensors(
    const std::string& path, const std::vector<NamedTensor>& tensors,
    std::map<std::string, std::string> metadata = {});

// A 64-bit integer tensor as read: each element's 64 bits (an I64's two's
// complement), row-major.
struct IntegerTensor {
  SafetensorsDtype dtype = SafetensorsDtype::kI64;
  Shape shape;
  std::vector<uint64_t> values;
};

struct SafetensorsFile {
  // The F32 tensors, and the I64 and U64 ones, each in data-offset order.
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::vector<std::pair<std::string, IntegerTensor>> integers;
  std::map<std::string, std::string> metadata;
  // The file carried psrt's checksum and it matched (a file without one,
  // from another tool, reads with this false).
  bool checksum_verified = false;
};

// Errors (InvalidArgument naming the file): short file, bad header length,
// malformed JSON, a dtype other than F32, I64 and U64, offsets out of range
// or inconsistent with the shape, checksum mismatch (DataLoss).
absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path);

// The same for a file's bytes already in memory (ReadSafetensors reads the
// file and calls this); `path` only names them in error messages.
absl::StatusOr<SafetensorsFile> ParseSafetensors(absl::string_view bytes,
                                                 absl::string_view path);

// The file's tensors, F32 then integers, to write again (fuzzers and tests
// that rewrite a file). REQUIRES: `file` outlives the result.
std::vector<NamedTensor> NamedTensorsOf(const SafetensorsFile& file);

}  // namespace psrt

#endif  // PSRT_COMMON_SAFETENSORS_H_
