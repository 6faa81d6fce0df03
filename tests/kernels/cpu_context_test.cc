#include "kernels/cpu_context.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "common/cpu_budget.h"
#include "gtest/gtest.h"

namespace psrt {
namespace kernels {
namespace {

TEST(CpuContextTest, DefaultUsesTheCoresTheProcessMayUse) {
  EXPECT_EQ(CpuContext().num_threads(), ProcessCpuBudget().cores);
  // Bound to one CPU (as taskset, Slurm or mpirun bind a task), the default
  // context runs on the calling thread alone.
  cpu_set_t all, one;
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  int first = 0;
  while (!CPU_ISSET(first, &all)) ++first;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  const int bound_threads = CpuContext().num_threads();
  ASSERT_EQ(sched_setaffinity(0, sizeof(all), &all), 0);
  EXPECT_EQ(bound_threads, 1);
}

TEST(CpuContextTest, ParallelForCoversRangeOnceInGrainBlocks) {
  for (int threads : {1, 2, 3, 8}) {
    CpuContext ctx(threads);
    for (const auto& [n, grain] : {std::pair<int64_t, int64_t>{0, 1},
                                   {1, 1},
                                   {7, 1},
                                   {100, 1},
                                   {100, 32},
                                   {1000, 7},
                                   {63, 64},
                                   {129, 64}}) {
      std::vector<std::atomic<int>> hits(n);
      std::mutex mu;
      std::vector<std::pair<int64_t, int64_t>> blocks;
      ctx.ParallelFor(n, grain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) hits[i]++;
        std::lock_guard<std::mutex> lock(mu);
        blocks.emplace_back(begin, end);
      });
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " index " << i;
      }
      EXPECT_LE(static_cast<int64_t>(blocks.size()),
                std::max<int64_t>(1, std::min<int64_t>(threads, n / grain)));
      std::sort(blocks.begin(), blocks.end());
      for (size_t b = 0; b + 1 < blocks.size(); ++b) {
        EXPECT_EQ(blocks[b].first % grain, 0);
        EXPECT_EQ((blocks[b].second - blocks[b].first) % grain, 0)
            << "n=" << n << " grain=" << grain;
      }
    }
  }
}

TEST(CpuContextTest, SmallRangeRunsOnCallingThread) {
  CpuContext ctx(4);
  std::thread::id ran_on;
  ctx.ParallelFor(
      10, 8, [&](int64_t, int64_t) { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, std::this_thread::get_id());
}

TEST(CpuContextTest, LargeRangeUsesSeveralThreads) {
  CpuContext ctx(3);
  std::mutex mu;
  std::set<std::thread::id> ids;
  ctx.ParallelFor(300, 1, [&](int64_t, int64_t) {
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  // The calling thread runs one block and the pool the others (perhaps all
  // on one of its threads).
  EXPECT_GE(ids.size(), 2u);
}

TEST(CpuContextTest, ConcurrentCallersShareThePool) {
  CpuContext ctx(2);
  std::atomic<int64_t> total{0};
  auto work = [&] {
    for (int i = 0; i < 200; ++i) {
      ctx.ParallelFor(
          64, 1, [&](int64_t begin, int64_t end) { total += end - begin; });
    }
  };
  std::thread t1(work), t2(work);
  t1.join();
  t2.join();
  EXPECT_EQ(total.load(), 2 * 200 * 64);
}

}  // namespace
}  // namespace kernels
}  // namespace psrt
