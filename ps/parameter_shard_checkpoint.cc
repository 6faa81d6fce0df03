// ParameterShard's checkpoint methods (the format is in ps/checkpoint.h).
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/random_id.h"
#include "common/status_macros.h"
#include "common/training_config.h"
#include "glog/logging.h"
#include "google/protobuf/text_format.h"
#include "ps/parameter_shard.h"
#include "ps/snapshot_pool.h"

namespace psrt {

namespace {

// Restores a table's rows from a checkpoint of version `version` into
// `table` (made empty from the same meta), freeing the checkpoint's copy once
// they are in. The rows count as touched at that version.
absl::Status LoadRows(ShardState::Table* saved, int64_t version, EmbeddingTable* table) {
  const std::string& name = saved->meta.name();
  const std::vector<std::string> slots = table->slot_names();
  for (size_t s = 0; s < slots.size(); ++s) {
    if (s >= saved->slots.size() || saved->slots[s].first != slots[s]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "restore: table \"", name, "\": optimizer slot \"", slots[s],
          "\" missing from the checkpoint"));
    }
  }
  if (saved->slots.size() != slots.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "restore: table \"", name, "\": the checkpoint has ", saved->slots.size(),
        " optimizer slots, the sparse optimizer keeps ", slots.size()));
  }
  const size_t dim = table->dim();
  std::vector<float> row((1 + slots.size()) * dim);
  for (size_t i = 0; i < saved->ids.size(); ++i) {
    std::memcpy(row.data(), saved->values.data() + i * dim, dim * sizeof(float));
    for (size_t s = 0; s < slots.size(); ++s) {
      std::memcpy(row.data() + (1 + s) * dim, saved->slots[s].second.data() + i * dim,
                  dim * sizeof(float));
    }
    const absl::Status inserted = table->Insert(saved->ids[i], row, version);
    if (!inserted.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("restore: ", inserted.message()));
    }
  }
  *saved = ShardState::Table();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ParameterShard::Save(int64_t step, int64_t version,
                                                 int keep, int64_t keep_step) {
  if (options_.checkpoint_dir.empty()) {
    return absl::FailedPreconditionError(
        "save: this parameter server has no --checkpoint_dir");
  }
  if (keep < 1) {
    return absl::InvalidArgumentError(absl::StrCat("save: keep must be >= 1, got ", keep));
  }
  RETURN_IF_ERROR(AdmitAsPrimary("save"));
  absl::MutexLock save_lock(&save_mu_);
  ShardStateView view;
  std::shared_ptr<const Snapshot> values, average;
  std::vector<std::shared_ptr<Snapshot>> slots;
  auto start = [&] { return StartShardCheckpoint(checkpoint_id(), step, view); };
  std::optional<absl::StatusOr<PendingShardCheckpoint>> written;
  {
    absl::MutexLock lock(&mu_);
    last_chief_contact_ = absl::Now();  // Only the chief saves.
    RETURN_IF_ERROR(CheckNotRestoringLocked("save"));
    if (!initialized_) {
      return absl::FailedPreconditionError("save: the shard holds no model yet");
    }
    if (!ready_) {
      return absl::AbortedError(
          "save: the shard restored a checkpoint the chief has not confirmed");
    }
    if (version >= 0 && version != version_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "save: asked for version ", version, ", the shard is at ", version_));
    }
    view.config = config_;
    view.variables = variables_;
    view.layout = layout_;
    view.version = version_;
    view.num_elements = total_elements_;
    values = current_;  // Copy on write keeps these two unchanged.
    average = average_;
    for (auto& [name, tensor] : optimizer_->slots()) {
      slots.push_back(pool_->New(total_elements_));
      std::memcpy(slots.back()->values.data(), tensor->data(), tensor->num_bytes());
      view.slots.emplace_back(name, slots.back()->values.data());
    }
    view.values = values->values.data();
    view.average = average ? average->values.data() : nullptr;
    if (tables_ != nullptr) {
      // The rows are written now, under the lock that every change of a row
      // holds (the header comment says what that costs); the file is made
      // durable after it.
      for (int t = 0; t < tables_->num_tables(); ++t) {
        view.tables.push_back({tables_->meta(t), tables_->rows(t)});
      }
      written = start();
    }
  }
  if (!written.has_value()) written = start();
  if (!written->ok()) return written->status();
  ASSIGN_OR_RETURN(std::string path,
                   FinishShardCheckpoint(*std::move(*written), keep, keep_step));
  LOG(INFO) << "saved " << path << " (version " << view.version << ")";
  return path;
}

