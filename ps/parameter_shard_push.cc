// ParameterShard's pushes: checking them, summing sync gradients, and
// applying an update with the optimizer and the moving average (the class's
// contract is in parameter_shard.h).
#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/wire_dtype.h"
#include "glog/logging.h"
#include "kernels/elementwise.h"
#include "kernels/optimizer_functors.h"
#include "ps/parameter_shard.h"
#include "ps/snapshot_pool.h"

namespace psrt {

absl::Status ParameterShard::CheckPushLocked(const proto::PushHeader& header,
                                            size_t data_size, size_t* dense_size) const {
  RETURN_IF_ERROR(CheckNotRestoringLocked("push"));
  if (!initialized_) {
    return absl::FailedPreconditionError(
        "push: this parameter server has not been initialized by the chief");
  }
  if (!ready_) {
    return absl::AbortedError(absl::StrCat(
        "push: this parameter server restored checkpoint ", restored_step_,
        " and waits for the chief to confirm it; pull again"));
  }
  if (header.incarnation() != 0 && header.incarnation() != incarnation_) {
    return absl::AbortedError(absl::StrCat(
        "push: gradients computed against incarnation ", header.incarnation(),
        " of this parameter server, which is now incarnation ", incarnation_,
        " (it restarted or was rolled back); pull again"));
  }
  uint64_t sparse_bytes = 0;
  if (!header.sparse().empty()) {
    if (tables_ == nullptr) {
      return absl::InvalidArgumentError(
          "push: carries embedding rows, but this shard holds no embedding tables");
    }
    ASSIGN_OR_RETURN(sparse_bytes, tables_->PushBytes(header.sparse()));
    if (sparse_bytes > data_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push: tensor_data has ", data_size, " bytes, fewer than the ", sparse_bytes,
          " its embedding rows need"));
    }
  }
  *dense_size = data_size - sparse_bytes;
  RETURN_IF_ERROR(ValidateTensors(header.variables(), *dense_size, "push"));
  if (header.replica() < 0 || header.replica() >= config_.num_replicas()) {
    return absl::InvalidArgumentError(
        absl::StrCat("push: replica ", header.replica(), " is not in 0..",
                     config_.num_replicas() - 1));
  }
  if (config_.mode() == proto::SYNC && header.version() > version_) {
    return absl::AbortedError(absl::StrCat(
        "push: gradients computed from version ", header.version(),
        " but this shard is at version ", version_,
        " (it restarted or was rolled back); pull again"));
  }
  return absl::OkStatus();
}

