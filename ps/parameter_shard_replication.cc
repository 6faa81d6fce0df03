// ParameterShard's replicas: the primary's updates and fills to its backup,
// the backup's takeover, and a restarted copy's join (the contract is
// "Replicas" in parameter_shard.h; the messages are proto ReplicateHeader).
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "ps/parameter_shard.h"
#include "ps/snapshot_pool.h"

namespace psrt {
namespace {

// How long a backup waits for the primary's answer before taking over, and
// a restarted copy for the other copy's answer to its join.
constexpr absl::Duration kProbeTimeout = absl::Seconds(1);
constexpr absl::Duration kJoinTimeout = absl::Seconds(2);
// An update's answer; a fill's grows with its bytes (at 100 MB/s).
constexpr absl::Duration kUpdateTimeout = absl::Seconds(10);
// A primary without a backup tries to fill it again this often.
constexpr absl::Duration kFillRetry = absl::Seconds(1);

absl::Span<const char> Bytes(const float* data, int64_t n) {
  return {reinterpret_cast<const char*>(data), static_cast<size_t>(n) * sizeof(float)};
}

}  // namespace

std::string ParameterShard::ShardLabel() const { return absl::StrCat("shard ", options_.shard); }

absl::Status ParameterShard::AdmitAsPrimary(absl::string_view what) {
  if (options_.peer == nullptr) return absl::OkStatus();
  int64_t view = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!backup_) return absl::OkStatus();
    if (!filled_) {
      return absl::UnavailableError(absl::StrCat(
          what, ": this is the backup copy of ", ShardLabel(), ", and it holds none of its "
          "state yet; its primary is ", options_.peer->name()));
    }
    view = view_;
  }
  proto::ReplicateHeader probe;
  probe.set_kind(proto::ReplicateHeader::PROBE);
  probe.set_view(view);
  const absl::StatusOr<proto::ReplicateResponse> answer =
      options_.peer->Call(probe, {}, kProbeTimeout);
  // Only a primary that was not reached (or holds no primary copy) is
  // replaced; one that answered with an error is alive.
  const bool gone = answer.ok() ? !answer->primary()
                                : absl::IsUnavailable(answer.status()) ||
                                      absl::IsDeadlineExceeded(answer.status());
  if (!gone) {
    return absl::UnavailableError(absl::StrCat(
        what, ": this is the backup copy of ", ShardLabel(), "; its primary ",
        options_.peer->name(), " serves it",
        answer.ok() ? "" : absl::StrCat(" (it answered: ", answer.status().message(), ")")));
  }
  absl::MutexLock lock(&mu_);
  if (!backup_) return absl::OkStatus();  // Taken over meanwhile.
  if (!filled_) {
    return absl::UnavailableError(absl::StrCat(
        what, ": this backup copy of ", ShardLabel(), " fell out of step with its primary ",
        options_.peer->name(), ", which does not answer: it cannot take over"));
  }
  backup_ = false;
  ++view_;
  ++takeovers_;
  backup_in_step_ = false;
  next_fill_ = absl::InfinitePast();
  LOG(WARNING) << ShardLabel() << ": this copy takes over as the primary at version " << version_
               << " (view " << view_ << "): its primary " << options_.peer->name()
               << " did not answer ("
               << (answer.ok() ? "it holds no primary copy" : answer.status().message())
               << ")";
  return absl::OkStatus();
}

bool ParameterShard::JoinReplicas() {
  if (options_.peer == nullptr) return false;
  proto::ReplicateHeader join;
  join.set_kind(proto::ReplicateHeader::JOIN);
  const absl::StatusOr<proto::ReplicateResponse> answer =
      options_.peer->Call(join, {}, kJoinTimeout);
  if (!answer.ok() || !answer->primary()) {
    LOG(INFO) << ShardLabel() << ": starts as the primary ("
              << (answer.ok() ? absl::StrCat(options_.peer->name(), " holds no state of it")
                              : absl::StrCat(options_.peer->name(), " does not answer: ",
                                             answer.status().message()))
              << ")";
    return false;
  }
  absl::MutexLock lock(&mu_);
  backup_ = true;
  filled_ = false;
  view_ = answer->view();
  restoring_ = false;  // The primary's state, not a checkpoint, is the one to hold.
  changed_.SignalAll();
  LOG(INFO) << ShardLabel() << ": rejoins as the backup of " << options_.peer->name()
            << " (view " << view_ << ", version " << answer->version() << "); it fills this copy";
  return true;
}

