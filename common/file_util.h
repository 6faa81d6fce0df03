// Durable file writes: write to a temporary name, fsync, rename over the real
// name, fsync the directory. A reader (or a restart after a crash) sees the
// old file or the new one, never a part of either.
#ifndef PSRT_COMMON_FILE_UTIL_H_
#define PSRT_COMMON_FILE_UTIL_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace psrt {

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

// Makes a rename in the directory holding `path` durable.
absl::Status SyncParentDirectory(const std::string& path);

}  // namespace psrt

#endif  // PSRT_COMMON_FILE_UTIL_H_