absl::StatusOr<proto::PushResponse> ParameterShard::Push(
    const proto::PushHeader& header, ByteSource* data) {
  RETURN_IF_ERROR(AdmitAsPrimary("push"));
  std::vector<std::pair<PullCallback, absl::StatusOr<PullReply>>> ready;
  std::vector<Waiter> moved;  // This copy was replaced as the primary.
  proto::PushResponse response;
  absl::Status failure;  // Returned once the waiters have their replies.
  {
    absl::MutexLock lock(&mu_);
    response.set_incarnation(incarnation_);
    if (header.replica() == 0) last_chief_contact_ = absl::Now();
    size_t dense_size = 0;
    RETURN_IF_ERROR(CheckPushLocked(header, data->size(), &dense_size));
    // The embedding rows follow the dense gradients, which `data` now
    // stands for.
    const ByteSource& message = *data;
    PrefixByteSource dense(message, dense_size);
    data = &dense;
    const bool sparse = !header.sparse().empty();
    const int replica = header.replica();
    auto& last_push = last_push_[replica];
    const bool retry = header.worker_incarnation() != 0 &&
                       header.worker_incarnation() == last_push.worker_incarnation &&
                       header.step() <= last_push.step;
    const bool takes_gradient =
        !retry && !training_done_ &&
        (config_.mode() == proto::ASYNC ||
         (header.version() == version_ && pushed_.count(replica) == 0 &&
          WaitsForLocked(replica)));
    // From here on the gradients are float32, whatever the wire carried. A
    // 16-bit push is decoded block by block as it is read, in cache, by the
    // checks and again by the update: decoding it once into a stripe-sized
    // buffer instead measured 0.88x as fast (a memory round trip costs more
    // than a shift). A push that is not taken is not read at all.
    std::optional<WireAsFloatSource> decoded;
    if (takes_gradient && !header.variables().empty() &&
        header.variables(0).dtype() != proto::DT_FLOAT) {
      data = &decoded.emplace(*data, header.variables(0).dtype());
    }
    // Sync checks each gradient here and the update of their mean below.
    // Async checks the update this gradient makes, which is non-finite
    // whenever the gradient is (every rule adds it into a value or a slot):
    // one pass, and a second only to name the fault.
    const bool async = config_.mode() == proto::ASYNC;
    const int64_t unstable = takes_gradient && async ? FirstNonFiniteUpdate(*data) : -1;
    const int64_t nonfinite =
        takes_gradient && (!async || unstable >= 0) ? FirstNonFinite(*data) : -1;
    // Sync with --sparse_async: the rows are taken on arrival, as async
    // takes them, also from a push whose dense gradients come too late.
    // (A resend of the version's accepted push, without an incarnation to
    // know it by, is not taken either.)
    const bool rows_on_arrival = sparse && !async && config_.sparse_async();
    const bool resent = header.version() == version_ && pushed_.count(replica) > 0;
    const bool takes_rows =
        sparse && (rows_on_arrival
                       ? !retry && !training_done_ && !resent && WaitsForLocked(replica)
                       : takes_gradient);
    std::string nonfinite_table;  // Of the embedding rows.
    if (takes_rows) {
      RETURN_IF_ERROR(tables_->Check(header.sparse(), message, dense_size, &nonfinite_table));
    }
    if (!nonfinite_table.empty() && !options_.skip_nonfinite_gradients) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push: the gradient rows of embedding table \"", nonfinite_table, "\" from replica ",
          replica, " hold NaN or Inf; nothing was applied"));
    }
    if (nonfinite >= 0 && !options_.skip_nonfinite_gradients) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push: the gradient of \"", VariableAt(nonfinite).name(), "\" from replica ",
          replica, " holds NaN or Inf; nothing was applied"));
    }
    if (unstable >= 0 && !options_.skip_nonfinite_gradients) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push: the gradient of \"", VariableAt(unstable).name(), "\" from replica ",
          replica, " would make its values or optimizer state NaN or Inf (it is too "
          "large for the optimizer); nothing was applied"));
    }
    bool rows_taken = false;  // On arrival: a retry of this push must not take them again.
    if (rows_on_arrival && takes_rows && nonfinite < 0 && nonfinite_table.empty()) {
      const absl::Status applied = tables_->Apply(version_, header.sparse(), message, dense_size);
      if (!applied.ok() && !options_.skip_nonfinite_gradients) {
        return absl::InvalidArgumentError(
            absl::StrCat("push from replica ", replica, ": ", applied.message()));
      }
      if (!applied.ok()) ++nonfinite_dropped_;
      rows_taken = applied.ok();
    }
    response.set_training_done(training_done_);
    if (retry) {
      // Taken already; not applied twice. The same answer as the first time
      // (a stale push under --sparse_async had its rows taken, not its
      // gradients).
      response.set_accepted(last_push.accepted);
    } else if (training_done_) {
      response.set_accepted(false);
    } else if (nonfinite >= 0 || unstable >= 0 || !nonfinite_table.empty()) {
      ++nonfinite_dropped_;
      response.set_accepted(false);
    } else if (config_.mode() == proto::ASYNC) {
      // The rows first: a table whose update would overflow leaves the dense
      // variables as they were (the tables before it stay updated:
      // ps/shard_tables.h), and the push is refused or, as an unstable
      // dense update is, dropped and counted.
      const absl::Status applied =
          sparse ? tables_->Apply(version_, header.sparse(), message, dense_size)
                 : absl::OkStatus();
      if (!applied.ok() && !options_.skip_nonfinite_gradients) {
        return absl::InvalidArgumentError(
            absl::StrCat("push from replica ", replica, ": ", applied.message()));
      }
      if (!applied.ok()) {
        ++nonfinite_dropped_;
        response.set_accepted(false);
      } else {
        BeginUpdate();
        if (options_.peer == nullptr) {
          ForEachBlock(*data, [&](int64_t begin, absl::Span<const float> grad) {
            UpdateRange(begin, grad);
          });
        } else {
          UpdateFromCopy(*data);  // The backup applies the same float32 gradient.
        }
        ++version_;
        ++pushes_applied_;
        ++clocks_[replica];
        response.set_accepted(true);
        if (options_.peer != nullptr) {
          proto::ReplicateHeader replicated;
          replicated.set_version(version_ - 1);
          replicated.set_replica(replica);
          replicated.set_worker_incarnation(header.worker_incarnation());
          replicated.set_step(header.step());
          replicated.set_accepted(true);
          failure = ReplicateLocked(
              std::move(replicated),
              {replica_update_.data(), static_cast<size_t>(total_elements_)}, &moved);
        }
      }
    } else if (header.version() < version_) {
      ++stale_dropped_;
      response.set_accepted(false);
    } else if (pushed_.count(replica) > 0) {
      response.set_accepted(true);  // A retry of an accepted push.
    } else if (!WaitsForLocked(replica)) {
      // Elastic: not a member at this version (not admitted yet, or gone).
      ++stale_dropped_;
      response.set_accepted(false);
    } else {
      float* sum = sum_.data();
      if (pushed_.empty()) {
        ParallelFor([&](int64_t begin, int64_t end) {
          data->ReadAt(begin * sizeof(float),
                       {reinterpret_cast<char*>(sum + begin), (end - begin) * sizeof(float)});
        });
      } else {
        ForEachBlock(*data, [&](int64_t begin, absl::Span<const float> grad) {
          kernels::Accumulate(grad, {sum + begin, grad.size()});
        });
      }
      // Each id's rows summed over the version's pushes; with R = 1 the one
      // push is the mean, applied straight from the message below.
      const bool direct_rows = sparse && !rows_on_arrival && !SumsRowsLocked();
      if (sparse && !rows_on_arrival && !direct_rows) {
        tables_->Accumulate(header.sparse(), message, dense_size);
      }
      pushed_.insert(replica);
      ++pushes_applied_;
      response.set_accepted(true);
      last_push = {header.worker_incarnation(), header.step(), true};
      if (VersionCompleteLocked() && !HeldLocked()) {
        const DirectRows rows = {&header.sparse(), &message, dense_size};
        failure = CompleteVersionLocked(direct_rows ? &rows : nullptr, &moved);
        EndIfReachedLocked();
      }
    }
    if ((response.accepted() || rows_taken) && !retry) {
      last_push = {header.worker_incarnation(), header.step(), response.accepted()};
    }
    response.set_version(version_);
    response.set_training_done(training_done_);  // This push may have ended it (EndAt).
    TakeReadyWaiters(&ready);
  }
  for (auto& [done, reply] : ready) done(std::move(reply));
  for (Waiter& w : moved) w.done(failure);
  if (!failure.ok()) return failure;
  return response;
}

