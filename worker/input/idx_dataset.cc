#include "worker/input/idx_dataset.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <utility>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/file_system.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace psrt {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // Unsigned bytes, 3 dims.
constexpr uint32_t kLabelsMagic = 0x00000801;  // Unsigned bytes, 1 dim.
// zlib counts in uInt; feed it at most this much at a time.
constexpr size_t kZlibChunk = size_t{1} << 30;
// Deflate cannot expand data by more than about 1032:1.
constexpr size_t kMaxDeflateRatio = 1032;

absl::Status Invalid(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool HasGzipMagic(const std::string& bytes) {
  return bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
         static_cast<unsigned char>(bytes[1]) == 0x8b;
}

// Inflates a gzip file (one or more concatenated members) held in memory.
absl::StatusOr<std::string> Gunzip(const std::string& path,
                                   const std::string& in) {
  z_stream zs;
  std::memset(&zs, 0, sizeof(zs));
  if (inflateInit2(&zs, 15 + 16) != Z_OK) {  // 16: gzip wrapper only.
    return absl::InternalError(absl::StrCat(path, ": inflateInit2 failed"));
  }
  struct End {
    z_stream* zs;
    ~End() { inflateEnd(zs); }
  } end{&zs};

  // The gzip trailer holds the uncompressed size mod 2^32: a good first
  // guess, bounded so that a corrupt trailer cannot ask for gigabytes.
  std::string out;
  if (in.size() >= 18) {
    const auto* t = reinterpret_cast<const unsigned char*>(in.data()) +
                    in.size() - 4;
    const size_t isize = t[0] | t[1] << 8 | t[2] << 16 | size_t{t[3]} << 24;
    out.resize(std::min(isize, in.size() * kMaxDeflateRatio) + 1);
  }
  size_t in_pos = 0;
  size_t out_pos = 0;
  for (;;) {
    if (out_pos == out.size()) out.resize(std::max<size_t>(2 * out.size(), 1 << 16));
    const size_t in_chunk = std::min(in.size() - in_pos, kZlibChunk);
    const size_t out_chunk = std::min(out.size() - out_pos, kZlibChunk);
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data())) + in_pos;
    zs.avail_in = static_cast<uInt>(in_chunk);
    zs.next_out = reinterpret_cast<Bytef*>(out.data()) + out_pos;
    zs.avail_out = static_cast<uInt>(out_chunk);
    const int ret = inflate(&zs, Z_NO_FLUSH);
    in_pos += in_chunk - zs.avail_in;
    out_pos += out_chunk - zs.avail_out;
    if (ret == Z_STREAM_END) {
      if (in_pos == in.size()) break;
      if (HasGzipMagic(in.substr(in_pos, 2))) {  // Another member follows.
        inflateReset(&zs);
        continue;
      }
      return Invalid(path, absl::StrCat("corrupt gzip stream: ",
                                        in.size() - in_pos,
                                        " bytes of garbage after the "
                                        "compressed data"));
    }
    if (ret == Z_OK) continue;
    if (ret == Z_BUF_ERROR && zs.avail_out == 0) continue;  // Grow `out`.
    if (ret == Z_BUF_ERROR && in_pos == in.size()) {
      return Invalid(path, absl::StrCat("corrupt gzip stream: truncated after ",
                                        in.size(), " compressed bytes (",
                                        out_pos, " bytes decompressed)"));
    }
    return Invalid(path, absl::StrCat("corrupt gzip stream: ",
                                      zs.msg != nullptr ? zs.msg : "error",
                                      " (zlib code ", ret, ", at compressed "
                                      "byte ", in_pos, ")"));
  }
  out.resize(out_pos);
  return out;
}

// An IDX file's contents: dimensions and the unsigned-byte data.
struct IdxFile {
  std::string bytes;  // Whole (decompressed) file.
  std::vector<uint32_t> dims;
  size_t data_offset = 0;
  const unsigned char* data() const {
    return reinterpret_cast<const unsigned char*>(bytes.data()) + data_offset;
  }
};

uint32_t BigEndian32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return uint32_t{u[0]} << 24 | uint32_t{u[1]} << 16 | uint32_t{u[2]} << 8 |
         uint32_t{u[3]};
}