void ParameterShard::DemoteLocked(std::vector<Waiter>* aborted) {
  backup_ = true;
  filled_ = false;
  backup_in_step_ = false;
  aborted->insert(aborted->end(), std::make_move_iterator(waiters_.begin()),
                  std::make_move_iterator(waiters_.end()));
  waiters_.clear();
  changed_.SignalAll();
}

absl::Status ParameterShard::TakeReplicaAnswerLocked(
    const absl::StatusOr<proto::ReplicateResponse>& answer, absl::string_view what,
    std::vector<Waiter>* aborted) {
  if (answer.ok()) {
    backup_in_step_ = answer->holds_state();
    return absl::OkStatus();
  }
  if (absl::IsFailedPrecondition(answer.status())) {
    DemoteLocked(aborted);
    LOG(WARNING) << ShardLabel() << ": " << options_.peer->name()
                 << " has taken over as the primary (" << answer.status().message()
                 << "); this copy is its backup now, to be filled";
    return absl::UnavailableError(absl::StrCat(ShardLabel(), " moved: ", options_.peer->name(),
                                               " serves it now"));
  }
  if (backup_in_step_) {
    LOG(WARNING) << ShardLabel() << ": its backup " << options_.peer->name() << " took no "
                 << what << " (" << answer.status().message()
                 << "); going on without a backup, filling it again once it answers";
  }
  backup_in_step_ = false;
  next_fill_ = absl::Now() + kFillRetry;
  return absl::OkStatus();
}

absl::Status ParameterShard::ReplicateLocked(proto::ReplicateHeader header,
                                             absl::Span<const float> update,
                                             std::vector<Waiter>* aborted) {
  if (options_.peer == nullptr || backup_) return absl::OkStatus();
  if (backup_in_step_) {
    header.set_kind(proto::ReplicateHeader::UPDATE);
    header.set_view(view_);
    std::vector<absl::Span<const char>> data;
    if (!update.empty()) data.push_back(Bytes(update.data(), update.size()));
    RETURN_IF_ERROR(TakeReplicaAnswerLocked(
        options_.peer->Call(header, data, kUpdateTimeout), "update", aborted));
    if (backup_in_step_) return absl::OkStatus();
    next_fill_ = absl::InfinitePast();  // It fell behind: it catches up now.
  }
  return FillBackupLocked(/*now=*/false, aborted);
}

absl::Status ParameterShard::FillBackupLocked(bool now, std::vector<Waiter>* aborted) {
  if (options_.peer == nullptr || backup_ || !initialized_) return absl::OkStatus();
  if (!now && absl::Now() < next_fill_) return absl::OkStatus();
  proto::ReplicateHeader header;
  header.set_kind(proto::ReplicateHeader::FILL);
  header.set_view(view_);
  header.set_version(version_);
  std::vector<absl::Span<const char>> data;
  ExportStateLocked(header.mutable_state(), &data);
  const int64_t bytes = static_cast<int64_t>(data.size()) * total_elements_ * sizeof(float);
  const absl::Time start = absl::Now();
  const absl::StatusOr<proto::ReplicateResponse> answer = options_.peer->Call(
      header, data, kUpdateTimeout + absl::Seconds(static_cast<double>(bytes) / 100e6));
  RETURN_IF_ERROR(TakeReplicaAnswerLocked(answer, "fill", aborted));
  if (backup_in_step_) {
    LOG(INFO) << ShardLabel() << ": backup " << options_.peer->name() << " filled at version "
              << version_ << " (view " << view_ << ", " << bytes << " bytes in "
              << absl::Now() - start << ")";
  }
  return absl::OkStatus();
}