bool ParameterShard::WaitsForLocked(int replica) const {
  if (config_.max_workers() <= 0) return true;
  return replica >= 0 && replica < static_cast<int>(member_from_.size()) &&
         member_from_[replica] >= 0 && member_from_[replica] <= version_;
}

bool ParameterShard::SumsRowsLocked() const {
  // A push held by an operator's end completes its version later, without
  // its message.
  return config_.max_workers() > 0 || config_.replicas_to_aggregate() > 1 || end_bound_ >= 0;
}

bool ParameterShard::VersionCompleteLocked() const {
  if (pushed_.empty()) return false;
  if (config_.max_workers() <= 0) {
    return static_cast<int>(pushed_.size()) == config_.replicas_to_aggregate();
  }
  for (int r = 0; r < static_cast<int>(member_from_.size()); ++r) {
    if (WaitsForLocked(r) && pushed_.count(r) == 0) return false;
  }
  return true;
}

absl::Status ParameterShard::CompleteVersionLocked(const DirectRows* rows,
                                                   std::vector<Waiter>* moved) {
  float* sum = sum_.data();
  const int count = static_cast<int>(pushed_.size());
  if (count > 1) {
    ParallelFor([&](int64_t begin, int64_t end) {
      kernels::Scale(1.0f / count, {sum + begin, static_cast<size_t>(end - begin)});
    });
  }
  // Finite gradients can still sum past float's range, or drive the
  // optimizer's state to Inf: then nothing of this version is applied, and
  // the push that completed it fails, so that its worker stops loudly; the
  // version still advances, so that no replica waits for it.
  const SpanByteSource mean(absl::Span<const char>(reinterpret_cast<const char*>(sum),
                                                   total_elements_ * sizeof(float)));
  const int64_t overflow = FirstNonFiniteUpdate(mean);
  absl::Status failure;
  // The rows' mean first: a table that refuses its update skips the
  // version's dense update too (the tables before it stay updated:
  // ps/shard_tables.h).
  absl::Status rows_applied;
  if (tables_ != nullptr && overflow < 0) {
    rows_applied = SumsRowsLocked() ? tables_->ApplySums(version_, 1.0f / count)
                   : rows != nullptr
                       ? tables_->Apply(version_, *rows->sparse, *rows->message, rows->dense_size)
                       : absl::OkStatus();
  } else if (tables_ != nullptr) {
    tables_->ClearSums();
  }
  if (!rows_applied.ok()) {
    ++nonfinite_dropped_;
    failure = absl::InvalidArgumentError(
        absl::StrCat("push: the mean gradient rows of version ", version_, ": ",
                     rows_applied.message(), "; the version was skipped"));
    LOG(ERROR) << failure.message();
  } else if (overflow < 0) {
    BeginUpdate();
    ParallelFor([&](int64_t begin, int64_t end) {
      UpdateRange(begin, {sum + begin, static_cast<size_t>(end - begin)});
    });
  } else {
    ++nonfinite_dropped_;
    failure = absl::InvalidArgumentError(absl::StrCat(
        "push: the mean gradient of version ", version_, " for \"",
        VariableAt(overflow).name(), "\" overflows or would make its values or "
        "optimizer state NaN or Inf; the version was skipped, nothing applied"));
    LOG(ERROR) << failure.message();
  }
  proto::ReplicateHeader replicated;  // The version's update, for the backup.
  if (options_.peer != nullptr) {
    replicated.set_version(version_);
    replicated.set_skipped(!failure.ok());
    for (int r : pushed_) {
      replicated.add_pushed(r);
      replicated.add_pushed_worker_incarnations(last_push_[r].worker_incarnation);
      replicated.add_pushed_steps(last_push_[r].step);
    }
  }
  ++version_;
  pushed_.clear();
  if (options_.peer != nullptr) {
    const absl::Status kept = ReplicateLocked(
        std::move(replicated),
        failure.ok() ? absl::Span<const float>(sum, total_elements_) : absl::Span<const float>(),
        moved);
    if (!kept.ok()) failure = kept;
  }
  return failure;
}

