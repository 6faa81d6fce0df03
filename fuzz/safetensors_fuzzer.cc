// Fuzzes the safetensors reader (common/safetensors.h) with the input as a
// file's bytes. A file that parses must survive a round trip through the
// writer: same tensors (names, shapes, bits) and metadata.
#include <cstring>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "fuzz/fuzz_util.h"
#include "glog/logging.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  psrt::fuzz::InitOnce();
  absl::StatusOr<psrt::SafetensorsFile> file = psrt::ParseSafetensors(
      {reinterpret_cast<const char*>(data), size}, "fuzz");
  if (!file.ok()) return 0;

  const std::vector<psrt::NamedTensor> tensors = psrt::NamedTensorsOf(*file);
  const std::string path = psrt::fuzz::ScratchDir() + "/round_trip.safetensors";
  const absl::Status written = psrt::WriteSafetensors(path, tensors, file->metadata);
  CHECK(written.ok()) << written;
  absl::StatusOr<psrt::SafetensorsFile> again = psrt::ReadSafetensors(path);
  CHECK(again.ok()) << "a file psrt wrote does not read back: " << again.status();
  CHECK(again->metadata == file->metadata);
  CHECK_EQ(again->tensors.size(), file->tensors.size());
  for (size_t i = 0; i < file->tensors.size(); ++i) {
    const auto& [name, tensor] = file->tensors[i];
    const auto& [name2, tensor2] = again->tensors[i];
    CHECK_EQ(name, name2);
    CHECK(tensor.shape() == tensor2.shape()) << name;
    CHECK(tensor.num_bytes() == 0 ||
          std::memcmp(tensor.data(), tensor2.data(), tensor.num_bytes()) == 0)
        << name;
  }
  CHECK_EQ(again->integers.size(), file->integers.size());
  for (size_t i = 0; i < file->integers.size(); ++i) {
    const auto& [name, integer] = file->integers[i];
    const auto& [name2, integer2] = again->integers[i];
    CHECK_EQ(name, name2);
    CHECK(integer.dtype == integer2.dtype) << name;
    CHECK(integer.shape == integer2.shape) << name;
    CHECK(integer.values == integer2.values) << name;
  }
  return 0;
}
