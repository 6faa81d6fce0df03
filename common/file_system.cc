#include "common/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace psrt {
namespace {

absl::Status ErrnoError(int err, const std::string& path, const char* what) {
  return absl::Status(absl::ErrnoToStatusCode(err),
                      absl::StrCat(path, ": ", what, ": ", std::strerror(err)));
}

// A failed read of an open file: its bytes cannot be had (DataLoss, as a
// short file), whatever errno says; never a code a caller would retry or
// take for a recovery (Unavailable, Aborted).
absl::Status ReadError(int err, const std::string& path) {
  return absl::DataLossError(absl::StrCat(path, ": read error: ", std::strerror(err)));
}

// An open file descriptor, closed with its owner.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  const int fd_;
};

absl::Status ReadFully(int fd, int64_t offset, size_t n, char* out, const std::string& path) {
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd, out + done, n - done, offset + static_cast<int64_t>(done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return ReadError(errno, path);
    if (got == 0) {
      return absl::DataLossError(absl::StrCat(path, ": ", n, " bytes at byte offset ", offset,
                                              " asked for, but the file ends at byte ",
                                              offset + static_cast<int64_t>(done)));
    }
    done += static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

class PosixRandomAccessFile final : public RandomAccessFile {
 public:
  PosixRandomAccessFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  absl::Status ReadAt(int64_t offset, size_t n, char* scratch) const override {
    return ReadFully(fd_.get(), offset, n, scratch, path_);
  }

 private:
  const Fd fd_;
  const std::string path_;
};

class PosixFileSystem final : public FileSystem {
 public:
  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    const Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) return ErrnoError(errno, path, "cannot open");
    std::string bytes;
    struct stat st;
    if (::fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
      // One buffer of the file's size: no doubling, no second copy.
      bytes.resize(static_cast<size_t>(st.st_size));
      size_t done = 0;
      while (done < bytes.size()) {
        const ssize_t got = ::read(fd.get(), bytes.data() + done, bytes.size() - done);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return ReadError(errno, path);
        if (got == 0) break;  // Shrunk since fstat.
        done += static_cast<size_t>(got);
      }
      bytes.resize(done);
    }
    // The file may have grown since fstat, or have no size (a pipe).
    char buf[1 << 16];
    for (;;) {
      const ssize_t got = ::read(fd.get(), buf, sizeof(buf));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) return ReadError(errno, path);
      if (got == 0) break;
      bytes.append(buf, static_cast<size_t>(got));
    }
    return bytes;
  }

  absl::StatusOr<std::unique_ptr<RandomAccessFile>> OpenRandomAccess(
      const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoError(errno, path, "cannot open");
    return std::unique_ptr<RandomAccessFile>(std::make_unique<PosixRandomAccessFile>(fd, path));
  }

  absl::StatusOr<int64_t> FileSize(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return ErrnoError(errno, path, "cannot stat");
    return static_cast<int64_t>(st.st_size);
  }

  absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return ErrnoError(errno, dir, "cannot list");
    std::vector<std::string> names;
    errno = 0;
    while (const dirent* entry = ::readdir(d)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    const int err = errno;
    ::closedir(d);
    if (err != 0) return ErrnoError(err, dir, "cannot list");
    std::sort(names.begin(), names.end());
    return names;
  }
};

}  // namespace

FileSystem* FileSystem::Default() {
  static FileSystem* const posix = new PosixFileSystem;
  return posix;
}

}  // namespace psrt
