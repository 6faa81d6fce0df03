#include "common/task_runner.h"

#include <utility>

#include "glog/logging.h"

namespace psrt {

TaskRunner::TaskRunner(int threads) {
  CHECK_GE(threads, 1);
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

TaskRunner::~TaskRunner() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void TaskRunner::Schedule(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
}

void TaskRunner::Loop() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](TaskRunner* r) { return r->stopping_ || !r->queue_.empty(); }, this));
      if (queue_.empty()) return;  // Stopping, and nothing left to run.
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace psrt
