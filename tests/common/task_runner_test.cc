#include "common/task_runner.h"

#include <atomic>
#include <memory>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace psrt {
namespace {

TEST(TaskRunnerTest, RunsEveryTask) {
  std::atomic<int> ran{0};
  absl::BlockingCounter done(1000);
  TaskRunner runner(3);
  for (int i = 0; i < 1000; ++i) {
    runner.Schedule([&] {
      ++ran;
      done.DecrementCount();
    });
  }
  done.Wait();
  EXPECT_EQ(ran.load(), 1000);
}

// A task that blocks does not hold up the others: they run on the other
// threads (the reason the ps has its own: a slow push must not starve the
// rest).
TEST(TaskRunnerTest, ABlockedTaskLeavesTheOtherThreadsWorking) {
  TaskRunner runner(2);
  absl::Notification release, second_ran;
  runner.Schedule([&] { release.WaitForNotification(); });
  runner.Schedule([&] { second_ran.Notify(); });
  second_ran.WaitForNotification();
  release.Notify();
}

// The destructor runs what is still queued, then joins.
TEST(TaskRunnerTest, DestructionRunsTheQueuedTasks) {
  std::atomic<int> ran{0};
  {
    TaskRunner runner(1);
    for (int i = 0; i < 100; ++i) runner.Schedule([&] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 100);
}

}  // namespace
}  // namespace psrt