absl::StatusOr<proto::PushResponse> ParameterShard::ApplyGradient(
    absl::Span<const float> gradient) {
  std::vector<std::pair<PullCallback, absl::StatusOr<PullReply>>> ready;
  proto::PushResponse response;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CheckNotRestoringLocked("apply"));
    if (!initialized_) {
      return absl::FailedPreconditionError("apply: the local model is not initialized");
    }
    if (!ready_) {
      return absl::AbortedError(absl::StrCat("apply: the local model restored checkpoint ",
                                             restored_step_,
                                             " and waits for the chief to confirm it"));
    }
    CHECK_EQ(static_cast<int64_t>(gradient.size()), total_elements_);
    response.set_incarnation(incarnation_);
    response.set_training_done(training_done_);
    if (!training_done_) {
      const SpanByteSource bytes(absl::Span<const char>(
          reinterpret_cast<const char*>(gradient.data()), gradient.size() * sizeof(float)));
      // Non-finite whenever the gradient is: one pass checks both.
      const int64_t unstable = FirstNonFiniteUpdate(bytes);
      if (unstable >= 0) {
        ++nonfinite_dropped_;
        return absl::InvalidArgumentError(absl::StrCat(
            "apply: the mean gradient of version ", version_, " for \"",
            VariableAt(unstable).name(), "\" holds NaN or Inf, or would make its values or "
            "optimizer state NaN or Inf; nothing was applied"));
      }
      BeginUpdate();
      ParallelFor([&](int64_t begin, int64_t end) {
        UpdateRange(begin, gradient.subspan(begin, end - begin));
      });
      ++version_;
      ++pushes_applied_;
      response.set_accepted(true);
    }
    response.set_version(version_);
    TakeReadyWaiters(&ready);
  }
  for (auto& [done, reply] : ready) done(std::move(reply));
  return response;
}

void ParameterShard::MakeWritable(std::shared_ptr<Snapshot>* buffer) {
  // New references are taken only under mu_ (held here), so a count of 1
  // means no pull still reads the buffer. The fence orders our writes after
  // the last reader's release of its reference (use_count is a relaxed load).
  if (buffer->use_count() == 1) {
    std::atomic_thread_fence(std::memory_order_acquire);
    return;
  }
  std::shared_ptr<Snapshot> fresh = pool_->New(total_elements_);
  const float* from = (*buffer)->values.data();
  float* to = fresh->values.data();
  ParallelFor([&](int64_t begin, int64_t end) {
    std::memcpy(to + begin, from + begin, (end - begin) * sizeof(float));
  });
  *buffer = std::move(fresh);
}

