// Durable file writes: write to a temporary name, fsync, rename over the real
// name, fsync the directory. A reader (or a restart after a crash) sees the
// old file or the new one, never a part of either.
#ifndef PSRT_COMMON_FILE_UTIL_H_
#define PSRT_COMMON_FILE_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace psrt {

// AtomicFile: WriteFileAtomically a piece at a time, for a file too large to
// hold in memory at once. Append writes at the end of the temporary file;
// Overwrite changes bytes appended already (a header's checksum, known only
// at the end); Commit fsyncs, closes, renames over `path` and syncs the
// directory. Destroyed without a successful Commit (an error, an abandoned
// write), it removes the temporary file: `path` keeps its old contents.
//
// Thread safety: not thread-safe.
class AtomicFile {
 public:
  // Creates the temporary file (as WriteFileAtomically names it).
  static absl::StatusOr<std::unique_ptr<AtomicFile>> Create(const std::string& path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  absl::Status Append(absl::string_view bytes);
  // REQUIRES: offset + bytes.size() <= size().
  absl::Status Overwrite(uint64_t offset, absl::string_view bytes);
  // REQUIRES: called once, after the last Append or Overwrite.
  absl::Status Commit();

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }

 private:
  AtomicFile(std::string path, std::string tmp, int fd)
      : path_(std::move(path)), tmp_(std::move(tmp)), fd_(fd) {}
  const std::string path_;
  const std::string tmp_;
  int fd_;  // -1 once closed.
  uint64_t size_ = 0;
  bool committed_ = false;
};

// Writes the concatenation of `pieces` to `path`, readable and writable by
// its owner only (0600: checkpoints hold the model). The temporary file is
// hidden and unique (".NAME.tmp.XXXXXX" beside `path`), so two processes
// writing one path never mix their bytes, and it is removed on any error.
// Errors (Internal) name the file and the failing call, close() included.
absl::Status WriteFileAtomically(const std::string& path,
                                 const std::vector<absl::string_view>& pieces);
inline absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  return WriteFileAtomically(path, std::vector<absl::string_view>{contents});
}

// Makes a rename in the directory holding `path` durable.
absl::Status SyncParentDirectory(const std::string& path);

}  // namespace psrt

#endif  // PSRT_COMMON_FILE_UTIL_H_
