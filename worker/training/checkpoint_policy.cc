#include "worker/training/checkpoint_policy.h"

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace psrt {

CheckpointPolicy::CheckpointPolicy(const Options& options, ParameterStore* store)
    : options_(options), store_(store), last_save_time_(absl::Now()) {}

void CheckpointPolicy::Start(bool enabled, int64_t newest_common, int64_t saved_step) {
  Recovered(enabled, newest_common, saved_step);
  last_save_time_ = absl::Now();
}

void CheckpointPolicy::Recovered(bool enabled, int64_t newest_common, int64_t step) {
  enabled_ = enabled;
  newest_common_ = newest_common;
  last_saved_step_ = step;
}

bool CheckpointPolicy::Due(int64_t step) const {
  return enabled_ && step > last_saved_step_ &&
         (step == 0 || (options_.save_steps > 0 && step % options_.save_steps == 0) ||
          (options_.save_secs > 0 &&
           absl::Now() - last_save_time_ >= absl::Seconds(options_.save_secs)));
}

absl::Status CheckpointPolicy::SaveEverywhere(int64_t step) {
  absl::Status status = store_->Save(step, options_.sync ? step : -1, options_.keep,
                                     newest_common_);
  if (status.ok()) {
    LOG(INFO) << "saved checkpoint " << step;
    newest_common_ = step;
    failed_saves_ = 0;
    return status;
  }
  LOG(ERROR) << "checkpoint " << step << " not saved everywhere: " << status.message()
             << "; every shard keeps "
             << (newest_common_ >= 0 ? absl::StrCat("checkpoint ", newest_common_)
                                     : std::string("what it holds"))
             << " until a save succeeds everywhere";
  // The state moved on (a backup worker's push), a shard restarted or
  // awaits confirmation: the next save may well succeed. Anything else is
  // the shard failing to write.
  const bool not_written = !absl::IsFailedPrecondition(status) && !absl::IsAborted(status) &&
                           !absl::IsUnavailable(status) && !absl::IsCancelled(status);
  if (not_written) ++failed_saves_;
  return status;
}

absl::Status CheckpointPolicy::Save(int64_t step) {
  last_save_time_ = absl::Now();  // A failed save is tried again at the next one.
  const absl::Status saved = SaveEverywhere(step);
  if (saved.ok()) last_saved_step_ = step;
  if (options_.max_failed_saves <= 0 || failed_saves_ < options_.max_failed_saves) {
    return absl::OkStatus();
  }
  return absl::DataLossError(absl::StrCat(
      failed_saves_, " checkpoints in a row could not be written (the last, checkpoint ",
      step, ": ", saved.message(), "); stopping rather than training on with ",
      newest_common_ >= 0 ? absl::StrCat("nothing newer than checkpoint ", newest_common_)
                          : std::string("no checkpoint"),
      " to recover to (--max_failed_saves=",
      options_.max_failed_saves, "; 0 trains on)"));
}

void CheckpointPolicy::SaveAtEnd(int64_t step) {
  if (enabled_ && step > last_saved_step_) SaveEverywhere(step).IgnoreError();
}

}  // namespace psrt
