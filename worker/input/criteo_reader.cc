#include "worker/input/criteo_reader.h"

#include <zlib.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace psrt {
namespace {

constexpr int kFields = 1 + kCriteoDenseFields + kCriteoCategoricalFields;

// An integer count, or false; empty is handled by the caller.
bool ParseCount(absl::string_view s, int64_t* value) {
  size_t i = 0;
  bool negative = false;
  if (s[0] == '-' || s[0] == '+') {
    negative = s[0] == '-';
    i = 1;
  }
  if (i == s.size() || s.size() - i > 18) return false;
  int64_t v = 0;
  for (; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + (s[i] - '0');
  }
  *value = negative ? -v : v;
  return true;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

absl::Status ParseCriteoLine(absl::string_view line, float* dense, uint64_t* ids,
                             int32_t* label) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (line.empty()) {
    return absl::InvalidArgumentError("an empty line (want label, I1..I13, C1..C26)");
  }
  int field = 0;
  size_t start = 0;
  while (true) {
    const size_t tab = line.find('\t', start);
    const absl::string_view value =
        line.substr(start, tab == absl::string_view::npos ? absl::string_view::npos : tab - start);
    if (field >= kFields) {
      return absl::InvalidArgumentError(
          absl::StrCat("more than ", kFields, " tab-separated fields"));
    }
    if (field == 0) {
      if (value != "0" && value != "1") {
        return absl::InvalidArgumentError(
            absl::StrCat("the label is \"", value, "\", not 0 or 1"));
      }
      *label = value[0] - '0';
    } else if (field <= kCriteoDenseFields) {
      int64_t count = 0;
      if (!value.empty() && !ParseCount(value, &count)) {
        return absl::InvalidArgumentError(
            absl::StrCat("I", field, " is \"", value, "\", not an integer"));
      }
      dense[field - 1] = count > 0 ? std::log1p(static_cast<float>(count)) : 0.0f;
    } else {
      const int c = field - 1 - kCriteoDenseFields;
      uint64_t v = kCriteoMissing;
      if (!value.empty()) {
        if (value.size() != 8) {
          return absl::InvalidArgumentError(
              absl::StrCat("C", c + 1, " is \"", value, "\", not 8 hex digits"));
        }
        v = 0;
        for (char ch : value) {
          const int d = HexDigit(ch);
          if (d < 0) {
            return absl::InvalidArgumentError(
                absl::StrCat("C", c + 1, " is \"", value, "\", not 8 hex digits"));
          }
          v = v << 4 | static_cast<uint64_t>(d);
        }
      }
      ids[c] = CriteoId(c, v);
    }
    ++field;
    if (tab == absl::string_view::npos) break;
    start = tab + 1;
  }
  if (field != kFields) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " tab-separated fields, not ", kFields,
                     " (label, I1..I13, C1..C26)"));
  }
  return absl::OkStatus();
}

// zlib reads gzip and plain files alike.
struct CriteoReader::File {
  gzFile gz = nullptr;
  std::string buffer;
  size_t pos = 0;
  bool eof = false;
  ~File() {
    if (gz != nullptr) gzclose(gz);
  }
};

CriteoReader::CriteoReader(Options options) : options_(std::move(options)) {}
CriteoReader::~CriteoReader() = default;

absl::StatusOr<std::unique_ptr<CriteoReader>> CriteoReader::Open(Options options) {
  if (options.num_shards < 1 || options.shard < 0 || options.shard >= options.num_shards) {
    return absl::InvalidArgumentError(absl::StrCat("Criteo shard ", options.shard, " of ",
                                                   options.num_shards, " does not exist"));
  }
  if (options.files.empty()) return absl::InvalidArgumentError("no Criteo files to read");
  std::unique_ptr<CriteoReader> reader(new CriteoReader(std::move(options)));
  RETURN_IF_ERROR(reader->Rewind());
  return reader;
}