absl::Status ParameterShard::LoadLocked(ShardState state,
                                        std::vector<Waiter>* aborted) {
  RETURN_IF_ERROR(ValidateTrainingConfig(state.config));
  const int64_t total = state.values.num_elements();
  ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer,
                   NewOptimizer(state.config, total));
  auto slots = optimizer->slots();
  if (slots.size() != state.slots.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "restore: the checkpoint has ", state.slots.size(),
        " optimizer slots, its optimizer needs ", slots.size()));
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].first != state.slots[i].first) {
      return absl::InvalidArgumentError(absl::StrCat(
          "restore: optimizer slot \"", slots[i].first, "\" missing from the checkpoint"));
    }
    *slots[i].second = std::move(state.slots[i].second);
  }
  std::unique_ptr<ShardTables> tables;  // Null: the checkpoint holds none.
  if (!state.tables.empty()) {
    ShardTables::Metas metas;
    for (const ShardState::Table& table : state.tables) *metas.Add() = table.meta;
    absl::StatusOr<std::unique_ptr<ShardTables>> made = ShardTables::Create(metas, state.config);
    if (!made.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "restore: ", absl::StripPrefix(made.status().message(), "init: ")));
    }
    tables = *std::move(made);
    for (int t = 0; t < tables->num_tables(); ++t) {
      RETURN_IF_ERROR(LoadRows(&state.tables[t], state.version, tables->rows(t)));
    }
  }
  optimizer_ = std::move(optimizer);
  tables_ = std::move(tables);
  config_ = state.config;
  layout_ = std::move(state.layout);
  variables_ = std::move(state.variables);
  statistics_ = MovingStatisticRanges(variables_);
  total_elements_ = total;
  average_.reset();
  if (config_.moving_average_decay() > 0) {
    if (state.average.num_elements() == total) {
      average_ = pool_->Adopt(std::move(state.average));
    } else {  // A checkpoint without averages: they start at the values.
      average_ = pool_->New(total);
      std::memcpy(average_->values.data(), state.values.data(), state.values.num_bytes());
    }
  }
  current_ = pool_->Adopt(std::move(state.values));  // No copy of the file's values.
  sum_.Resize({total});
  clocks_.assign(config_.num_replicas(), 0);
  last_push_.assign(config_.num_replicas(), LastPush());
  ResetMembersLocked();
  pushed_.clear();
  // Pulls waiting for a version of the replaced state will not get it.
  aborted->insert(aborted->end(), std::make_move_iterator(waiters_.begin()),
                  std::make_move_iterator(waiters_.end()));
  waiters_.clear();
  version_ = state.version;
  restored_step_ = state.step;
  incarnation_ = NewIncarnation();  // Whoever expects the old state is told.
  initialized_ = true;
  ready_ = false;  // Until the chief confirms this is the state to train on.
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::Status ParameterShard::TakeRecoveryEpochLocked(int64_t epoch,
                                                     absl::string_view what) {
  if (epoch < recovery_epoch_) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " from recovery round ", epoch, " refused: this parameter "
        "server has taken round ", recovery_epoch_,
        " already (a late or reordered request of an abandoned recovery)"));
  }
  recovery_epoch_ = epoch;
  return absl::OkStatus();
}

