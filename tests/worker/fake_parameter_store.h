// FakeParameterStore: an in-process ParameterStore for the trainer's unit
// tests, with no servers and no threads. Its shards apply plain SGD
// (config.learning_rate) to each push at once, as a sync run of one replica
// does, and keep checkpoints in memory; every answer is deterministic.
//
// Faults are injected as the real PsClient reports them: a shard that
// restarts (RestartShard) gets a new incarnation, and restores its newest
// checkpoint (initialized, not ready, at that checkpoint's version) or holds
// no model; Restore rolls every shard back, with new incarnations. The next
// Pull or Push after an incarnation changed fails with Aborted ("... restarted
// or was rolled back ..."), until ForgetIncarnations. A shard that went away
// (StopShard) and was not restarted fails WaitForServers at once, as the
// real one does at its timeout. OnVersion runs an
// injection when a push brings the shards to a version.
//
// Thread safety: not thread-safe, as ParameterStore; the step pipeline's
// calls from its own thread are one at a time.
#ifndef PSRT_TESTS_WORKER_FAKE_PARAMETER_STORE_H_
#define PSRT_TESTS_WORKER_FAKE_PARAMETER_STORE_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/placement.h"
#include "common/status_macros.h"
#include "worker/store/parameter_store.h"

namespace psrt {

class FakeParameterStore : public ParameterStore {
 public:
  // REQUIRES: the placement of `variables` on `num_shards` shards is valid.
  FakeParameterStore(const std::vector<VariableDef>& variables, int num_shards,
                     bool checkpoint_dirs = true)
      : variables_(variables),
        placement_(*ComputePlacement(variables, num_shards, PlacementOptions())),
        shards_(num_shards),
        known_(num_shards, 0),
        pulled_(num_shards, 0) {
    for (Shard& s : shards_) {
      s.incarnation = next_incarnation_++;
      s.has_checkpoint_dir = checkpoint_dirs;
    }
  }

  // --- Fault injection.
  // Shard k restarts: it restores its newest checkpoint (if it holds one and
  // `restores`) or comes back empty. Training is no longer done.
  void RestartShard(int k, bool restores = true) {
    Shard& s = shards_[k];
    s.stopped = false;
    s.incarnation = next_incarnation_++;
    s.ready = false;
    s.restored_step = -1;
    training_done_ = false;
    if (restores && !s.checkpoints.empty()) {
      Load(&s, s.checkpoints.rbegin()->first);
    } else {
      s.initialized = false;
      s.version = 0;
      s.values.clear();
    }
  }
  // Shard k's process went away for good: WaitForServers fails (and
  // RestartShard brings it back).
  void StopShard(int k) { shards_[k].stopped = true; }
  // The timeout of the last WaitForServers.
  absl::Duration last_server_wait() const { return last_server_wait_; }
  // Runs `action` right after a push brings the shards to `version`.
  void OnVersion(int64_t version, std::function<void()> action) {
    on_version_[version] = std::move(action);
  }
  // The next `n` saves fail with `status` (a disk error, say).
  void FailSaves(int n, absl::Status status) {
    failing_saves_ = n;
    save_error_ = std::move(status);
  }
  void DropCheckpoint(int k, int64_t step) { shards_[k].checkpoints.erase(step); }
  // Shard k now holds a state of run `run_id` (a checkpoint dir left over
  // from another job).
  void SetRunId(int k, const std::string& run_id) { shards_[k].config.set_run_id(run_id); }
  // A new worker process: it knows no incarnation yet.
  void NewClient() { std::fill(known_.begin(), known_.end(), 0); }

  // --- Observations.
  int64_t version(int k = 0) const { return shards_[k].version; }
  bool ready(int k) const { return shards_[k].ready; }
  bool training_done() const { return training_done_; }
  std::vector<int64_t> checkpoints(int k) const {
    std::vector<int64_t> steps;
    for (const auto& [step, unused] : shards_[k].checkpoints) steps.push_back(step);
    return steps;
  }
  // The model as the shards hold it, assembled from their slices.
  std::vector<Tensor> Values() const {
    std::vector<Tensor> values;
    for (const VariableDef& v : variables_) values.emplace_back(v.shape);
    for (const VariableSlice& slice : placement_.slices) {
      const Shard& s = shards_[slice.shard];
      if (!s.initialized) continue;
      std::memcpy(Bytes(&values[slice.variable], slice),
                  Bytes(&const_cast<Shard&>(s).values[slice.variable], slice), slice.num_bytes);
    }
    return values;
  }
  const std::vector<int64_t>& saves() const { return saves_; }        // Steps saved.
  const std::vector<int64_t>& restores() const { return restores_; }  // Steps restored.
  const std::vector<std::string>& run_ids() const { return run_ids_; }  // Per Init.
  int inits() const { return static_cast<int>(run_ids_.size()); }
  int pushes() const { return pushes_; }
  int shutdowns() const { return shutdowns_; }