absl::Status CriteoReader::OpenFile(size_t index) {
  file_ = std::make_unique<File>();
  file_index_ = index;
  line_in_file_ = 0;
  const std::string& path = options_.files[index];
  file_->gz = gzopen(path.c_str(), "rb");
  if (file_->gz == nullptr) {
    file_.reset();  // Read then returns the end, not a read of nothing.
    return absl::NotFoundError(absl::StrCat("cannot open Criteo file ", path, ": ",
                                            std::strerror(errno)));
  }
  gzbuffer(file_->gz, 256 << 10);
  return absl::OkStatus();
}

absl::Status CriteoReader::Rewind() {
  line_index_ = 0;
  return OpenFile(0);
}

absl::StatusOr<bool> CriteoReader::NextLine() {
  while (file_ != nullptr) {
    File& f = *file_;
    const size_t newline = f.buffer.find('\n', f.pos);
    if (newline != std::string::npos || (f.eof && f.pos < f.buffer.size())) {
      const size_t end = newline == std::string::npos ? f.buffer.size() : newline;
      const bool mine = line_index_ % options_.num_shards == options_.shard;
      ++line_index_;
      ++line_in_file_;
      if (mine) line_.assign(f.buffer, f.pos, end - f.pos);
      f.pos = end + 1;
      if (mine) return true;
      continue;
    }
    if (f.eof) {  // This file is done: the next one, or the end.
      if (file_index_ + 1 == options_.files.size()) {
        file_.reset();
        return false;
      }
      RETURN_IF_ERROR(OpenFile(file_index_ + 1));
      continue;
    }
    f.buffer.erase(0, f.pos);
    f.pos = 0;
    const size_t kept = f.buffer.size();
    f.buffer.resize(kept + (1 << 16));
    const int n = gzread(f.gz, f.buffer.data() + kept, 1 << 16);
    int errnum = Z_OK;
    const char* message = gzerror(f.gz, &errnum);
    // A gzip stream cut short reads as an end with Z_BUF_ERROR.
    if (n < 0 || (n == 0 && errnum == Z_BUF_ERROR)) {
      return absl::DataLossError(absl::StrCat("Criteo file ", options_.files[file_index_],
                                              " after line ", line_in_file_, ": ",
                                              n == 0 ? "truncated (the gzip stream ends early)"
                                                     : message));
    }
    f.buffer.resize(kept + n);
    if (n == 0) f.eof = true;
  }
  return false;
}

namespace {

constexpr int64_t kMalformedLogged = 10;

bool IsPowerOfTen(int64_t n) {
  while (n >= 10 && n % 10 == 0) n /= 10;
  return n == 1;
}

}  // namespace

absl::Status CriteoReader::Read(int batch_size, CtrBatch* batch) {
  batch->dense.resize(static_cast<size_t>(batch_size) * kCriteoDenseFields);
  batch->ids.resize(static_cast<size_t>(batch_size) * kCriteoCategoricalFields);
  batch->labels.resize(batch_size);
  int n = 0;
  while (n < batch_size) {
    ASSIGN_OR_RETURN(const bool more, NextLine());
    if (!more) break;
    const absl::Status parsed =
        ParseCriteoLine(line_, batch->dense.data() + static_cast<size_t>(n) * kCriteoDenseFields,
                        batch->ids.data() + static_cast<size_t>(n) * kCriteoCategoricalFields,
                        &batch->labels[n]);
    if (parsed.ok()) {
      ++n;
    } else if (options_.skip_malformed) {
      // The first ones each (the next epochs meet them again, unlogged),
      // then every power of ten.
      if (++malformed_ <= kMalformedLogged) {
        LOG(WARNING) << "skipping " << options_.files[file_index_] << ":" << line_in_file_
                     << ": " << parsed.message();
      } else if (IsPowerOfTen(malformed_)) {
        LOG(WARNING) << "skipped " << malformed_ << " malformed Criteo lines so far";
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat(options_.files[file_index_], ":",
                                                     line_in_file_, ": ", parsed.message()));
    }
  }
  batch->dense.resize(static_cast<size_t>(n) * kCriteoDenseFields);
  batch->ids.resize(static_cast<size_t>(n) * kCriteoCategoricalFields);
  batch->labels.resize(n);
  return absl::OkStatus();
}

}  // namespace psrt