void ParameterShard::UpdateFromCopy(const ByteSource& data) {
  if (replica_update_.num_elements() != total_elements_) replica_update_.Resize({total_elements_});
  float* update = replica_update_.data();
  ParallelFor([&](int64_t begin, int64_t end) {
    data.ReadAt(begin * sizeof(float),
                {reinterpret_cast<char*>(update + begin), (end - begin) * sizeof(float)});
    UpdateRange(begin, {update + begin, static_cast<size_t>(end - begin)});
  });
}

void ParameterShard::BeginUpdate() {
  MakeWritable(&current_);
  optimizer_->BeginStep(version_);
  if (average_ != nullptr) {
    MakeWritable(&average_);
    // TensorFlow's ExponentialMovingAverage with num_updates = the new step.
    const double t = static_cast<double>(version_) + 1;
    average_decay_ = std::min<double>(config_.moving_average_decay(), (1 + t) / (10 + t));
  }
}

void ParameterShard::UpdateRange(int64_t begin, absl::Span<const float> grad) {
  const int64_t end = begin + static_cast<int64_t>(grad.size());
  // Alternates optimizer pieces and moving-statistic pieces of [begin, end).
  auto update = [&](int64_t from, int64_t to, bool statistic) {
    if (from >= to) return;
    const absl::Span<const float> piece = grad.subspan(from - begin, to - from);
    float* values = current_->values.data() + from;
    float* average = average_ != nullptr ? average_->values.data() + from : nullptr;
    if (statistic) {  // Its new value (the replicas' mean in sync mode).
      std::memcpy(values, piece.data(), piece.size() * sizeof(float));
      if (average != nullptr) std::memcpy(average, values, piece.size() * sizeof(float));
      return;
    }
    optimizer_->Apply(from, piece, {values, piece.size()});
    if (average != nullptr) {
      kernels::ForEachIndex(0, piece.size(),
                            kernels::functor::MovingAverageUpdate{average_decay_, values, average});
    }
  };
  int64_t at = begin;
  for (const auto& [first, last] : statistics_) {
    if (last <= at) continue;
    if (first >= end) break;
    const int64_t from = std::max(first, at);
    const int64_t to = std::min(last, end);
    update(at, from, /*statistic=*/false);
    update(from, to, /*statistic=*/true);
    at = to;
  }
  update(at, end, /*statistic=*/false);
}

// An operator's end of training (PrepareEnd, EndAt): versions held and
// completed up to the agreed end.
int64_t ParameterShard::PrepareEnd(absl::Duration hold) {
  {
    absl::MutexLock lock(&mu_);
    if (config_.mode() == proto::SYNC && initialized_ && !backup_ && !training_done_) {
      if (end_bound_ < 0) end_bound_ = version_ + 1;
      end_bound_expiry_ = absl::Now() + hold;
      changed_.SignalAll();  // The deadline thread watches the hold.
      return end_bound_;
    }
  }
  Shutdown(-1);
  return 0;
}

void ParameterShard::EndAt(int64_t version) {
  std::vector<std::pair<PullCallback, absl::StatusOr<PullReply>>> ready;
  std::vector<Waiter> moved;
  absl::Status failure;
  {
    absl::MutexLock lock(&mu_);
    if (config_.mode() == proto::SYNC && initialized_ && !backup_ && !training_done_) {
      end_version_ = version;
      if (version_ < version) failure = MoveHoldLocked(version, &moved);
      EndIfReachedLocked();
      if (training_done_) TakeReadyWaiters(&ready);
      changed_.SignalAll();
    } else {
      version = -1;  // Ends at once, below.
    }
  }
  for (auto& [done, reply] : ready) done(std::move(reply));
  for (Waiter& w : moved) w.done(failure);
  if (version < 0) Shutdown(-1);
}

absl::Status ParameterShard::MoveHoldLocked(int64_t bound, std::vector<Waiter>* moved) {
  absl::Status failure;
  // A held push was summed (SumsRowsLocked), as the completion expects.
  if (ready_ && HeldLocked() && VersionCompleteLocked()) {
    failure = CompleteVersionLocked(nullptr, moved);
  }
  end_bound_ = bound;
  return failure;
}

void ParameterShard::EndIfReachedLocked() {
  if (training_done_ || end_version_ < 0 || version_ < end_version_) return;
  LOG(INFO) << "an operator ended training at version " << version_
            << (pushed_.empty() ? "" : " (the pushes taken for the next version are dropped)");
  training_done_ = true;
  training_done_time_ = absl::Now();
  finished_replicas_.insert(-1);
}

}  // namespace psrt
