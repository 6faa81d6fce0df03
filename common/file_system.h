// FileSystem: the file reads of psrt behind one small interface (after
// LevelDB's Env): whole files, reads at an offset, file sizes and directory
// listings. Readers take a FileSystem* (FileSystem::Default(), the POSIX
// one, unless told otherwise), so each file operation is written once, with
// errors that name the file and the system's reason, and tests can put a
// file system of their own in its place (one that fails, say).
// Durable writes are common/file_util.h's.
//
// Thread safety: implementations are thread-safe; Default() may be called
// from any thread.
#ifndef PSRT_COMMON_FILE_SYSTEM_H_
#define PSRT_COMMON_FILE_SYSTEM_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace psrt {

// An open file read at offsets. Thread-safe.
class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  // Exactly `n` bytes at `offset` into `scratch`. DataLoss when the file
  // ends first or cannot be read ("<path>: read error: <reason>").
  virtual absl::Status ReadAt(int64_t offset, size_t n, char* scratch) const = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // The process's POSIX file system.
  static FileSystem* Default();

  // Errors say "<path>: cannot open: <reason>" (NotFound for a missing
  // file, PermissionDenied, ...) or "<path>: read error: <reason>"
  // (DataLoss).
  virtual absl::StatusOr<std::string> ReadFile(const std::string& path) = 0;
  virtual absl::StatusOr<std::unique_ptr<RandomAccessFile>> OpenRandomAccess(
      const std::string& path) = 0;
  virtual absl::StatusOr<int64_t> FileSize(const std::string& path) = 0;
  // The names (not paths) of the entries of `dir`, "." and ".." left out,
  // sorted.
  virtual absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& dir) = 0;
};

}  // namespace psrt

#endif  // PSRT_COMMON_FILE_SYSTEM_H_