  // --- ParameterStore.
  absl::Status WaitForServers(absl::Duration timeout) override {
    last_server_wait_ = timeout;
    for (int k = 0; k < num_shards(); ++k) {
      if (shards_[k].stopped) {
        return absl::DeadlineExceededError(
            absl::StrCat("parameter servers not reachable after ", absl::FormatDuration(timeout),
                         ": fake ps ", k, ": connection refused"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status Init(const proto::TrainingConfig& config, const std::vector<Tensor>& params,
                    int64_t recovery_epoch) override {
    for (Shard& s : shards_) {
      if (!s.initialized) {
        s.values = Copy(params);
        s.version = 0;
        s.config = config;
        s.initialized = true;
      }
      s.ready = true;
      s.recovery_epoch = std::max(s.recovery_epoch, recovery_epoch);
    }
    run_ids_.push_back(config.run_id());
    return absl::OkStatus();
  }

  absl::StatusOr<proto::TrainingConfig> WaitForModelReady(absl::Duration) override {
    if (training_done_) return absl::CancelledError("the chief has ended training");
    for (int k = 0; k < num_shards(); ++k) {
      if (!shards_[k].ready) {
        return absl::DeadlineExceededError(absl::StrCat(ShardName(k), " is not ready"));
      }
    }
    return shards_[0].config;
  }

  absl::StatusOr<PullResult> Pull(int64_t min_version, std::vector<Tensor>* params,
                                  bool moving_average, int64_t, Precision,
                                  const ShardHooks* hooks) override {
    RETURN_IF_ERROR(CheckShards());
    PullResult result;
    result.version = shards_[0].version;
    for (const Shard& s : shards_) result.version = std::min(result.version, s.version);
    if (result.version < min_version && !training_done_) {
      return absl::DeadlineExceededError(absl::StrCat(
          "version ", min_version, " would never come (the shards are at ", result.version, ")"));
    }
    for (const VariableSlice& slice : placement_.slices) {
      // No moving averages kept: the fake returns the values for both.
      (void)moving_average;
      std::memcpy(Bytes(&(*params)[slice.variable], slice),
                  Bytes(&shards_[slice.shard].values[slice.variable], slice), slice.num_bytes);
    }
    for (int k = 0; k < num_shards(); ++k) {
      pulled_[k] = shards_[k].version;
      if (hooks != nullptr && hooks->arrived) hooks->arrived(k);
    }
    result.training_done = training_done_;
    return result;
  }

  absl::StatusOr<PushResult> Push(const std::vector<Tensor>& grads,
                                  const ShardHooks* hooks) override {
    RETURN_IF_ERROR(CheckShards());
    ++pushes_;
    PushResult result;
    result.training_done = training_done_;
    std::vector<int> order = hooks != nullptr ? hooks->order : std::vector<int>();
    if (order.empty()) {
      for (int k = 0; k < num_shards(); ++k) order.push_back(k);
    }
    for (int k : order) {
      if (hooks != nullptr && hooks->wait_until_ready) RETURN_IF_ERROR(hooks->wait_until_ready(k));
      Shard& s = shards_[k];
      if (pulled_[k] != s.version) {  // Tagged with an older version: stale.
        result.accepted = false;
        continue;
      }
      const float lr = s.config.learning_rate();
      for (int i : placement_.shard_slices[k]) {
        const VariableSlice& slice = placement_.slices[i];
        float* w = reinterpret_cast<float*>(Bytes(&s.values[slice.variable], slice));
        const float* g = reinterpret_cast<const float*>(
            Bytes(&const_cast<Tensor&>(grads[slice.variable]), slice));
        for (int64_t j = 0; j < slice.num_bytes / 4; ++j) w[j] -= lr * g[j];
      }
      ++s.version;
    }
    auto action = on_version_.find(shards_[0].version);
    if (action != on_version_.end()) {
      auto run = std::move(action->second);
      on_version_.erase(action);
      run();
    }
    return result;
  }

  absl::Status Shutdown() override {
    ++shutdowns_;
    training_done_ = true;
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<proto::StatusResponse>> GetStatus() override {
    std::vector<proto::StatusResponse> statuses;
    for (const Shard& s : shards_) {
      proto::StatusResponse& r = statuses.emplace_back();
      r.set_initialized(s.initialized);
      r.set_ready(s.ready);
      r.set_version(s.version);
      r.set_incarnation(s.incarnation);
      r.set_training_done(training_done_);
      r.set_restored_step(s.restored_step);
      r.set_has_checkpoint_dir(s.has_checkpoint_dir);
      r.set_recovery_epoch(s.recovery_epoch);
      if (s.initialized) *r.mutable_config() = s.config;
      for (auto it = s.checkpoints.rbegin(); it != s.checkpoints.rend(); ++it) {
        r.add_checkpoint_steps(it->first);
      }
    }
    return statuses;
  }

  absl::Status Save(int64_t step, int64_t version, int keep, int64_t keep_step) override {
    if (failing_saves_ > 0) {
      --failing_saves_;
      return save_error_;
    }
    for (int k = 0; k < num_shards(); ++k) {
      const Shard& s = shards_[k];
      if (!s.ready || !s.has_checkpoint_dir || (version >= 0 && s.version != version)) {
        return absl::FailedPreconditionError(
            absl::StrCat(ShardName(k), " cannot save checkpoint ", step));
      }
    }
    for (Shard& s : shards_) {
      s.checkpoints[step] = {s.version, Copy(s.values), s.config};
      // Keeps the `keep` newest and keep_step.
      int kept = 0;
      for (auto it = s.checkpoints.rbegin(); it != s.checkpoints.rend();) {
        if (it->first == keep_step || ++kept <= keep) {
          ++it;
        } else {
          it = std::make_reverse_iterator(s.checkpoints.erase(std::next(it).base()));
        }
      }
    }
    saves_.push_back(step);
    return absl::OkStatus();
  }

  absl::Status Restore(int64_t step, int64_t recovery_epoch) override {
    for (int k = 0; k < num_shards(); ++k) {
      if (shards_[k].checkpoints.count(step) == 0) {
        return absl::NotFoundError(absl::StrCat(ShardName(k), " has no checkpoint ", step));
      }
    }
    for (Shard& s : shards_) {
      s.incarnation = next_incarnation_++;
      s.recovery_epoch = recovery_epoch;
      Load(&s, step);
    }
    restores_.push_back(step);
    return absl::OkStatus();
  }

  void ForgetIncarnations() override { std::fill(known_.begin(), known_.end(), 0); }
  const Placement& placement() const override { return placement_; }
  proto::DataType wire_dtype() const override { return proto::DT_FLOAT; }
  std::string ShardName(int shard) const override { return absl::StrCat("fake ps ", shard); }

 private:
  struct Checkpoint {
    int64_t version = 0;
    std::vector<Tensor> values;
    proto::TrainingConfig config;
  };
  struct Shard {
    bool initialized = false;
    bool ready = false;
    int64_t version = 0;
    int64_t incarnation = 0;
    int64_t restored_step = -1;
    int64_t recovery_epoch = 0;
    bool has_checkpoint_dir = true;
    bool stopped = false;  // StopShard.
    proto::TrainingConfig config;
    std::vector<Tensor> values;  // Every variable; the shard's slices count.
    std::map<int64_t, Checkpoint> checkpoints;
  };

  static std::vector<Tensor> Copy(const std::vector<Tensor>& tensors) {
    std::vector<Tensor> copy;
    for (const Tensor& t : tensors) copy.push_back(t.Clone());
    return copy;
  }
  static char* Bytes(Tensor* t, const VariableSlice& slice) {
    return reinterpret_cast<char*>(t->data()) + slice.byte_offset;
  }
  static void Load(Shard* s, int64_t step) {
    const Checkpoint& c = s->checkpoints.at(step);
    s->version = c.version;
    s->values = Copy(c.values);
    s->config = c.config;
    s->initialized = true;
    s->ready = false;
    s->restored_step = step;
  }
  // Aborted, as PsClient::CheckIncarnations, when a shard's incarnation is
  // not the one this client saw last; FailedPrecondition from a shard with
  // no model.
  absl::Status CheckShards() {
    absl::Status status;
    for (int k = 0; k < num_shards(); ++k) {
      const int64_t answered = shards_[k].incarnation;
      if (known_[k] != 0 && known_[k] != answered && status.ok()) {
        status = absl::AbortedError(absl::StrCat(ShardName(k),
                                                 " restarted or was rolled back (new "
                                                 "incarnation ", answered, "); pull again"));
      }
      known_[k] = answered;
    }
    if (!status.ok()) return status;
    for (int k = 0; k < num_shards(); ++k) {
      if (!shards_[k].initialized) {
        return absl::FailedPreconditionError(absl::StrCat(ShardName(k), " is not initialized"));
      }
    }
    return absl::OkStatus();
  }

  std::vector<VariableDef> variables_;
  Placement placement_;
  std::vector<Shard> shards_;
  std::vector<int64_t> known_;   // Incarnations this client saw last; 0: any.
  std::vector<int64_t> pulled_;  // Per shard, the version last pulled.
  int64_t next_incarnation_ = 1;
  bool training_done_ = false;
  std::map<int64_t, std::function<void()>> on_version_;
  int failing_saves_ = 0;
  absl::Status save_error_;
  std::vector<int64_t> saves_;
  std::vector<int64_t> restores_;
  std::vector<std::string> run_ids_;
  absl::Duration last_server_wait_;
  int pushes_ = 0;
  int shutdowns_ = 0;
};

}  // namespace psrt

#endif  // PSRT_TESTS_WORKER_FAKE_PARAMETER_STORE_H_
