// CpuContext: the CPU device context that every CPU op takes explicitly.
//
// It owns a pool of num_threads() - 1 worker threads; ParallelFor splits a
// range over them and the calling thread, and returns when all of it is done.
// There is no global pool and no global mode: a model (or a test) creates
// the context it wants and passes it to each op.
//
// Thread safety: ParallelFor may be called from several threads at once (the
// calls share the pool). REQUIRES: `fn` does not itself call ParallelFor on
// the same context (a nested call could wait on its own pool).
#ifndef PSRT_KERNELS_CPU_CONTEXT_H_
#define PSRT_KERNELS_CPU_CONTEXT_H_

#include <cstdint>
#include <memory>

#include "absl/functional/function_ref.h"

namespace psrt {
namespace kernels {

class CpuContext {
 public:
  // num_threads <= 0 means one per core the process may use
  // (common/cpu_budget.h: its affinity mask and cgroup CPU limit); 1 runs
  // everything on the calling thread. With `spin`, idle pool threads spin a while before they
  // sleep: right for a model's back-to-back ops, wrong for a pool that is
  // idle most of the time on cores other work needs (the parameter server's,
  // the PS client's copies), where spinning steals those cores.
  explicit CpuContext(int num_threads = 0, bool spin = true);
  ~CpuContext();
  CpuContext(const CpuContext&) = delete;
  CpuContext& operator=(const CpuContext&) = delete;

  // Threads that work on a ParallelFor, the calling thread included.
  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) on contiguous blocks that cover [0, n) exactly once,
  // the first on the calling thread. There are at most
  // max(1, min(num_threads(), n / grain)) blocks, and every block but the
  // last holds a multiple of `grain` indices; so a range of fewer than
  // 2 * grain indices runs in one call on the calling thread.
  // REQUIRES: n >= 0, grain >= 1.
  void ParallelFor(int64_t n, int64_t grain,
                   absl::FunctionRef<void(int64_t, int64_t)> fn) const;

 private:
  struct Pool;  // Eigen's thread pool, kept out of this header.
  int num_threads_;
  std::unique_ptr<Pool> pool_;  // Null when num_threads_ == 1.
};

}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_CPU_CONTEXT_H_
