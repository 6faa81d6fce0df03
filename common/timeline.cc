#include "common/timeline.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace psrt {
namespace {

// A JSON string literal of `text` (the names are ours; quotes and
// backslashes escaped all the same).
std::string Quoted(absl::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}

}  // namespace

absl::StatusOr<std::unique_ptr<Timeline>> Timeline::Open(const std::string& path, int pid) {
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeline ", path, ": ", std::strerror(errno)));
  }
  std::fputs("[\n", file);
  return std::unique_ptr<Timeline>(new Timeline(file, pid));
}

Timeline::Timeline(std::FILE* file, int pid) : pid_(pid), origin_(absl::Now()), file_(file) {}

Timeline::~Timeline() { Close().IgnoreError(); }

int Timeline::LaneId(absl::string_view lane) {
  for (size_t i = 0; i < lanes_.size(); ++i) {
    if (lanes_[i] == lane) return static_cast<int>(i) + 1;
  }
  lanes_.emplace_back(lane);
  const int tid = static_cast<int>(lanes_.size());
  // Names the row.
  absl::FPrintF(file_, "%s{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, "
                       "\"args\": {\"name\": %s}}",
                first_ ? "" : ",\n", pid_, tid, Quoted(lane));
  first_ = false;
  return tid;
}

void Timeline::Record(absl::string_view name, absl::string_view lane, absl::Time start,
                      absl::Time end, int64_t step) {
  absl::MutexLock lock(&mu_);
  if (file_ == nullptr) return;
  const int tid = LaneId(lane);
  absl::FPrintF(file_,
                ",\n{\"name\": %s, \"cat\": %s, \"ph\": \"X\", \"ts\": %d, \"dur\": %d, "
                "\"pid\": %d, \"tid\": %d, \"args\": {\"step\": %d}}",
                Quoted(name), Quoted(lane), absl::ToInt64Microseconds(start - origin_),
                absl::ToInt64Microseconds(end - start), pid_, tid, step);
}

absl::Status Timeline::Close() {
  absl::MutexLock lock(&mu_);
  if (file_ == nullptr) return absl::OkStatus();
  std::fputs("\n]\n", file_);
  const bool failed = std::ferror(file_) != 0;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (failed || !closed) return absl::DataLossError("--timeline: the trace could not be written");
  return absl::OkStatus();
}

}  // namespace psrt
