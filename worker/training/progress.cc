#include "worker/training/progress.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/training_config.h"
#include "glog/logging.h"

namespace psrt {
namespace {

std::string FormatDuration(double secs) {
  const int64_t s = static_cast<int64_t>(secs + 0.5);
  return absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
}

}  // namespace

void Progress::Start(int64_t step, EventWriter* events) {
  start_step_ = step;
  events_ = events;
  start_time_ = absl::Now();
}

void Progress::AddInputTime(absl::Duration took) {
  time_.input += took;
  total_input_ += took;
}

void Progress::StepPushed(float loss) {
  ++interval_steps_;
  interval_loss_ += loss;
}

void Progress::StepDone(int64_t local_steps, int64_t step, int64_t stale) {
  if (local_steps % options_.log_every_steps != 0) return;
  const double secs = absl::ToDoubleSeconds(absl::Now() - interval_start_);
  if (options_.chief || !options_.progress_bar) {
    Report(step, interval_loss_ / interval_steps_,
           options_.batch_size * interval_steps_ / secs, stale);
    ReportTiming(step, interval_steps_);
  }
  interval_start_ = absl::Now();
  interval_steps_ = 0;
  interval_loss_ = 0;
  time_ = StepTime();
}

void Progress::EndBar() {
  if (options_.progress_bar && options_.chief) std::fputc('\n', stderr);
}

void Progress::LogInputWait() {
  const absl::Duration total = absl::Now() - start_time_;
  LOG(INFO) << absl::StrFormat(
      "input wait %.1f%% of step time (%.2f s of %.2f s in NextBatch)",
      100 * absl::ToDoubleSeconds(total_input_) /
          std::max(1e-9, absl::ToDoubleSeconds(total)),
      absl::ToDoubleSeconds(total_input_), absl::ToDoubleSeconds(total));
}

void Progress::ReportTiming(int64_t step, int64_t steps) {
  if (options_.progress_bar || steps <= 0) return;
  const auto per_step_ms = [steps](absl::Duration d) {
    return absl::ToDoubleMilliseconds(d) / steps;
  };
  LOG(INFO) << absl::StrFormat(
      "step %d timing: compute_ms=%.2f exposed_comm_ms=%.2f wait_ms=%.2f "
      "(per step; push_ms=%.2f pull_ms=%.2f input_ms=%.2f)",
      step, per_step_ms(time_.compute),
      per_step_ms(time_.push + time_.pull - time_.waited), per_step_ms(time_.waited),
      per_step_ms(time_.push), per_step_ms(time_.pull), per_step_ms(time_.input));
}

void Progress::Report(int64_t step, double loss, double examples_per_sec,
                     int64_t stale) {
  const double lr = LearningRateAt(options_.config, step);
  if (events_ != nullptr) {
    absl::Status s = events_->WriteScalar("loss", step, loss);
    if (s.ok()) s = events_->WriteScalar("learning_rate", step, lr);
    if (s.ok()) s = events_->WriteScalar("examples_per_sec", step, examples_per_sec);
    if (s.ok()) s = events_->WriteScalar("stale_gradients_dropped", step, stale);
    if (s.ok()) s = events_->Flush();
    if (!s.ok()) LOG(WARNING) << "summaries: " << s.message();
  }
  if (options_.progress_bar) {
    const double done = static_cast<double>(step - start_step_) /
                        std::max<int64_t>(1, options_.train_steps - start_step_);
    const double elapsed = absl::ToDoubleSeconds(absl::Now() - start_time_);
    const double eta = done > 0 ? elapsed * (1 - done) / done : 0;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(std::min(1.0, done) * kWidth);
    std::fprintf(stderr, "\r[%s%s] step %lld/%lld loss %.4f %.0f ex/s ETA %s ",
                 std::string(filled, '=').c_str(), std::string(kWidth - filled, ' ').c_str(),
                 static_cast<long long>(step), static_cast<long long>(options_.train_steps),
                 loss, examples_per_sec, FormatDuration(eta).c_str());
    std::fflush(stderr);
    return;
  }
  LOG(INFO) << absl::StrFormat("step %d, loss = %.4f (%.1f examples/sec; %.3f sec/batch)",
                               step, loss, examples_per_sec,
                               options_.batch_size / examples_per_sec)
            << (stale > 0 ? absl::StrCat(" [", stale, " stale]") : "");
}

}  // namespace psrt
