#include "worker/training/cluster_recovery.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/random_id.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace psrt {

ClusterRecovery::ClusterRecovery(const Options& options, ParameterStore* store)
    : options_(options), store_(store) {}

absl::Status ClusterRecovery::CheckOneRun(const std::vector<proto::StatusResponse>& shards) const {
  std::map<std::string, std::vector<std::string>> runs;  // Run id -> shards.
  for (int k = 0; k < static_cast<int>(shards.size()); ++k) {
    if (shards[k].initialized()) runs[shards[k].config().run_id()].push_back(store_->ShardName(k));
  }
  if (runs.size() <= 1) return absl::OkStatus();
  std::vector<std::string> held;
  for (const auto& [run, names] : runs) {
    held.push_back(absl::StrCat(absl::StrJoin(names, ", "), " hold",
                                names.size() == 1 ? "s" : "", " run ",
                                run.empty() ? "(none: an older checkpoint)" : run));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "the parameter servers hold states of different training runs (",
      absl::StrJoin(held, "; "), "), and no checkpoint of one run is held by all of them: "
      "a --checkpoint_dir shared with or left over from another job? Give each job its own "
      "checkpoint directories, or remove the other run's files"));
}

absl::Status ClusterRecovery::RecoverOrInitialize(const std::vector<Tensor>& values,
                                          bool after_fault) {
  ASSIGN_OR_RETURN(std::vector<proto::StatusResponse> shards, store_->GetStatus());
  checkpoints_ = std::all_of(shards.begin(), shards.end(),
                             [](const auto& s) { return s.has_checkpoint_dir(); });
  if (!checkpoints_ && !after_fault && options_.wants_checkpoints) {
    LOG(INFO) << "no checkpoints: not every parameter server has a --checkpoint_dir";
  }
  // This recovery round: newer than any the shards have taken, so that a
  // request of an abandoned round (a Restore still in flight when the chief
  // moved on) is refused wherever it lands late. Each Restore attempt is a
  // round of its own.
  int64_t epoch = 0;
  for (const auto& s : shards) epoch = std::max(epoch, s.recovery_epoch());
  ++epoch;
  // The newest checkpoint every shard holds: kept by every later save.
  std::vector<int64_t> common(shards[0].checkpoint_steps().begin(),
                              shards[0].checkpoint_steps().end());
  for (const auto& s : shards) {
    std::set<int64_t> held(s.checkpoint_steps().begin(), s.checkpoint_steps().end());
    common.erase(std::remove_if(common.begin(), common.end(),
                                [&](int64_t step) { return held.count(step) == 0; }),
                 common.end());
  }
  std::sort(common.rbegin(), common.rend());
  newest_common_checkpoint_ = common.empty() ? -1 : common.front();
  std::vector<std::string> empty;  // Shards that hold no model.
  std::set<int64_t> restored;      // Checkpoints restored by unconfirmed shards.
  bool all_ready = true;
  for (int k = 0; k < store_->num_shards(); ++k) {
    all_ready &= shards[k].ready();
    if (!shards[k].initialized()) empty.push_back(store_->ShardName(k));
    if (shards[k].initialized() && !shards[k].ready()) restored.insert(shards[k].restored_step());
  }
  // Init marks initialized shards ready (their state is kept) and
  // initializes the others.
  if (empty.size() == shards.size() && !after_fault) {
    proto::TrainingConfig config = options_.config;
    config.set_run_id(NewRandomHexId());
    RETURN_IF_ERROR(store_->Init(config, values, epoch));
    LOG(INFO) << "chief initialized " << values.size() << " variables on "
              << store_->num_shards() << " shards (run " << config.run_id() << ")";
    return absl::OkStatus();
  }
  std::set<int64_t> versions;
  for (const auto& s : shards) versions.insert(s.version());
  // Sync shards move in lockstep; different versions mean a shard was
  // brought to another state.
  const bool lockstep = options_.config.mode() != proto::SYNC || versions.size() == 1;
  absl::Status one_run = CheckOneRun(shards);
  if (all_ready && lockstep && one_run.ok()) {
    LOG(INFO) << "the parameter servers already hold the model; continuing";
    return store_->Init(options_.config, values, epoch);
  }
  if (empty.empty() && restored.size() == 1 && lockstep && one_run.ok() &&
      std::none_of(shards.begin(), shards.end(), [](const auto& s) { return s.ready(); })) {
    LOG(INFO) << "every parameter server restored checkpoint " << *restored.begin();
    return store_->Init(options_.config, values, epoch);
  }
  // Some shards restarted (or restored another checkpoint, or one of
  // another run, than the others): move all of them to the newest step that
  // all of them hold, of one run.
  for (int64_t step : common) {
    absl::Status status = store_->Restore(step, epoch);
    if (status.ok()) {
      ASSIGN_OR_RETURN(shards, store_->GetStatus());
      status = CheckOneRun(shards);
      if (!status.ok()) one_run = status;
    }
    if (status.ok()) {
      LOG(WARNING) << "the parameter servers held different states; all of them "
                      "now hold checkpoint " << step;
      return store_->Init(options_.config, values, epoch);  // Marks them ready.
    }
    LOG(WARNING) << "cannot restore checkpoint " << step << " everywhere: "
                 << status.message();
    ++epoch;
  }
  if (!one_run.ok()) return one_run;
  if (!empty.empty() && checkpoints_) {
    return absl::FailedPreconditionError(absl::StrCat(
        absl::StrJoin(empty, ", "), " lost the model (restarted, and restored no "
        "checkpoint: its log says which files it found missing or corrupt) and no "
        "checkpoint is held intact by every parameter server"));
  }
  if (!empty.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        absl::StrJoin(empty, ", "), " lost the model (restarted without a "
        "checkpoint to restore) and no checkpoint is held by every parameter "
        "server: give every ps task --checkpoint_dir so that a restarted one "
        "can recover"));
  }
  return absl::FailedPreconditionError(
      "the parameter servers hold different states and no checkpoint that "
      "all of them can restore; remove their checkpoint directories (or "
      "restore them) and start again");
}