void ParameterShard::ExportStateLocked(proto::ReplicaState* state_out,
                                       std::vector<absl::Span<const char>>* data) const {
  proto::ReplicaState& state = *state_out;
  *state.mutable_init()->mutable_config() = config_;
  for (const proto::VariableMeta& meta : variables_) *state.mutable_init()->add_variables() = meta;
  *state.mutable_init()->mutable_layout() = layout_;
  state.set_version(version_);
  state.set_incarnation(incarnation_);
  state.set_ready(ready_);
  state.set_restored_step(restored_step_);
  state.set_recovery_epoch(recovery_epoch_);
  state.set_training_done(training_done_);
  for (int r : finished_replicas_) state.add_finished_replicas(r);
  for (int64_t clock : clocks_) state.add_clocks(clock);
  for (const LastPush& push : last_push_) {
    state.add_last_push_worker_incarnations(push.worker_incarnation);
    state.add_last_push_steps(push.step);
    state.add_last_push_accepted(push.accepted);
  }
  state.set_pushes_applied(pushes_applied_);
  state.set_stale_pushes_dropped(stale_dropped_);
  state.set_nonfinite_pushes_dropped(nonfinite_dropped_);
  data->assign({Bytes(current_->values.data(), total_elements_)});
  for (auto& [name, tensor] : optimizer_->slots()) {
    state.add_slot_names(name);
    data->push_back(Bytes(tensor->data(), total_elements_));
  }
  state.set_has_average(average_ != nullptr);
  if (average_ != nullptr) data->push_back(Bytes(average_->values.data(), total_elements_));
}

