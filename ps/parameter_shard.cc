#include "ps/parameter_shard.h"
#include "ps/snapshot_pool.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/random_id.h"
#include "common/status_macros.h"
#include "common/training_config.h"
#include "common/wire_dtype.h"
#include "glog/logging.h"
#include "kernels/elementwise.h"

namespace psrt {
namespace {

// Gradients are read off the wire in blocks of this many floats (64 KiB),
// small enough to stay in cache between the copy and the update.
constexpr int64_t kBlockFloats = 16 * 1024;


Shape MetaShape(const proto::VariableMeta& meta) {
  return Shape(meta.shape().begin(), meta.shape().end());
}


// How the variables held differ from those asked for: the first that does,
// or "" when none. A held model without the batch norms' moving statistics
// that the asked one has is a checkpoint of an older psrt, which kept them
// in each worker: said so.
std::string VariablesDiffer(const std::vector<proto::VariableMeta>& held,
                            const google::protobuf::RepeatedPtrField<proto::VariableMeta>& asked) {
  const auto describe = [](const proto::VariableMeta& v) {
    return absl::StrCat("\"", v.name(), "\" ", ShapeToString(MetaShape(v)));
  };
  const int n = std::min<int>(held.size(), asked.size());
  for (int i = 0; i <= n; ++i) {
    if (i < n && held[i].name() == asked[i].name() && MetaShape(held[i]) == MetaShape(asked[i])) {
      continue;
    }
    if (i == n && held.size() == static_cast<size_t>(asked.size())) return "";
    std::string differ = absl::StrCat(
        "variable ", i, " is ", i < static_cast<int>(held.size()) ? describe(held[i]) : "none",
        " here, ", i < asked.size() ? describe(asked[i]) : "none", " in the chief's model");
    if (i < asked.size() && IsMovingStatistic(asked[i].name()) &&
        (i >= static_cast<int>(held.size()) || !IsMovingStatistic(held[i].name()))) {
      absl::StrAppend(&differ, " (a checkpoint of a psrt before batch norms' moving statistics "
                               "were variables: resume it with that psrt, or train anew)");
    }
    return differ;
  }
  return "";
}

// Keeps the lowest of concurrently found indices in `first`.
void KeepLowest(std::atomic<int64_t>* first, int64_t index) {
  int64_t seen = first->load();
  while (index < seen && !first->compare_exchange_weak(seen, index)) {
  }
}

// The variable of `metas` (laid out back to back) that holds element `index`.
template <class Metas>
const proto::VariableMeta& MetaHolding(const Metas& metas, int64_t index) {
  for (const proto::VariableMeta& meta : metas) {
    const int64_t n = *CheckedNumElements(MetaShape(meta));
    if (index < n) return meta;
    index -= n;
  }
  return *std::prev(metas.end());
}

}  // namespace

std::vector<std::pair<int64_t, int64_t>> ParameterShard::MovingStatisticRanges(
    absl::Span<const proto::VariableMeta> metas) {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  int64_t begin = 0;
  for (const proto::VariableMeta& meta : metas) {
    const int64_t end = begin + *CheckedNumElements(MetaShape(meta));
    if (IsMovingStatistic(meta.name())) {
      if (!ranges.empty() && ranges.back().second == begin) {
        ranges.back().second = end;
      } else {
        ranges.emplace_back(begin, end);
      }
    }
    begin = end;
  }
  return ranges;
}

ParameterShard::ParameterShard(const Options& options)
    : options_(options),
      incarnation_(NewIncarnation()),
      cpu_(options.threads, /*spin=*/false),
      pool_(std::make_shared<SnapshotPool>()),
      encodings_(std::make_shared<EncodingCache>()) {
  // A replicated copy also waits for JoinReplicas before it serves: it may
  // be the backup of a copy that outlived its restart.
  restoring_ = options.restore_at_start &&
               (!options.checkpoint_dir.empty() || options.peer != nullptr);
  backup_ = options.peer != nullptr && options.starts_as_backup;
  deadline_thread_ = std::thread([this] { DeadlineLoop(); });
}

ParameterShard::~ParameterShard() {
  std::vector<Waiter> waiters;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    waiters.swap(waiters_);
    changed_.SignalAll();
  }
  deadline_thread_.join();
  for (Waiter& w : waiters) {
    w.done(absl::CancelledError("parameter server is shutting down"));
  }
}

