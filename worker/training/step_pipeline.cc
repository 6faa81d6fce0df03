#include "worker/training/step_pipeline.h"

#include <algorithm>
#include <numeric>

#include "glog/logging.h"

namespace psrt {

StepPipeline::StepPipeline(ParameterStore* client, const Placement& placement,
                           int num_variables)
    : client_(client),
      variable_shards_(num_variables),
      shard_variables_(placement.num_shards, 0) {
  std::vector<int> first_variable(placement.num_shards, num_variables);
  for (const VariableSlice& slice : placement.slices) {
    CHECK_LT(slice.variable, num_variables);
    std::vector<int>& shards = variable_shards_[slice.variable];
    if (std::find(shards.begin(), shards.end(), slice.shard) != shards.end()) continue;
    shards.push_back(slice.shard);
    ++shard_variables_[slice.shard];
    first_variable[slice.shard] = std::min(first_variable[slice.shard], slice.variable);
  }
  // A backward pass finishes a shard when it reaches the shard's first
  // variable: later first variables first.
  push_hooks_.order.resize(placement.num_shards);
  std::iota(push_hooks_.order.begin(), push_hooks_.order.end(), 0);
  std::stable_sort(push_hooks_.order.begin(), push_hooks_.order.end(),
                   [&](int a, int b) { return first_variable[a] > first_variable[b]; });
  push_hooks_.wait_until_ready = [this](int shard) {
    absl::MutexLock lock(&mu_);
    auto ready = [&] { return push_abandoned_ || shard_pending_[shard] == 0; };
    mu_.Await(absl::Condition(&ready));
    return push_abandoned_ ? absl::AbortedError("the step's push was abandoned: its "
                                                "gradients were never finished")
                           : absl::OkStatus();
  };
  pull_hooks_.arrived = [this](int shard) {
    absl::MutexLock lock(&mu_);
    arrived_[shard] = true;
  };
  absl::MutexLock lock(&mu_);
  arrived_.assign(placement.num_shards, false);
  variable_ready_.assign(num_variables, true);
  shard_pending_.assign(placement.num_shards, 0);
}

StepPipeline::~StepPipeline() {
  // A push still waiting for gradients must not hang the join below, nor
  // send gradients nobody finished.
  absl::MutexLock lock(&mu_);
  push_abandoned_ = true;
}

void StepPipeline::StartPull(int64_t min_version, std::vector<Tensor>* params,
                             int64_t min_clock) {
  {
    absl::MutexLock lock(&mu_);
    std::fill(arrived_.begin(), arrived_.end(), false);
    pull_result_.reset();
  }
  push_started_ = false;
  thread_.Schedule([this, min_version, params, min_clock] {
    absl::StatusOr<ParameterStore::PullResult> result =
        client_->Pull(min_version, params, /*moving_average=*/false, min_clock,
                      ParameterStore::Precision::kWire, &pull_hooks_);
    absl::MutexLock lock(&mu_);
    pull_result_ = std::move(result);
  });
}

void StepPipeline::WaitForVariables(int begin, int end) {
  const absl::Time start = absl::Now();
  absl::MutexLock lock(&mu_);
  auto arrived = [&] {
    if (pull_result_.has_value()) return true;
    for (int v = begin; v < end; ++v) {
      for (int shard : variable_shards_[v]) {
        if (!arrived_[shard]) return false;
      }
    }
    return true;
  };
  if (arrived()) return;
  mu_.Await(absl::Condition(&arrived));
  blocked_ += absl::Now() - start;
}

absl::StatusOr<ParameterStore::PullResult> StepPipeline::WaitForPull() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](std::optional<absl::StatusOr<ParameterStore::PullResult>>* result) {
        return result->has_value();
      },
      &pull_result_));
  return *pull_result_;
}

void StepPipeline::StartPush(const std::vector<Tensor>* grads) {
  {
    absl::MutexLock lock(&mu_);
    CHECK(pull_result_.has_value() && pull_result_->ok()) << "push before a pull";
    std::fill(variable_ready_.begin(), variable_ready_.end(), false);
    shard_pending_ = shard_variables_;
    push_abandoned_ = false;
    push_result_.reset();
  }
  push_started_ = true;
  thread_.Schedule([this, grads] {
    absl::StatusOr<ParameterStore::PushResult> result = client_->Push(*grads, &push_hooks_);
    absl::MutexLock lock(&mu_);
    push_result_ = std::move(result);
  });
}

void StepPipeline::MarkReady(int begin, int end) {
  absl::MutexLock lock(&mu_);
  for (int v = begin; v < end; ++v) {
    if (variable_ready_[v]) continue;
    variable_ready_[v] = true;
    for (int shard : variable_shards_[v]) --shard_pending_[shard];
  }
}

absl::StatusOr<ParameterStore::PushResult> StepPipeline::FinishPush() {
  CHECK(push_started_) << "FinishPush without StartPush";
  MarkReady(0, static_cast<int>(variable_shards_.size()));
  push_started_ = false;
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](std::optional<absl::StatusOr<ParameterStore::PushResult>>* result) {
        return result->has_value();
      },
      &push_result_));
  return *push_result_;
}

void StepPipeline::AbandonPush() {
  absl::MutexLock lock(&mu_);
  push_abandoned_ = true;
}

absl::Duration StepPipeline::TakeBlockedTime() {
  const absl::Duration blocked = blocked_;
  blocked_ = absl::ZeroDuration();
  return blocked;
}

}  // namespace psrt