absl::Status ClusterRecovery::Recover(const absl::Status& cause, std::vector<Tensor>* params,
                              ParameterStore::PullResult* pulled) {
  if (++recoveries_ > kMaxRecoveries) {
    return absl::Status(cause.code(), absl::StrCat("gave up after ", kMaxRecoveries,
                                                   " recoveries: ", cause.message()));
  }
  LOG(WARNING) << "the parameter servers' state changed (" << cause.message()
               << "); waiting for them to be ready and pulling again";
  const absl::Time start = absl::Now();
  const int64_t was_at = pulled->version;
  if (options_.metrics != nullptr) options_.metrics->SetState(proto::WORKER_WAITING);
  while (true) {
    if (absl::Status servers = store_->WaitForServers(options_.timeout); !servers.ok()) {
      return absl::Status(servers.code(),
                          absl::StrCat(servers.message(), " (after a fault: --ps_wait_secs)"));
    }
    if (options_.chief) RETURN_IF_ERROR(RecoverOrInitialize(*params, true));
    absl::StatusOr<proto::TrainingConfig> ready =
        store_->WaitForModelReady(options_.timeout);
    if (absl::IsCancelled(ready.status())) {
      pulled->training_done = true;
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(ready.status());
    store_->ForgetIncarnations();  // The confirmed state is the one to train on.
    absl::StatusOr<ParameterStore::PullResult> pull = store_->Pull(0, params);
    if (pull.ok()) {
      *pulled = *pull;
      break;
    }
    // A restart seen only now, or another rollback meanwhile: again.
    if (!absl::IsAborted(pull.status()) || ++recoveries_ > kMaxRecoveries) {
      return pull.status();
    }
    LOG(WARNING) << pull.status().message();
  }
  const int64_t rolled_back = std::max<int64_t>(0, was_at - pulled->version);
  LOG(WARNING) << "recovered in " << absl::Now() - start
               << ": carrying on at global step " << pulled->version << " (" << rolled_back
               << " steps rolled back)";
  if (options_.metrics != nullptr) {
    options_.metrics->RecordRollback(rolled_back);
    options_.metrics->SetState(proto::WORKER_TRAINING);
  }
  return absl::OkStatus();
}

}  // namespace psrt
