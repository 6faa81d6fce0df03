// Helpers shared by the fuzz targets (fuzz/*_fuzzer.cc).
//
// Each target defines LLVMFuzzerTestOneInput and is built two ways
// (fuzz/CMakeLists.txt): with clang's libFuzzer (-DPSRT_FUZZ=ON,
// scripts/fuzz.sh), or with fuzz/standalone_main.cc as a plain executable
// that replays the seed corpus plus deterministic mutations (ctest).
//
// Thread safety: none; a fuzz target runs one input at a time.
#ifndef PSRT_FUZZ_FUZZ_UTIL_H_
#define PSRT_FUZZ_FUZZ_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace psrt {
namespace fuzz {

// Once per process: quiets logging (errors only), so that the fuzzers'
// output is the fuzzer's.
void InitOnce();

// Reads a fuzz input as a little structured stream. Reads past the end
// yield zeros / fewer bytes, never fail: every input is a valid stream.
class InputReader {
 public:
  InputReader(const uint8_t* data, size_t size)
      : data_(reinterpret_cast<const char*>(data)), size_(size) {}
  bool empty() const { return pos_ == size_; }
  uint8_t Byte();
  uint16_t U16();  // Little-endian.
  // Up to n bytes.
  absl::string_view Bytes(size_t n);
  // Everything left.
  absl::string_view Rest() { return Bytes(size_ - pos_); }

 private:
  const char* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Appends the encodings InputReader reads back (for the corpus generator).
void AppendU16(uint16_t v, std::string* out);
// U16 length, then the bytes. REQUIRES: bytes.size() <= 65535.
void AppendChunk(absl::string_view bytes, std::string* out);

// A private directory for the files a target writes, created on first use
// under $TEST_TMPDIR (or $TMPDIR, or /tmp) and removed at exit.
const std::string& ScratchDir();
// Removes every file in ScratchDir() (not recursive: targets write no
// subdirectories).
void ClearScratchDir();
// Writes `bytes` to ScratchDir()/name and returns the path. Aborts on I/O
// errors (they are the machine's fault, not the input's).
std::string WriteScratchFile(const std::string& name, absl::string_view bytes);

}  // namespace fuzz
}  // namespace psrt

#endif  // PSRT_FUZZ_FUZZ_UTIL_H_
