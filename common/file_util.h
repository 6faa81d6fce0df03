// Durable file writes: write to a temporary name, fsync, rename over the real
// name, fsync the directory. A reader (or a restart after a crash) sees the
// old file or the new one, never a part of either.
#ifndef PSRT_COMMON_FILE_UTIL_H_
#define PSRT_COMMON_FILE_UTIL_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace psrt {

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
