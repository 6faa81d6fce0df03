#include "fuzz/fuzz_util.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "glog/logging.h"

namespace psrt {
namespace fuzz {
namespace {

std::string* scratch_dir = nullptr;

void RemoveScratchDir() {
  if (scratch_dir == nullptr) return;
  ClearScratchDir();
  ::rmdir(scratch_dir->c_str());
}

}  // namespace

void InitOnce() {
  static const bool done = [] {
    FLAGS_minloglevel = google::GLOG_ERROR;
    FLAGS_logtostderr = true;
    return true;
  }();
  (void)done;
}

uint8_t InputReader::Byte() {
  return pos_ < size_ ? static_cast<uint8_t>(data_[pos_++]) : 0;
}

uint16_t InputReader::U16() {
  const uint16_t lo = Byte();
  return static_cast<uint16_t>(lo | Byte() << 8);
}

absl::string_view InputReader::Bytes(size_t n) {
  n = std::min(n, size_ - pos_);
  absl::string_view out(data_ + pos_, n);
  pos_ += n;
  return out;
}

void AppendU16(uint16_t v, std::string* out) {
  out->push_back(static_cast<char>(v & 0xff));
  out->push_back(static_cast<char>(v >> 8));
}

void AppendChunk(absl::string_view bytes, std::string* out) {
  CHECK_LE(bytes.size(), 65535u);
  AppendU16(static_cast<uint16_t>(bytes.size()), out);
  out->append(bytes.data(), bytes.size());
}

const std::string& ScratchDir() {
  if (scratch_dir == nullptr) {
    const char* base = std::getenv("TEST_TMPDIR");
    if (base == nullptr || *base == '\0') base = std::getenv("TMPDIR");
    if (base == nullptr || *base == '\0') base = "/tmp";
    std::string tmpl = std::string(base) + "/psrt_fuzz.XXXXXX";
    PCHECK(::mkdtemp(tmpl.data()) != nullptr) << "mkdtemp " << tmpl;
    scratch_dir = new std::string(tmpl);
    std::atexit(RemoveScratchDir);
  }
  return *scratch_dir;
}

void ClearScratchDir() {
  const std::string& dir = ScratchDir();
  DIR* d = ::opendir(dir.c_str());
  PCHECK(d != nullptr) << "opendir " << dir;
  while (dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) {
      continue;
    }
    ::unlink((dir + "/" + e->d_name).c_str());
  }
  ::closedir(d);
}

std::string WriteScratchFile(const std::string& name, absl::string_view bytes) {
  const std::string path = ScratchDir() + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  PCHECK(f != nullptr) << "fopen " << path;
  CHECK_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size()) << path;
  PCHECK(std::fclose(f) == 0) << "fclose " << path;
  return path;
}

}  // namespace fuzz
}  // namespace psrt