absl::StatusOr<bool> ParameterShard::Init(const proto::InitHeader& header,
                                          ByteSource* data) {
  RETURN_IF_ERROR(AdmitAsPrimary("init"));
  if (header.has_layout()) RETURN_IF_ERROR(RecutForLayout(header));
  ASSIGN_OR_RETURN(const bool initialized, InitState(header, data));
  // The backup starts from the state the chief made or confirmed.
  std::vector<Waiter> moved;
  absl::Status filled;
  {
    absl::MutexLock lock(&mu_);
    filled = FillBackupLocked(/*now=*/true, &moved);
  }
  for (Waiter& w : moved) w.done(filled);
  RETURN_IF_ERROR(filled);
  return initialized;
}

absl::StatusOr<bool> ParameterShard::InitState(const proto::InitHeader& header,
                                               ByteSource* data) {
  RETURN_IF_ERROR(ValidateTrainingConfig(header.config()));
  if (options_.peer != nullptr && !header.tables().empty()) {
    return absl::InvalidArgumentError(
        "init: embedding tables are not replicated yet: run a model with tables without "
        "--ps_replicas");
  }
  if (options_.peer != nullptr && header.config().max_workers() > 0) {
    return absl::InvalidArgumentError(
        "init: elastic workers (--max_workers) are not replicated yet: drop --ps_replicas or "
        "--max_workers");
  }
  int64_t total = 0;
  std::set<std::string> names;
  for (const proto::VariableMeta& meta : header.variables()) {
    if (meta.name().empty() || !names.insert(meta.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "init: empty or duplicate variable name \"", meta.name(), "\""));
    }
    if (meta.dtype() != proto::DT_FLOAT) {
      return absl::InvalidArgumentError(
          absl::StrCat("init: variable \"", meta.name(), "\" has dtype ",
                       proto::DataType_Name(meta.dtype()), ", want DT_FLOAT"));
    }
    absl::StatusOr<int64_t> n = CheckedNumElements(MetaShape(meta));
    if (!n.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "init: variable \"", meta.name(), "\": ", n.status().message()));
    }
    total += *n;
    if (total > kMaxElements) {
      return absl::InvalidArgumentError(
          absl::StrCat("init: the variables hold more than ", kMaxElements, " elements"));
    }
  }
  if (static_cast<int64_t>(data->size()) != total * int64_t{sizeof(float)}) {
    return absl::InvalidArgumentError(
        absl::StrCat("init: tensor_data has ", data->size(), " bytes, the ",
                     header.variables_size(), " variables need ",
                     total * sizeof(float)));
  }

  if (options_.skip_nonfinite_gradients && header.config().mode() == proto::SYNC) {
    // Shards would drop different replicas' slices of one step.
    return absl::FailedPreconditionError(
        "init: this parameter server runs with --nonfinite_gradients=skip, "
        "which only async training allows; use reject with --sync_replicas");
  }
  absl::MutexLock lock(&mu_);
  last_chief_contact_ = absl::Now();  // Only the chief initializes.
  RETURN_IF_ERROR(CheckNotRestoringLocked("init"));
  RETURN_IF_ERROR(TakeRecoveryEpochLocked(header.recovery_epoch(), "init"));
  if (initialized_) {
    const bool same_tables = tables_ != nullptr ? tables_->Same(header.tables())
                                                : header.tables().empty();
    const std::string differ = VariablesDiffer(variables_, header.variables());
    if (!differ.empty() || !same_tables) {
      return absl::FailedPreconditionError(absl::StrCat(
          "init: this parameter server already holds a different model (",
          differ.empty() ? "the embedding tables differ" : differ,
          ": another --model, layer sizes, --placement or --partition_threshold_bytes than "
          "the run it holds, or its checkpoint, used); restart it to train another"));
    }
    RETURN_IF_ERROR(TakeChiefConfigLocked(header.config()));
    // The chief's word on the layout is the current one (a state restored
    // from a file that predates layouts has none).
    if (header.has_layout()) layout_ = header.layout();
    ready_ = true;
    return false;
  }
  std::shared_ptr<Snapshot> initial = pool_->New(total);
  float* values = initial->values.data();
  cpu_.ParallelFor(total, kBlockFloats, [&](int64_t begin, int64_t end) {
    data->ReadAt(begin * sizeof(float),
                 {reinterpret_cast<char*>(values + begin), (end - begin) * sizeof(float)});
  });
  if (const int64_t bad = kernels::FirstNonFinite({values, static_cast<size_t>(total)}); bad >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "init: the initial value of \"", MetaHolding(header.variables(), bad).name(),
        "\" holds NaN or Inf"));
  }
  std::unique_ptr<ShardTables> tables;
  if (!header.tables().empty()) {
    ASSIGN_OR_RETURN(tables, ShardTables::Create(header.tables(), header.config()));
  }
  ASSIGN_OR_RETURN(optimizer_, NewOptimizer(header.config(), total));
  tables_ = std::move(tables);
  config_ = header.config();
  variables_.assign(header.variables().begin(), header.variables().end());
  statistics_ = MovingStatisticRanges(variables_);
  layout_ = header.layout();
  current_ = std::move(initial);
  total_elements_ = total;
  sum_.Resize({total});
  clocks_.assign(config_.num_replicas(), 0);
  last_push_.assign(config_.num_replicas(), LastPush());
  ResetMembersLocked();
  if (config_.moving_average_decay() > 0) {
    average_ = pool_->New(total);
    std::memcpy(average_->values.data(), values, total * sizeof(float));
  }
  version_ = 0;
  initialized_ = true;
  ready_ = true;
  changed_.SignalAll();
  return true;
}

