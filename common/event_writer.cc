#include "common/event_writer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace psrt {
namespace {

// Tries this many names ("", ".1", ...) before giving up.
constexpr int kMaxNameAttempts = 100;

// mkdir -p.
absl::Status MakeDirs(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("empty log directory");
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    const std::string prefix = dir.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0755) == 0 || errno == EEXIST) continue;
    const int err = errno;
    return absl::Status(absl::ErrnoToStatusCode(err),
                        absl::StrCat("log directory ", dir, ": cannot create ",
                                     prefix, ": ", std::strerror(err)));
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("log directory ", dir, " is not a directory"));
  }
  return absl::OkStatus();
}

std::string Hostname() {
  char name[HOST_NAME_MAX + 1] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') {
    return "localhost";
  }
  return name;
}

double WallTimeSecs() {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return std::chrono::duration<double>(now).count();
}

}  // namespace

absl::StatusOr<std::unique_ptr<EventWriter>> EventWriter::Open(
    const std::string& logdir, const EventWriterOptions& options) {
  RETURN_IF_ERROR(MakeDirs(logdir));
  const std::string base = absl::StrFormat(
      "%s%sevents.out.tfevents.%010d.%s%s", logdir,
      logdir.back() == '/' ? "" : "/", static_cast<int64_t>(std::time(nullptr)),
      Hostname(), options.filename_suffix);
  TFRecordWriterOptions file_options;
  file_options.fail_if_exists = true;
  std::unique_ptr<TFRecordWriter> file;
  std::string path;
  for (int attempt = 0; file == nullptr; ++attempt) {
    path = attempt == 0 ? base : absl::StrCat(base, ".", attempt);
    absl::StatusOr<std::unique_ptr<TFRecordWriter>> opened =
        TFRecordWriter::Open(path, file_options);
    if (opened.ok()) {
      file = *std::move(opened);
    } else if (!absl::IsAlreadyExists(opened.status()) ||
               attempt + 1 == kMaxNameAttempts) {
      return opened.status();
    }
  }
  std::unique_ptr<EventWriter> writer(
      new EventWriter(path, std::move(file), options.flush_secs));
  tf::Event version;
  version.set_file_version(kFileVersion);
  RETURN_IF_ERROR(writer->WriteEvent(std::move(version)));
  RETURN_IF_ERROR(writer->Flush());
  return writer;
}

EventWriter::EventWriter(std::string path, std::unique_ptr<TFRecordWriter> file,
                         double flush_secs)
    : path_(std::move(path)),
      flush_secs_(flush_secs),
      file_(std::move(file)),
      last_flush_(std::chrono::steady_clock::now()) {}

EventWriter::~EventWriter() { Close().IgnoreError(); }

absl::Status EventWriter::WriteScalar(absl::string_view tag, int64_t step,
                                      float value) {
  tf::Event event;
  event.set_step(step);
  tf::Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag(std::string(tag));
  v->set_simple_value(value);
  return WriteEvent(std::move(event));
}

absl::Status EventWriter::WriteScalars(
    int64_t step, const std::vector<std::pair<std::string, float>>& values) {
  tf::Event event;
  event.set_step(step);
  for (const auto& [tag, value] : values) {
    tf::Summary::Value* v = event.mutable_summary()->add_value();
    v->set_tag(tag);
    v->set_simple_value(value);
  }
  return WriteEvent(std::move(event));
}

absl::Status EventWriter::WriteEvent(tf::Event event) {
  if (event.wall_time() == 0) event.set_wall_time(WallTimeSecs());
  absl::MutexLock lock(&mu_);
  if (!event.SerializeToString(&buffer_)) {
    return absl::InternalError(absl::StrCat(path_, ": cannot serialize event"));
  }
  RETURN_IF_ERROR(file_->Write(buffer_));
  const auto now = std::chrono::steady_clock::now();
  if (std::chrono::duration<double>(now - last_flush_).count() >= flush_secs_) {
    RETURN_IF_ERROR(file_->Flush());
    last_flush_ = now;
  }
  return absl::OkStatus();
}

absl::Status EventWriter::Flush() {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(file_->Flush());
  last_flush_ = std::chrono::steady_clock::now();
  return absl::OkStatus();
}

absl::Status EventWriter::Close() {
  absl::MutexLock lock(&mu_);
  return file_->Close();
}

}  // namespace psrt
