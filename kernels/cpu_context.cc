#include "kernels/cpu_context.h"

#include <algorithm>

#define EIGEN_USE_THREADS
#include "common/cpu_budget.h"
#include "glog/logging.h"
#include "unsupported/Eigen/CXX11/ThreadPool"

namespace psrt {
namespace kernels {

struct CpuContext::Pool {
  Pool(int threads, bool spin) : pool(threads, spin) {}
  Eigen::ThreadPool pool;
};

CpuContext::CpuContext(int num_threads, bool spin) {
  if (num_threads <= 0) {
    num_threads = ProcessCpuBudget().cores;
  }
  num_threads_ = num_threads;
  if (num_threads_ > 1) pool_ = std::make_unique<Pool>(num_threads_ - 1, spin);
}

CpuContext::~CpuContext() = default;

void CpuContext::ParallelFor(
    int64_t n, int64_t grain,
    absl::FunctionRef<void(int64_t, int64_t)> fn) const {
  CHECK_GE(n, 0);
  CHECK_GE(grain, 1);
  if (n == 0) return;
  // As many blocks as threads, but none smaller than grain; then round the
  // block size up to a multiple of grain, which may leave fewer blocks.
  const int64_t max_blocks =
      std::max<int64_t>(1, std::min<int64_t>(num_threads_, n / grain));
  const int64_t per_block = (n + max_blocks - 1) / max_blocks;
  const int64_t block = (per_block + grain - 1) / grain * grain;
  const int64_t num_blocks = (n + block - 1) / block;
  if (num_blocks == 1) {
    fn(0, n);
    return;
  }
  // What the scheduled closures share; each captures only a pointer to it
  // and its block index, small enough for std::function to store without
  // allocating.
  struct Shared {
    absl::FunctionRef<void(int64_t, int64_t)> fn;
    int64_t n;
    int64_t block;
    Eigen::Barrier done;
  } shared{fn, n, block, Eigen::Barrier(static_cast<unsigned>(num_blocks - 1))};
  for (int64_t b = 1; b < num_blocks; ++b) {
    Shared* s = &shared;
    pool_->pool.Schedule([s, b] {
      const int64_t begin = b * s->block;
      s->fn(begin, std::min(s->n, begin + s->block));
      s->done.Notify();
    });
  }
  fn(0, std::min(n, block));
  shared.done.Wait();
}

}  // namespace kernels
}  // namespace psrt
