#include "common/file_util.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace psrt {
namespace {

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

absl::Status WriteAll(int fd, absl::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("write", path);
    bytes.remove_prefix(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SyncParentDirectory(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("open directory", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  return rc == 0 ? absl::OkStatus() : Errno("fsync directory", dir);
}

absl::Status WriteFileAtomically(const std::string& path,
                                 const std::vector<absl::string_view>& pieces) {
  const size_t slash = path.rfind('/');
  const size_t name = slash == std::string::npos ? 0 : slash + 1;
  std::string tmp = absl::StrCat(path.substr(0, name), ".", path.substr(name), ".tmp.XXXXXX");
  const int fd = ::mkostemp(tmp.data(), O_CLOEXEC);  // Mode 0600.
  if (fd < 0) return Errno("create", tmp);
  absl::Status status;
  for (absl::string_view piece : pieces) {
    status = WriteAll(fd, piece, tmp);
    if (!status.ok()) break;
  }
  if (status.ok() && ::fsync(fd) != 0) status = Errno("fsync", tmp);
  // close() reports what a write-back may have failed with (NFS, quotas).
  if (::close(fd) != 0 && status.ok()) status = Errno("close", tmp);
  if (status.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    status = Errno(absl::StrCat("rename ", tmp, " to"), path);
  }
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return status;
  }
  return SyncParentDirectory(path);
}

}  // namespace psrt