absl::Status ParameterShard::Restore(int64_t step, int64_t recovery_epoch) {
  RETURN_IF_ERROR(AdmitAsPrimary("restore"));
  ASSIGN_OR_RETURN(ShardState state, ReadCheckpointForShard(checkpoint_id(), step));
  const int resharded_from = state.resharded_from;
  std::vector<Waiter> aborted;
  {
    absl::MutexLock lock(&mu_);
    last_chief_contact_ = absl::Now();  // Only the chief restores.
    // Checked when the state is replaced, not when the request arrived: a
    // slow read must not let an older round win.
    RETURN_IF_ERROR(TakeRecoveryEpochLocked(
        recovery_epoch, absl::StrCat("restore of checkpoint ", step)));
    RETURN_IF_ERROR(LoadLocked(std::move(state), &aborted));
    backup_in_step_ = false;  // The chief's Init confirms the state, then fills the backup.
    LOG(INFO) << "restored checkpoint " << step << " (version " << version_ << ")"
              << (resharded_from > 0
                      ? absl::StrCat(", resharded from the files of ", resharded_from,
                                     " shards as shard ", options_.shard, " of ",
                                     options_.num_shards)
                      : "");
  }
  for (Waiter& w : aborted) {
    w.done(absl::AbortedError(absl::StrCat(
        "pull: this parameter server was rolled back to checkpoint ", step,
        "; pull again")));
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::RecutForLayout(const proto::InitHeader& header) {
  const proto::ModelLayout& layout = header.layout();
  int64_t step = -1, incarnation = 0;
  std::string held;  // The restored state's placement, for the log.
  std::string held_placement;
  int64_t held_threshold = 0;
  {
    absl::MutexLock lock(&mu_);
    // Only a restored state that no chief has confirmed yet: a state being
    // trained on cannot change its slices on one shard alone. An Init that
    // InitState refuses changes nothing.
    if (options_.checkpoint_dir.empty() || !initialized_ || ready_ || restored_step_ < 0 ||
        layout_.placement().empty() || restoring_ ||
        header.recovery_epoch() < recovery_epoch_) {
      return absl::OkStatus();
    }
    const bool same_cut = layout_.placement() == layout.placement() &&
        layout_.partition_threshold_bytes() == layout.partition_threshold_bytes();
    // Another model is Init's error to name.
    if (!SameVariables(layout_, layout) || same_cut) return absl::OkStatus();
    step = restored_step_;
    incarnation = incarnation_;
    held_placement = layout_.placement();
    held_threshold = layout_.partition_threshold_bytes();
    held = absl::StrCat(held_placement, ", partition threshold ", held_threshold, " bytes");
  }
  // Read without the lock, as Restore does: status calls go on meanwhile.
  absl::StatusOr<ShardState> state = ReadCheckpointForShard(checkpoint_id(), step, &layout);
  if (!state.ok()) {
    return absl::Status(state.status().code(), absl::StrCat(
        "init: the chief places the variables otherwise (--placement=", layout.placement(),
        " --partition_threshold_bytes=", layout.partition_threshold_bytes(),
        ") than checkpoint ", step, " (", held, "), and cutting it anew failed: ",
        state.status().message(), "; give the ps tasks one directory that holds every shard's "
        "files, or restart them and resume with the checkpoint's --placement=", held_placement,
        " --partition_threshold_bytes=", held_threshold,
        " (shards that took the new placement hold it until restarted)"));
  }
  std::vector<Waiter> aborted;
  {
    absl::MutexLock lock(&mu_);
    if (incarnation_ != incarnation || ready_) {
      return absl::AbortedError(
          "init: the shard's state changed while its checkpoint was cut anew; call Init again");
    }
    RETURN_IF_ERROR(LoadLocked(*std::move(state), &aborted));
    LOG(INFO) << "cut checkpoint " << step << " anew as the chief places the variables ("
              << layout.placement() << ", partition threshold "
              << layout.partition_threshold_bytes() << " bytes; it was saved " << held << ")";
  }
  for (Waiter& w : aborted) {
    w.done(absl::AbortedError(absl::StrCat(
        "pull: this parameter server cut checkpoint ", step, " anew; pull again")));
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::RestoreLatest() {
  if (!options_.checkpoint_dir.empty()) {
    absl::Status newest_error;  // Of the newest checkpoint that did not restore.
    absl::Status refused;       // Of the newest whole one refused here.
    bool restored = false;
    for (int64_t step : ListRestorableCheckpoints(checkpoint_id())) {
      absl::Status status = Restore(step);
      if (status.ok()) {
        restored = true;
        break;
      }
      LOG(WARNING) << "skipping checkpoint " << step << ": " << status.message();
      if (newest_error.ok()) newest_error = status;
      if (refused.ok() && absl::IsFailedPrecondition(status)) refused = status;
    }
    // A job resumed with another number of shards, or with a checkpoint
    // that is whole but not this shard's to restore (FailedPrecondition),
    // would otherwise start afresh beside the checkpoints it was meant to
    // resume from.
    const std::string other = OtherShardCountFile(checkpoint_id());
    if (!restored && other.empty() && !refused.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--checkpoint_dir ", options_.checkpoint_dir, ": no checkpoint restores (",
          refused.message(), "); give this job a checkpoint directory of its own"));
    }
    if (!restored && !other.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--checkpoint_dir ", options_.checkpoint_dir, " holds ", other,
          ", written by a job of another number of shards (this job has ", options_.num_shards,
          ": ps tasks x --ps_stripes), ",
          newest_error.ok()
              ? "but not every shard file of any one of that job's checkpoints. Restoring onto "
                "another number of shards reads them all: give the ps tasks one checkpoint "
                "directory that holds every file (or resume with the job's own number of "
                "shards)"
              : absl::StrCat("and no checkpoint restores (the newest: ", newest_error.message(),
                             ")"),
          "; or give this job a checkpoint directory of its own"));
    }
  }
  absl::MutexLock lock(&mu_);
  restoring_ = false;
  last_chief_contact_ = absl::Now();  // Its wait starts now.
  changed_.SignalAll();
  return absl::OkStatus();
}

// A job resumed from its checkpoint with other flags (Init of a restored
// state).
namespace {

// "learning_rate: 0.02 -> 0.01, num_replicas: 2 -> 3": the fields that
// differ.
std::string ConfigChanges(const proto::TrainingConfig& from, const proto::TrainingConfig& to) {
  std::vector<std::string> changes;
  const google::protobuf::Descriptor* descriptor = from.GetDescriptor();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = descriptor->field(i);
    std::string was, is;
    google::protobuf::TextFormat::PrintFieldValueToString(from, field, -1, &was);
    google::protobuf::TextFormat::PrintFieldValueToString(to, field, -1, &is);
    if (was != is) changes.push_back(absl::StrCat(field->name(), ": ", was, " -> ", is));
  }
  return absl::StrJoin(changes, ", ");
}

}  // namespace