absl::Status ParameterShard::ValidateTensors(
    const google::protobuf::RepeatedPtrField<proto::VariableMeta>& metas,
    size_t data_size, absl::string_view what) const {
  if (metas.size() != static_cast<int>(variables_.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": carries ", metas.size(), " tensors, this shard holds ",
        variables_.size(), " variables"));
  }
  for (int i = 0; i < metas.size(); ++i) {
    const proto::VariableMeta& got = metas[i];
    const proto::VariableMeta& want = variables_[i];
    if (got.name() != want.name()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": tensor ", i, " is \"", got.name(),
                       "\", this shard expects \"", want.name(), "\""));
    }
    if (got.dtype() != metas[0].dtype() ||
        !IsWireDtype(got.dtype())) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": variable \"", got.name(), "\" has dtype ",
          proto::DataType_Name(got.dtype()), ", want DT_FLOAT, DT_BFLOAT16 or DT_HALF (",
          "one dtype for every tensor of a message)"));
    }
    if (MetaShape(got) != MetaShape(want)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": variable \"", got.name(), "\" has shape ",
          ShapeToString(MetaShape(got)), ", want ",
          ShapeToString(MetaShape(want))));
    }
  }
  const size_t want = static_cast<size_t>(total_elements_) *
                     WireBytesPerElement(metas.empty() ? proto::DT_FLOAT : metas[0].dtype());
  if (data_size != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": tensor_data has ", data_size, " bytes, want ", want));
  }
  return absl::OkStatus();
}

void ParameterShard::ParallelFor(absl::FunctionRef<void(int64_t, int64_t)> fn) {
  cpu_.ParallelFor(total_elements_, kBlockFloats, fn);
}

void ParameterShard::ForEachBlock(
    const ByteSource& data,
    absl::FunctionRef<void(int64_t, absl::Span<const float>)> fn) {
  ParallelFor([&](int64_t first, int64_t last) {
    static thread_local Tensor block({kBlockFloats});
    for (int64_t begin = first; begin < last; begin += kBlockFloats) {
      const int64_t n = std::min(kBlockFloats, last - begin);
      // Bytes that lie in memory already (the data plane's receive buffer,
      // a sum) are read where they are, not copied block by block first.
      const char* in_place = data.InPlace(begin * sizeof(float), n * sizeof(float));
      if (in_place != nullptr && reinterpret_cast<uintptr_t>(in_place) % alignof(float) == 0) {
        fn(begin, {reinterpret_cast<const float*>(in_place), static_cast<size_t>(n)});
        continue;
      }
      data.ReadAt(begin * sizeof(float),
                  {reinterpret_cast<char*>(block.data()), n * sizeof(float)});
      fn(begin, {block.data(), static_cast<size_t>(n)});
    }
  });
}

