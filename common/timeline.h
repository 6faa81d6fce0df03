// Timeline: a trace of what a process did when, as Horovod's --timeline
// writes it: Chrome's trace event format (a JSON array of complete events),
// which chrome://tracing and https://ui.perfetto.dev open.
//
//   [
//   {"name": "compute", "cat": "step", "ph": "X", "ts": 1031, "dur": 48210,
//    "pid": 0, "tid": 1, "args": {"step": 12}},
//   ...
//   ]
//
// ts and dur are microseconds since the timeline was opened; pid is the
// worker's rank, tid a lane ("step", "allreduce") so that phases show on
// their own rows. Events are written as they end and the array is closed by
// Close (or the destructor); a file cut short by a crash still loads in
// Perfetto, which accepts an unterminated array.
//
// Thread safety: Record and Span may be called from any thread.
#ifndef PSRT_COMMON_TIMELINE_H_
#define PSRT_COMMON_TIMELINE_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace psrt {

class Timeline {
 public:
  // Creates (truncates) `path`. `pid` labels every event (the rank).
  static absl::StatusOr<std::unique_ptr<Timeline>> Open(const std::string& path, int pid);
  ~Timeline();  // Closes.
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // One complete event on lane `lane`, from `start` to `end`, with an
  // integer argument `step`.
  void Record(absl::string_view name, absl::string_view lane, absl::Time start,
              absl::Time end, int64_t step);
  // Ends the array and closes the file; later events are dropped. Errors:
  // the file could not be written.
  absl::Status Close();

  // Records [construction, destruction) of a scope; `timeline` may be null
  // (then it does nothing).
  class Span {
   public:
    Span(Timeline* timeline, absl::string_view name, absl::string_view lane, int64_t step)
        : timeline_(timeline), name_(name), lane_(lane), step_(step),
          start_(timeline != nullptr ? absl::Now() : absl::InfinitePast()) {}
    ~Span() {
      if (timeline_ != nullptr) timeline_->Record(name_, lane_, start_, absl::Now(), step_);
    }
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;

   private:
    Timeline* const timeline_;
    const absl::string_view name_, lane_;
    const int64_t step_;
    const absl::Time start_;
  };

 private:
  Timeline(std::FILE* file, int pid);
  int LaneId(absl::string_view lane) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int pid_;
  const absl::Time origin_;
  absl::Mutex mu_;
  std::FILE* file_ ABSL_GUARDED_BY(mu_);
  bool first_ ABSL_GUARDED_BY(mu_) = true;
  std::vector<std::string> lanes_ ABSL_GUARDED_BY(mu_);  // tid i + 1, in first-use order.
};

}  // namespace psrt

#endif  // PSRT_COMMON_TIMELINE_H_
