#include "common/file_util.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"

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

absl::StatusOr<std::unique_ptr<AtomicFile>> AtomicFile::Create(const std::string& path) {
  const size_t slash = path.rfind('/');
  const size_t name = slash == std::string::npos ? 0 : slash + 1;
  std::string tmp = absl::StrCat(path.substr(0, name), ".", path.substr(name), ".tmp.XXXXXX");
  const int fd = ::mkostemp(tmp.data(), O_CLOEXEC);  // Mode 0600.
  if (fd < 0) return Errno("create", tmp);
  return std::unique_ptr<AtomicFile>(new AtomicFile(path, std::move(tmp), fd));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

absl::Status AtomicFile::Append(absl::string_view bytes) {
  RETURN_IF_ERROR(WriteAll(fd_, bytes, tmp_));
  size_ += bytes.size();
  return absl::OkStatus();
}

absl::Status AtomicFile::Overwrite(uint64_t offset, absl::string_view bytes) {
  CHECK_LE(offset + bytes.size(), size_);
  while (!bytes.empty()) {
    const ssize_t n = ::pwrite(fd_, bytes.data(), bytes.size(), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("write", tmp_);
    bytes.remove_prefix(n);
    offset += n;
  }
  return absl::OkStatus();
}

absl::Status AtomicFile::Commit() {
  CHECK(!committed_ && fd_ >= 0);
  absl::Status status;
  if (::fsync(fd_) != 0) status = Errno("fsync", tmp_);
  // close() reports what a write-back may have failed with (NFS, quotas).
  if (::close(fd_) != 0 && status.ok()) status = Errno("close", tmp_);
  fd_ = -1;
  RETURN_IF_ERROR(status);
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    return Errno(absl::StrCat("rename ", tmp_, " to"), path_);
  }
  committed_ = true;
  return SyncParentDirectory(path_);
}

absl::Status WriteFileAtomically(const std::string& path,
                                 const std::vector<absl::string_view>& pieces) {
  ASSIGN_OR_RETURN(std::unique_ptr<AtomicFile> file, AtomicFile::Create(path));
  for (absl::string_view piece : pieces) RETURN_IF_ERROR(file->Append(piece));
  return file->Commit();
}

}  // namespace psrt