absl::Status ParameterShard::CheckNotRestoringLocked(absl::string_view what) const {
  if (!restoring_) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      what, ": this parameter server is still restoring its checkpoint; try again"));
}

int64_t ParameterShard::FirstNonFinite(const ByteSource& data) {
  std::atomic<int64_t> first{std::numeric_limits<int64_t>::max()};
  ForEachBlock(data, [&](int64_t begin, absl::Span<const float> block) {
    const int64_t i = kernels::FirstNonFinite(block);
    if (i >= 0) KeepLowest(&first, begin + i);
  });
  const int64_t index = first.load();
  return index == std::numeric_limits<int64_t>::max() ? -1 : index;
}

int64_t ParameterShard::FirstNonFiniteUpdate(const ByteSource& grad) {
  optimizer_->BeginStep(version_);
  const float* values = current_->values.data();
  std::atomic<int64_t> first{std::numeric_limits<int64_t>::max()};
  ForEachBlock(grad, [&](int64_t begin, absl::Span<const float> block) {
    if (!optimizer_->UpdateIsFinite(begin, block, {values + begin, block.size()})) {
      KeepLowest(&first, begin);
    }
  });
  const int64_t index = first.load();
  return index == std::numeric_limits<int64_t>::max() ? -1 : index;
}

const proto::VariableMeta& ParameterShard::VariableAt(int64_t index) const {
  return MetaHolding(variables_, index);
}

int64_t ParameterShard::incarnation() const {
  absl::MutexLock lock(&mu_);
  return incarnation_;
}

std::optional<size_t> ParameterShard::max_push_bytes() const {
  absl::MutexLock lock(&mu_);
  if (current_ == nullptr) return std::nullopt;
  return current_->values.num_bytes() + (tables_ != nullptr ? tables_->max_push_bytes() : 0);
}

bool ParameterShard::TryTableStatus(std::vector<proto::TableStatus>* tables) const {
  if (!mu_.TryLock()) return false;
  proto::StatusResponse status;
  if (tables_ != nullptr) tables_->AddStatus(&status);
  mu_.Unlock();
  tables->assign(status.tables().begin(), status.tables().end());
  return true;
}

proto::StatusResponse ParameterShard::GetStatus() const {
  proto::StatusResponse status;
  // Disk I/O, outside the lock: a slow disk must not hold up training.
  status.set_has_checkpoint_dir(!options_.checkpoint_dir.empty());
  if (!options_.checkpoint_dir.empty()) {
    for (int64_t step : ListRestorableCheckpoints(checkpoint_id())) {
      status.add_checkpoint_steps(step);
    }
  }
  absl::MutexLock lock(&mu_);
  status.set_initialized(initialized_);
  status.set_ready(ready_);
  status.set_version(version_);
  *status.mutable_config() = config_;
  for (const proto::VariableMeta& meta : variables_) {
    *status.add_variables() = meta;
  }
  status.set_incarnation(incarnation_);
  status.set_pushes_applied(pushes_applied_);
  status.set_stale_pushes_dropped(stale_dropped_);
  status.set_nonfinite_pushes_dropped(nonfinite_dropped_);
  status.set_training_done(training_done_);
  status.set_restored_step(restored_step_);
  status.set_recovery_epoch(recovery_epoch_);
  status.set_waiting_pulls(static_cast<int64_t>(waiters_.size()));
  status.set_restoring(restoring_);
  status.set_backup(backup_);
  status.set_shard(options_.shard);
  status.set_replica_view(options_.peer != nullptr ? view_ : 0);
  if (tables_ != nullptr) tables_->AddStatus(&status);
  return status;
}

void ParameterShard::Shutdown(int replica) {
  std::vector<std::pair<PullCallback, absl::StatusOr<PullReply>>> ready;
  {
    absl::MutexLock lock(&mu_);
    finished_replicas_.insert(replica);
    if (replica <= 0 && !training_done_) {
      LOG(INFO) << (replica == 0 ? "the chief" : "an operator")
                << " ended training at version " << version_;
      training_done_ = true;
      training_done_time_ = absl::Now();
    }
    // Training may be over, and a finished replica no longer holds back
    // pulls waiting on the slowest replica's step.
    if (initialized_) TakeReadyWaiters(&ready);
    changed_.SignalAll();
  }
  for (auto& [done, reply] : ready) done(std::move(reply));
}

