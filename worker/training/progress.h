// Progress: the training loop's log lines, progress bar and TensorBoard
// scalars. Every log_every_steps local steps it reports the interval's mean
// loss, examples/sec and stale pushes (`step N, loss = ...`, or one redrawn
// progress bar with ETA on the chief), and where the steps spent their time
// (`step N timing: compute_ms=C exposed_comm_ms=E wait_ms=W ...`); at the
// end, the share of the time the steps waited for input.
//
// Thread safety: not thread-safe; the trainer's thread drives it.
#ifndef PSRT_WORKER_TRAINING_PROGRESS_H_
#define PSRT_WORKER_TRAINING_PROGRESS_H_

#include <cstdint>

#include "absl/time/time.h"
#include "common/event_writer.h"
#include "proto/psrt.pb.h"

namespace psrt {

class Progress {
 public:
  struct Options {
    int batch_size = 100;
    int64_t train_steps = 0;
    int log_every_steps = 100;
    bool progress_bar = false;  // Drawn by the chief; the others stay quiet.
    bool chief = false;
    proto::TrainingConfig config;  // For the learning rate.
  };
  // Where a log interval's steps spent their time, summed over the steps.
  struct StepTime {
    absl::Duration compute;  // Forward, backward and regularization.
    absl::Duration push;
    absl::Duration pull;    // Includes `waited`.
    absl::Duration waited;  // Pulls waiting on the shards for their version.
    absl::Duration input;   // NextBatch: waiting for (or copying) a batch.
  };

  explicit Progress(const Options& options) : options_(options) {}

  // Training starts (or resumes) at global step `step`; scalars go to
  // `events` (null: none; REQUIRES: it outlives this).
  void Start(int64_t step, EventWriter* events);
  // The first log interval starts (after the data is positioned).
  void StartInterval() { interval_start_ = absl::Now(); }
  // The interval's time so far, for the loop to add to.
  StepTime& time() { return time_; }
  void AddInputTime(absl::Duration took);
  // A step's push went through with this loss.
  void StepPushed(float loss);
  // The step is complete at global step `step`, the loop's `local_steps`th;
  // reports the interval when one is over.
  void StepDone(int64_t local_steps, int64_t step, int64_t stale);
  // Ends the progress bar's line.
  void EndBar();
  // Logs the share of the time since Start the steps waited for input.
  void LogInputWait();

 private:
  void Report(int64_t step, double loss, double examples_per_sec, int64_t stale);
  // Per step: exposed communication is push + pull - waited, the time the
  // worker spends on the wire rather than computing or waiting for others.
  void ReportTiming(int64_t step, int64_t steps);

  const Options options_;
  EventWriter* events_ = nullptr;
  absl::Time start_time_;
  int64_t start_step_ = 0;
  absl::Time interval_start_;
  int64_t interval_steps_ = 0;
  double interval_loss_ = 0;
  StepTime time_;
  absl::Duration total_input_;
};

}  // namespace psrt

#endif  // PSRT_WORKER_TRAINING_PROGRESS_H_
