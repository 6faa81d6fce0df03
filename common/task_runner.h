// TaskRunner: a few threads of its own that run scheduled closures, first
// come first served. The ps runs its slow handlers (applying a push under the
// shard's lock, checkpoint I/O) there, so that gRPC's few callback threads
// stay free for health checks, status and pulls.
//
// Thread safety: Schedule may be called from any thread. The destructor runs
// what is queued, then joins the threads.
#ifndef PSRT_COMMON_TASK_RUNNER_H_
#define PSRT_COMMON_TASK_RUNNER_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace psrt {

class TaskRunner {
 public:
  // REQUIRES: threads >= 1.
  explicit TaskRunner(int threads);
  ~TaskRunner();
  TaskRunner(const TaskRunner&) = delete;
  TaskRunner& operator=(const TaskRunner&) = delete;

  void Schedule(std::function<void()> task);

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace psrt

#endif  // PSRT_COMMON_TASK_RUNNER_H_