std::string ToString(absl::uint128 v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// Reads an IDX file whose magic must be `magic` (unsigned bytes; the low
// byte is the number of dimensions), gunzipping it when it starts with the
// gzip magic. `what` ("images") goes into error messages.
absl::StatusOr<IdxFile> ReadIdx(const std::string& path, uint32_t magic,
                                absl::string_view what) {
  IdxFile file;
  ASSIGN_OR_RETURN(file.bytes, FileSystem::Default()->ReadFile(path));
  if (HasGzipMagic(file.bytes)) {
    ASSIGN_OR_RETURN(file.bytes, Gunzip(path, file.bytes));
  } else if (absl::EndsWith(path, ".gz")) {
    return Invalid(path, "corrupt gzip stream: the name ends in .gz but the "
                         "file does not start with the gzip magic 1f 8b");
  }
  const std::string& b = file.bytes;
  const size_t num_dims = magic & 0xff;
  const size_t header = 4 + 4 * num_dims;
  auto short_header = [&] {
    return Invalid(path, absl::StrCat("short header: an IDX ", what,
                                      " header is ", header, " bytes, got ",
                                      b.size()));
  };
  if (b.size() < 4) return short_header();
  const uint32_t got_magic = BigEndian32(b.data());
  if (got_magic != magic) {
    return Invalid(path, absl::StrFormat(
                             "bad magic 0x%08x, expected 0x%08x (IDX %s: "
                             "unsigned bytes, %d dimensions)",
                             got_magic, magic, what, num_dims));
  }
  if (b.size() < header) return short_header();
  absl::uint128 expected = 1;
  std::vector<std::string> dim_strings;
  for (size_t i = 0; i < num_dims; ++i) {
    file.dims.push_back(BigEndian32(b.data() + 4 + 4 * i));
    expected *= file.dims.back();
    dim_strings.push_back(absl::StrCat(file.dims.back()));
  }
  file.data_offset = header;
  const size_t got = b.size() - header;
  const std::string shape = absl::StrJoin(dim_strings, " x ");
  if (expected > got) {
    return Invalid(path, absl::StrCat("truncated data: expected ", ToString(expected),
                                      " bytes (", shape, ") after the ", header,
                                      "-byte header, got ", got));
  }
  if (expected < got) {
    return Invalid(path, absl::StrCat(ToString(absl::uint128(got) - expected),
                                      " trailing bytes after the ",
                                      ToString(expected),
                                      " data bytes (", shape, ")"));
  }
  return file;
}

// "<dir>/<name>", without doubling a trailing slash.
std::string JoinPath(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  if (dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

// The first existing file among the standard spellings of "<split>-<kind>".
absl::StatusOr<std::string> FindIdxFile(const std::string& dir,
                                        const std::string& split,
                                        const std::string& kind,
                                        const std::string& idx) {
  const std::vector<std::string> names = {
      absl::StrCat(split, "-", kind, "-", idx, "-ubyte"),
      absl::StrCat(split, "-", kind, ".", idx, "-ubyte"),
      absl::StrCat(split, "-", kind, "-", idx, "-ubyte.gz"),
      absl::StrCat(split, "-", kind, ".", idx, "-ubyte.gz"),
  };
  for (const std::string& name : names) {
    const std::string path = JoinPath(dir, name);
    if (IsRegularFile(path)) return path;
  }
  return absl::NotFoundError(absl::StrCat("no ", split, " ", kind, " in ", dir,
                                          ": tried ",
                                          absl::StrJoin(names, ", ")));
}

}  // namespace

absl::StatusOr<Dataset> ReadIdxDataset(const std::string& images_path,
                                       const std::string& labels_path,
                                       int num_classes) {
  if (num_classes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_classes must be positive, got ", num_classes));
  }
  ASSIGN_OR_RETURN(IdxFile images, ReadIdx(images_path, kImagesMagic, "images"));
  ASSIGN_OR_RETURN(IdxFile labels, ReadIdx(labels_path, kLabelsMagic, "labels"));

  const uint32_t n = images.dims[0];
  const uint32_t rows = images.dims[1];
  const uint32_t cols = images.dims[2];
  if (rows == 0 || cols == 0 || rows > INT_MAX || cols > INT_MAX) {
    return Invalid(images_path,
                   absl::StrCat("bad image size ", rows, " x ", cols));
  }
  if (labels.dims[0] != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "image count ", n, " in ", images_path, " does not match label count ",
        labels.dims[0], " in ", labels_path));
  }

  Dataset data;
  data.rows = static_cast<int>(rows);
  data.cols = static_cast<int>(cols);
  data.labels.resize(n);
  const unsigned char* label_bytes = labels.data();
  for (uint32_t i = 0; i < n; ++i) {
    if (label_bytes[i] >= num_classes) {
      return Invalid(labels_path,
                     absl::StrCat("label ", int{label_bytes[i]}, " at index ", i,
                                  " is out of range for ", num_classes,
                                  " classes (must be 0..", num_classes - 1,
                                  ")"));
    }
    data.labels[i] = label_bytes[i];
  }

  const int64_t pixels = int64_t{n} * rows * cols;
  data.images.Resize({int64_t{n}, int64_t{rows} * cols});
  // A table rather than a division per pixel: GCC -O2 does not vectorize
  // the byte-to-float division, and the table is as exact.
  float scale[256];
  for (int v = 0; v < 256; ++v) scale[v] = v / 255.0f;
  const unsigned char* in = images.data();
  float* out = data.images.data();
  for (int64_t i = 0; i < pixels; ++i) out[i] = scale[in[i]];
  return data;
}

absl::StatusOr<Dataset> LoadMnistSplit(const std::string& data_dir,
                                       const std::string& split) {
  if (split != "train" && split != "t10k") {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown MNIST split \"", split, "\" (known: train, t10k)"));
  }
  if (!IsDirectory(data_dir)) {
    return absl::NotFoundError(
        absl::StrCat("data directory ", data_dir, " does not exist"));
  }
  ASSIGN_OR_RETURN(std::string images,
                   FindIdxFile(data_dir, split, "images", "idx3"));
  ASSIGN_OR_RETURN(std::string labels,
                   FindIdxFile(data_dir, split, "labels", "idx1"));
  return ReadIdxDataset(images, labels);
}

}  // namespace psrt