absl::Status ParameterShard::ExportState(proto::ReplicaState* state, std::string* data) const {
  absl::MutexLock lock(&mu_);
  if (!initialized_) return absl::FailedPreconditionError("export: the shard holds no model");
  if (tables_ != nullptr) {
    return absl::FailedPreconditionError("export: the shard holds embedding tables");
  }
  std::vector<absl::Span<const char>> spans;
  ExportStateLocked(state, &spans);
  size_t size = 0;
  for (absl::Span<const char> span : spans) size += span.size();
  data->resize(size);
  char* out = data->data();
  for (absl::Span<const char> span : spans) {
    std::memcpy(out, span.data(), span.size());
    out += span.size();
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::ImportState(const proto::ReplicaState& state, ByteSource* data) {
  std::vector<Waiter> aborted;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    TakeFillLocked(state, data, &aborted, &status);
  }
  for (Waiter& w : aborted) {
    w.done(absl::AbortedError(absl::StrCat("pull: ", ShardLabel(), " took another state")));
  }
  return status;
}

void ParameterShard::TakeFillLocked(const proto::ReplicaState& state, ByteSource* data,
                                    std::vector<Waiter>* aborted, absl::Status* status) {
  int64_t total = 0;
  for (const proto::VariableMeta& meta : state.init().variables()) {
    const absl::StatusOr<int64_t> n =
        CheckedNumElements(Shape(meta.shape().begin(), meta.shape().end()));
    if (!n.ok() || *n > kMaxElements - total) {
      *status = absl::InvalidArgumentError(absl::StrCat(
          "fill: variable \"", meta.name(), "\" has no valid shape, or the variables hold more "
          "than ", kMaxElements, " elements"));
      return;
    }
    total += *n;
  }
  const int tensors = 1 + state.slot_names_size() + (state.has_average() ? 1 : 0);
  if (static_cast<int64_t>(data->size()) != tensors * total * int64_t{sizeof(float)}) {
    *status = absl::InvalidArgumentError(absl::StrCat(
        "fill: ", data->size(), " bytes of data, ", tensors, " tensors of ", total,
        " floats need ", tensors * total * sizeof(float)));
    return;
  }
  ShardState loaded;
  loaded.config = state.init().config();
  loaded.variables.assign(state.init().variables().begin(), state.init().variables().end());
  loaded.layout = state.init().layout();
  loaded.version = state.version();
  loaded.step = state.restored_step();
  int64_t offset = 0;
  auto read = [&](Tensor* tensor) {
    tensor->Resize({total});
    data->ReadAt(offset, {reinterpret_cast<char*>(tensor->data()), tensor->num_bytes()});
    offset += tensor->num_bytes();
  };
  read(&loaded.values);
  for (const std::string& name : state.slot_names()) {
    loaded.slots.emplace_back(name, Tensor());
    read(&loaded.slots.back().second);
  }
  if (state.has_average()) read(&loaded.average);
  *status = LoadLocked(std::move(loaded), aborted);
  if (!status->ok()) return;
  const int replicas = config_.num_replicas();
  if (state.clocks_size() != replicas || state.last_push_steps_size() != replicas ||
      state.last_push_worker_incarnations_size() != replicas ||
      state.last_push_accepted_size() != replicas) {
    *status = absl::InvalidArgumentError(
        absl::StrCat("fill: dedup state of another number of replicas than ", replicas));
    return;
  }
  incarnation_ = state.incarnation();
  ready_ = state.ready();
  restored_step_ = state.restored_step();
  recovery_epoch_ = state.recovery_epoch();
  if (state.training_done() && !training_done_) {
    training_done_ = true;
    training_done_time_ = absl::Now();
  }
  finished_replicas_.insert(state.finished_replicas().begin(), state.finished_replicas().end());
  for (int r = 0; r < replicas; ++r) {
    clocks_[r] = state.clocks(r);
    last_push_[r] = {state.last_push_worker_incarnations(r), state.last_push_steps(r),
                     state.last_push_accepted(r)};
  }
  pushes_applied_ = state.pushes_applied();
  stale_dropped_ = state.stale_pushes_dropped();
  nonfinite_dropped_ = state.nonfinite_pushes_dropped();
  filled_ = true;
}

absl::StatusOr<proto::ReplicateResponse> ParameterShard::Replicate(
    const proto::ReplicateHeader& header, ByteSource* data) {
  proto::ReplicateResponse response;
  std::vector<Waiter> aborted;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    if (options_.peer == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "replicate: ", ShardLabel(), " of this ps has no replica (psrt_ps --ps_replicas=0)"));
    }
    switch (header.kind()) {
      case proto::ReplicateHeader::PROBE:
        break;
      case proto::ReplicateHeader::JOIN:
        // The other copy restarted empty: this one serves, and fills it.
        if (initialized_ && (!backup_ || filled_)) {
          if (backup_) {
            backup_ = false;
            ++view_;
            ++takeovers_;
            LOG(WARNING) << ShardLabel() << ": this copy takes over as the primary at version "
                         << version_ << " (view " << view_ << "): its primary "
                         << options_.peer->name() << " restarted empty";
          }
          backup_in_step_ = false;
          next_fill_ = absl::InfinitePast();
        }
        break;
      case proto::ReplicateHeader::UPDATE:
      case proto::ReplicateHeader::FILL: {
        if (!backup_ ? view_ >= header.view() : view_ > header.view()) {
          return absl::FailedPreconditionError(absl::StrCat(
              ShardLabel(), " on this ps is ", backup_ ? "a backup" : "the primary", " at view ",
              view_, "; a message of view ", header.view(), " comes from a replaced primary"));
        }
        if (!backup_) {
          LOG(WARNING) << ShardLabel() << ": " << options_.peer->name() << " serves as the "
                       << "primary at view " << header.view() << "; this copy (view " << view_
                       << ") is its backup now";
          DemoteLocked(&aborted);
        }
        view_ = header.view();
        last_chief_contact_ = absl::Now();  // The primary hears from the chief.
        if (header.kind() == proto::ReplicateHeader::FILL) {
          TakeFillLocked(header.state(), data, &aborted, &status);
          if (!status.ok()) filled_ = false;
          break;
        }
        if (!filled_ || header.version() != version_) {
          filled_ = false;  // Behind (or ahead): the primary fills it.
          break;
        }
        const int64_t floats = header.skipped() ? 0 : total_elements_;
        if (static_cast<int64_t>(data->size()) != floats * int64_t{sizeof(float)}) {
          filled_ = false;
          status = absl::InvalidArgumentError(absl::StrCat(
              "replicate: an update of ", data->size(), " bytes, want ", floats * sizeof(float)));
          break;
        }
        if (!header.skipped()) {
          BeginUpdate();
          UpdateFromCopy(*data);
        } else {
          ++nonfinite_dropped_;
        }
        ++version_;
        if (config_.mode() == proto::ASYNC) {
          if (header.replica() >= 0 && header.replica() < config_.num_replicas()) {
            ++clocks_[header.replica()];
            last_push_[header.replica()] = {header.worker_incarnation(), header.step(),
                                            header.accepted()};
          }
          ++pushes_applied_;
        }
        for (int i = 0; i < header.pushed_size(); ++i) {
          const int r = header.pushed(i);
          if (r < 0 || r >= config_.num_replicas()) continue;
          last_push_[r] = {header.pushed_worker_incarnations(i), header.pushed_steps(i), true};
          ++pushes_applied_;
        }
        break;
      }
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("replicate: unknown kind ", static_cast<int>(header.kind())));
    }
    response.set_primary(!backup_);
    response.set_holds_state(initialized_ && (!backup_ || filled_));
    response.set_view(view_);
    response.set_version(version_);
  }
  for (Waiter& w : aborted) {
    w.done(absl::UnavailableError(absl::StrCat(
        "pull: ", ShardLabel(), " moved to ", options_.peer->name(), "; pull there")));
  }
  if (!status.ok()) return status;
  return response;
}

}  // namespace psrt