absl::Status ParameterShard::TakeChiefConfigLocked(const proto::TrainingConfig& asked) {
  proto::TrainingConfig next = asked;
  next.set_run_id(config_.run_id());  // The state's lineage stays its own.
  const std::string changes = ConfigChanges(config_, next);
  if (changes.empty()) return absl::OkStatus();
  if (ready_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "init: this parameter server trains with other flags than the chief's (", changes,
        "): flags change when the whole job restarts from its checkpoint, not while it runs"));
  }
  ASSIGN_OR_RETURN(const proto::TrainingConfig held_rule, SparseTrainingConfig(config_));
  ASSIGN_OR_RETURN(const proto::TrainingConfig next_rule, SparseTrainingConfig(next));
  auto refuse = [](absl::string_view flag, proto::OptimizerType held,
                   proto::OptimizerType wanted) {
    return absl::FailedPreconditionError(absl::StrCat(
        "init: the state this parameter server restored was trained with ", flag, "=",
        absl::AsciiStrToLower(proto::OptimizerType_Name(held)), ", the chief asks for ",
        absl::AsciiStrToLower(proto::OptimizerType_Name(wanted)),
        ": an optimizer's slots do not carry over to another; resume with the checkpoint's ",
        flag, ", or train from another --checkpoint_dir"));
  };
  if (config_.optimizer() != next.optimizer()) {
    return refuse("--optimizer", config_.optimizer(), next.optimizer());
  }
  if (tables_ != nullptr && held_rule.optimizer() != next_rule.optimizer()) {
    return refuse("--sparse_optimizer", held_rule.optimizer(), next_rule.optimizer());
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer, NewOptimizer(next, total_elements_));
  if (tables_ != nullptr) RETURN_IF_ERROR(tables_->Reconfigure(next, version_));
  for (int i = 0; i < optimizer->num_slots(); ++i) {  // The same rule: the same slots.
    const Tensor& held = *optimizer_->slots()[i].second;
    std::memcpy(optimizer->slots()[i].second->data(), held.data(), held.num_bytes());
  }
  optimizer_ = std::move(optimizer);
  if (next.moving_average_decay() <= 0) {
    average_.reset();
  } else if (average_ == nullptr) {  // Averages start at the values.
    average_ = pool_->New(total_elements_);
    std::memcpy(average_->values.data(), current_->values.data(),
                total_elements_ * sizeof(float));
  }
  config_ = std::move(next);
  clocks_.assign(config_.num_replicas(), 0);
  last_push_.assign(config_.num_replicas(), LastPush());
  ResetMembersLocked();
  pushed_.clear();
  LOG(INFO) << "init: the restored state goes on with the chief's flags: " << changes;
  return absl::OkStatus();
}

}  // namespace psrt
