// ParameterShard's pulls: answering them, the waiting ones and their
// deadlines, cancellation, and the 16-bit wire encodings of a reply (the
// class's contract is in parameter_shard.h).
#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "absl/strings/str_join.h"
#include "common/wire_dtype.h"
#include "ps/parameter_shard.h"
#include "ps/snapshot_pool.h"

namespace psrt {

absl::StatusOr<ParameterShard::PullReply> ParameterShard::MakeReplyLocked(
    const PullOptions& options) {
  const bool moving_average = options.moving_average;
  if (moving_average && average_ == nullptr) {
    return absl::FailedPreconditionError(
        "pull: this job keeps no moving averages (set --moving_average_decay)");
  }
  PullReply reply;
  reply.header.set_version(version_);
  reply.header.set_training_done(training_done_);
  reply.header.set_incarnation(incarnation_);
  reply.snapshot = moving_average ? average_ : current_;
  if (!options.sparse_only) {
    for (const proto::VariableMeta& meta : variables_) {
      *reply.header.add_variables() = meta;
    }
    reply.num_bytes = reply.snapshot->values.num_bytes();
  }
  if (options.sparse != nullptr && !options.sparse->empty()) {
    if (tables_ == nullptr) {
      return absl::InvalidArgumentError(
          "pull: asks for embedding rows, but this shard holds no embedding tables");
    }
    auto rows = std::make_shared<std::vector<float>>();
    // A rows-only pull (an evaluation's, or a batch's after a recovery,
    // whose push makes the rows it updates) does not grow the tables.
    RETURN_IF_ERROR(tables_->Lookup(*options.sparse, &reply.header, rows.get(),
                                    /*make_missing=*/!options.sparse_only, version_));
    reply.rows = std::move(rows);
  }
  return reply;
}

void ParameterShard::TakeReadyWaiters(
    std::vector<std::pair<PullCallback, absl::StatusOr<PullReply>>>* out) {
  std::vector<Waiter> still_waiting;
  for (Waiter& w : waiters_) {
    if (ReadyLocked(w.options)) {
      absl::StatusOr<PullReply> reply = MakeReplyLocked(w.options);
      if (reply.ok()) reply->waited = true;
      out->emplace_back(std::move(w.done), std::move(reply));
    } else {
      still_waiting.push_back(std::move(w));
    }
  }
  waiters_.swap(still_waiting);
}

int64_t ParameterShard::MinClockLocked() const {
  int64_t min_clock = std::numeric_limits<int64_t>::max();
  for (size_t r = 0; r < clocks_.size(); ++r) {
    if (finished_replicas_.count(r) == 0) min_clock = std::min(min_clock, clocks_[r]);
  }
  return min_clock;
}

bool ParameterShard::ReadyLocked(const PullOptions& options) const {
  if (training_done_) return true;
  return version_ >= options.min_version &&
         (options.min_clock <= 0 || MinClockLocked() >= options.min_clock);
}

absl::Status ParameterShard::CheckPullLocked(const PullOptions& options) const {
  RETURN_IF_ERROR(CheckNotRestoringLocked("pull"));
  if (!initialized_) {
    return absl::FailedPreconditionError(
        "pull: this parameter server has not been initialized by the chief");
  }
  if (!ready_) {
    return absl::AbortedError(absl::StrCat("pull: this parameter server restored checkpoint ",
                                           restored_step_,
                                           " and waits for the chief to confirm it"));
  }
  if (options.incarnation != 0 && options.incarnation != incarnation_) {
    return absl::AbortedError(absl::StrCat("pull: expected incarnation ", options.incarnation,
                                           " of this parameter server, which is now incarnation ",
                                           incarnation_, " (it restarted or was rolled back)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ParameterShard::PullReply> ParameterShard::Read(bool moving_average) {
  absl::MutexLock lock(&mu_);
  PullOptions options;
  options.moving_average = moving_average;
  RETURN_IF_ERROR(CheckPullLocked(options));
  return MakeReplyLocked(options);
}

int64_t ParameterShard::Pull(const PullOptions& options, PullCallback done) {
  if (absl::Status admitted = AdmitAsPrimary("pull"); !admitted.ok()) {
    done(std::move(admitted));
    return 0;
  }
  if (options.wire_dtype != proto::DT_FLOAT && !options.sparse_only) {
    // Encoded wherever the reply is made, outside the lock.
    done = [encodings = encodings_, dtype = options.wire_dtype,
            moving_average = options.moving_average,
            done = std::move(done)](absl::StatusOr<PullReply> reply) {
      if (reply.ok()) encodings->Encode(dtype, moving_average, &*reply);
      done(std::move(reply));
    };
  }
  absl::StatusOr<PullReply> reply;
  {
    absl::MutexLock lock(&mu_);
    if (options.replica == 0) last_chief_contact_ = absl::Now();
    if (absl::Status refused = CheckPullLocked(options); !refused.ok()) {
      reply = std::move(refused);
    } else if (ReadyLocked(options)) {
      reply = MakeReplyLocked(options);
    } else if (static_cast<int>(waiters_.size()) >= options_.max_waiting_pulls) {
      reply =
          absl::ResourceExhaustedError(absl::StrCat("pull: ", waiters_.size(),
                                                    " pulls already wait on this parameter server "
                                                    "(psrt_ps --max_waiting_pulls)"));
    } else {
      Waiter waiter{options, std::move(done), ++last_waiter_id_};
      waiter.options.deadline = std::min(options.deadline, absl::Now() + kMaxPullWait);
      waiters_.push_back(std::move(waiter));
      changed_.SignalAll();  // The deadline thread may need to wake earlier.
      return last_waiter_id_;
    }
  }
  done(std::move(reply));
  return 0;
}

void ParameterShard::CancelPull(int64_t id) {
  PullCallback done;
  {
    absl::MutexLock lock(&mu_);
    auto it = std::find_if(waiters_.begin(), waiters_.end(),
                           [id](const Waiter& w) { return w.id == id; });
    if (it == waiters_.end()) return;
    done = std::move(it->done);
    waiters_.erase(it);
  }
  done(absl::CancelledError("pull: cancelled by the caller"));
}

void ParameterShard::DeadlineLoop() {
  mu_.Lock();
  while (!stopping_) {
    absl::Time next = absl::InfiniteFuture();
    for (const Waiter& w : waiters_) next = std::min(next, w.options.deadline);
    if (end_bound_ >= 0 && end_version_ < 0) next = std::min(next, end_bound_expiry_);
    changed_.WaitWithDeadline(&mu_, next);
    const absl::Time now = absl::Now();
    if (end_bound_ >= 0 && end_version_ < 0 && now >= end_bound_expiry_) {
      LOG(WARNING) << "an operator's end of training held this shard at version " << end_bound_
                   << " but never said at which version to end; training goes on";
      std::vector<Waiter> moved;
      const absl::Status failure = MoveHoldLocked(-1, &moved);
      std::vector<std::pair<PullCallback, absl::StatusOr<PullReply>>> ready;
      TakeReadyWaiters(&ready);
      mu_.Unlock();
      for (auto& [done, reply] : ready) done(std::move(reply));
      for (Waiter& w : moved) w.done(failure);
      mu_.Lock();
      continue;
    }
    std::vector<Waiter> expired;
    std::vector<Waiter> still_waiting;
    for (Waiter& w : waiters_) {
      (w.options.deadline <= now ? expired : still_waiting).push_back(std::move(w));
    }
    waiters_.swap(still_waiting);
    if (expired.empty()) continue;
    std::vector<int> missing;  // Replicas whose gradient never came.
    int waited_for = config_.replicas_to_aggregate();
    if (config_.max_workers() > 0) waited_for = 0;
    for (int r = 0; r < config_.num_replicas(); ++r) {
      if (!WaitsForLocked(r)) continue;
      if (config_.max_workers() > 0) ++waited_for;
      if (pushed_.count(r) == 0 && finished_replicas_.count(r) == 0) missing.push_back(r);
    }
    const std::string state =
        config_.mode() == proto::SYNC
            ? absl::StrCat("shard at version ", version_, " with gradients from ", pushed_.size(),
                           " of ", waited_for,
                           " replicas; none yet from replica(s) ", absl::StrJoin(missing, ", "))
            : absl::StrCat("shard at version ", version_, ", slowest replica at step ",
                           MinClockLocked());
    mu_.Unlock();
    for (Waiter& w : expired) {
      w.done(absl::DeadlineExceededError(absl::StrCat(
          "pull: version ", w.options.min_version, " (replicas at step ", w.options.min_clock,
          ") not reached in time (", state, "; is a worker down?)")));
    }
    mu_.Lock();
  }
  mu_.Unlock();
}

absl::StatusOr<ParameterShard::PullOptions> ParameterShard::PullOptionsFor(
    const proto::PullRequest& request, absl::Time latest) const {
  if (request.wire_dtype() != proto::DT_INVALID && !IsWireDtype(request.wire_dtype())) {
    return absl::InvalidArgumentError(absl::StrCat("pull: wire_dtype ",
                                                   proto::DataType_Name(request.wire_dtype()),
                                                   " is not DT_FLOAT, DT_BFLOAT16 or DT_HALF"));
  }
  const absl::Duration timeout = request.timeout_ms() > 0 ? absl::Milliseconds(request.timeout_ms())
                                                          : options_.default_pull_timeout;
  PullOptions options;
  options.incarnation = request.incarnation();
  options.min_version = request.min_version();
  options.min_clock = request.min_clock();
  options.moving_average = request.moving_average();
  options.replica = request.replica();
  options.wire_dtype = IsWireDtype(request.wire_dtype()) ? request.wire_dtype() : proto::DT_FLOAT;
  options.deadline = std::min(absl::Now() + timeout, latest);
  if (!request.sparse().empty()) {
    options.sparse =
        std::make_shared<const google::protobuf::RepeatedPtrField<proto::SparseIds>>(
            request.sparse());
  }
  options.sparse_only = request.sparse_only();
  if (!request.sparse().empty()) {  // Refused now, not once a waiting pull's version comes.
    absl::MutexLock lock(&mu_);
    // A shard without its state yet answers as Pull does (not initialized,
    // restoring: errors a worker retries or waits out).
    if (!initialized_ || restoring_) return options;
    if (tables_ == nullptr) {
      return absl::InvalidArgumentError(
          "pull: asks for embedding rows, but this shard holds no embedding tables");
    }
    RETURN_IF_ERROR(tables_->CheckLookup(request.sparse()));
  }
  return options;
}

}  // namespace psrt
