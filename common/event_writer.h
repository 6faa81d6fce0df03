// TensorBoard event files: scalar summaries (loss, accuracy, examples/sec)
// that `tensorboard --logdir=DIR` plots.
//
// An event file is named events.out.tfevents.<secs>.<hostname><suffix>
// (secs: the Unix time of Open, ten digits) inside the log directory, and is
// a TFRecord file (common/tfrecord.h) of psrt.tf.Event messages
// (proto/event.proto, TensorFlow's field numbers). The first event holds
// file_version "brain.Event:2"; every later one holds wall_time, step and a
// Summary of {tag, simple_value} values, e.g.
//   wall_time: 1700000003.1 step: 100
//     summary { value { tag: "loss" simple_value: 0.6931 } }
//
// Usage (the chief):
//   ASSIGN_OR_RETURN(auto events, EventWriter::Open(logdir));
//   RETURN_IF_ERROR(events->WriteScalar("loss", step, loss));
//   ...
//   RETURN_IF_ERROR(events->Close());   // or let the destructor close it
#ifndef PSRT_COMMON_EVENT_WRITER_H_
#define PSRT_COMMON_EVENT_WRITER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/tfrecord.h"
#include "proto/event.pb.h"

namespace psrt {

struct EventWriterOptions {
  // Appended to the file name, e.g. ".worker0" when several processes write
  // into one log directory.
  std::string filename_suffix;
  // A write also flushes when at least this many seconds passed since the
  // last flush (0: every write flushes). Close() and Flush() always flush.
  double flush_secs = 10;
};

// EventWriter: appends events to one new event file.
//
// Thread safety: thread-safe; events from concurrent calls are written
// whole, in the order the calls take the writer's lock. The writer owns its
// file; the destructor flushes and closes it (errors there are lost, so call
// Close() to see them).
class EventWriter {
 public:
  static constexpr char kFileVersion[] = "brain.Event:2";

  // Creates `logdir` (and its parents) when missing and a new event file in
  // it, and writes the file_version event. Never overwrites a file: when the
  // name is taken (two writers in the same second), ".1", ".2", ... is
  // appended.
  static absl::StatusOr<std::unique_ptr<EventWriter>> Open(
      const std::string& logdir, const EventWriterOptions& options = {});
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // One event at the current time: `step` and the scalar `tag` = `value`.
  absl::Status WriteScalar(absl::string_view tag, int64_t step, float value);
  // One event holding several scalars of the same step.
  absl::Status WriteScalars(
      int64_t step, const std::vector<std::pair<std::string, float>>& values);
  // Any event, as given (wall_time 0 is replaced by the current time).
  absl::Status WriteEvent(tf::Event event);

  absl::Status Flush();
  // Idempotent; later writes fail with FailedPrecondition.
  absl::Status Close();

  // The event file's full path.
  const std::string& path() const { return path_; }

 private:
  EventWriter(std::string path, std::unique_ptr<TFRecordWriter> file,
              double flush_secs);

  const std::string path_;
  const double flush_secs_;
  absl::Mutex mu_;
  std::unique_ptr<TFRecordWriter> file_ ABSL_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point last_flush_ ABSL_GUARDED_BY(mu_);
  std::string buffer_ ABSL_GUARDED_BY(mu_);  // Serialized event, reused.
};

}  // namespace psrt

#endif  // PSRT_COMMON_EVENT_WRITER_H_