void ParameterShard::ResetMembersLocked() {
  member_from_.assign(config_.max_workers() > 0 ? config_.num_replicas() : 0, -1);
  if (!member_from_.empty()) member_from_[0] = 0;
}

absl::StatusOr<proto::MembersResponse> ParameterShard::SetMembers(
    const proto::MembersRequest& request) {
  std::vector<std::pair<PullCallback, absl::StatusOr<PullReply>>> ready;
  std::vector<Waiter> moved;
  proto::MembersResponse response;
  absl::Status failure;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CheckNotRestoringLocked("members"));
    if (!initialized_) {
      return absl::FailedPreconditionError(
          "members: this parameter server has not been initialized by the chief");
    }
    if (config_.max_workers() <= 0) {
      return absl::FailedPreconditionError(
          "members: this job's workers are not elastic (its chief gave no --max_workers)");
    }
    if (request.replicas_size() != request.from_versions_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "members: ", request.replicas_size(), " replicas but ", request.from_versions_size(),
          " from_versions"));
    }
    std::vector<int64_t> members(config_.num_replicas(), -1);
    for (int i = 0; i < request.replicas_size(); ++i) {
      const int r = request.replicas(i);
      if (r < 0 || r >= config_.num_replicas() || request.from_versions(i) < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("members: replica ", r, " from version ", request.from_versions(i),
                         ": replicas are 0..", config_.num_replicas() - 1,
                         " (--max_workers), versions >= 0"));
      }
      members[r] = request.from_versions(i);
    }
    if (members[0] < 0) {
      return absl::InvalidArgumentError("members: the chief (replica 0) is not in the list");
    }
    member_from_ = std::move(members);
    last_chief_contact_ = absl::Now();
    // A worker no longer waited for: the version may be complete now. Its
    // fault, if any, is logged; the pushes that made it were answered.
    if (ready_ && !training_done_ && VersionCompleteLocked() && !HeldLocked()) {
      failure = CompleteVersionLocked(nullptr, &moved);
      EndIfReachedLocked();
    }
    response.set_version(version_);
    TakeReadyWaiters(&ready);
    changed_.SignalAll();  // WaitUntilFinished waits for the members alone.
  }
  for (auto& [done, reply] : ready) done(std::move(reply));
  for (Waiter& w : moved) w.done(failure);
  return response;
}

absl::Status ParameterShard::WaitUntilFinished(absl::Duration grace,
                                               absl::Duration chief_timeout) {
  absl::MutexLock lock(&mu_);
  while (true) {
    if (training_done_) {
      std::vector<int> missing;
      for (int r = 0; r < config_.num_replicas(); ++r) {
        // Elastic: only the members are waited for.
        const bool member = member_from_.empty() || member_from_[r] >= 0;
        if (member && finished_replicas_.count(r) == 0) missing.push_back(r);
      }
      if (initialized_ && missing.empty()) return absl::OkStatus();
      if (absl::Now() >= training_done_time_ + grace) {
        LOG(WARNING) << "exiting " << grace << " after the end of training; "
                     << "replicas that never said goodbye: "
                     << absl::StrJoin(missing, ", ");
        return absl::OkStatus();
      }
      changed_.WaitWithDeadline(&mu_, training_done_time_ + grace);
    } else if (initialized_) {
      // A model is held: the chief must keep in touch until it ends training.
      // A pull of the chief's that waits (for the slowest worker) is word too.
      for (const Waiter& w : waiters_) {
        if (w.options.replica == 0) last_chief_contact_ = absl::Now();
      }
      const absl::Time chief_deadline = last_chief_contact_ + chief_timeout;
      if (absl::Now() >= chief_deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "no push, pull, save, restore or init from the chief (replica 0) for ",
            absl::FormatDuration(chief_timeout),
            " and training is not over: the chief failed and was not restarted "
            "(see --chief_timeout_secs); exiting so that the job fails instead of hanging"));
      }
      changed_.WaitWithDeadline(&mu_, chief_deadline);
    } else {
      changed_.Wait(&mu_);
    }
  }
}

}  // namespace psrt
