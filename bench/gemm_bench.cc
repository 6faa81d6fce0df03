// gemm_bench: GFLOP/s of every CPU GEMM path (gemm.h) on the GEMM shapes of
// LeNet's training step at batch 100, and on the batch-reduce GEMMs of its
// direct convolution, in one run:
//
//   build/bin/gemm_bench [--threads=2] [--min_seconds=0.2]
//
// Per shape and path it prints the single-thread rate (GemmOnCallingThread,
// timed in thread CPU time, so that other processes on a shared machine
// distort it little) and the rate of Gemm on a --threads context (wall
// time). The conv shapes are what one thread multiplies per im2col chunk.
#include <time.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gflags/gflags.h"
#include "kernels/cpu_context.h"
#include "kernels/gemm.h"

DEFINE_int32(threads, 2, "Threads of the context for the parallel Gemm.");
DEFINE_double(min_seconds, 0.2, "Minimum time per measurement.");

namespace psrt {
namespace kernels {
namespace {

struct Case {
  const char* name;
  MatMulShape shape;
  float beta;
};

// LeNet at batch 100: its convolutions' GEMMs as the im2col method (the
// portable path's) runs them per chunk of images on one thread (conv.cc's
// plan: 13 images of conv1, 1 of conv2), its fully connected layer's whole;
// then a square GEMM, and one register tile's work with everything in L1
// (the micro-kernel's own peak).
const Case kCases[] = {
    {"conv1 fwd", {10192, 32, 25, false, true}, 0.0f},
    {"conv1 dfilter", {25, 32, 10192, true, false}, 1.0f},
    {"conv2 fwd", {196, 64, 800, false, true}, 0.0f},
    {"conv2 dfilter", {800, 64, 196, true, false}, 1.0f},
    {"conv2 dcols", {196, 800, 64, false, false}, 0.0f},
    {"fc1 fwd", {100, 512, 3136, false, false}, 0.0f},
    {"fc1 dx", {100, 3136, 512, false, true}, 0.0f},
    {"fc1 dw", {3136, 512, 100, true, false}, 0.0f},
    {"square 512", {512, 512, 512, false, false}, 0.0f},
    {"tile in L1", {12, 32, 256, false, false}, 0.0f},
};

double ThreadCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}
double WallSeconds() { return absl::ToUnixNanos(absl::Now()) * 1e-9; }

// GFLOP/s of fn, repeated until it has run for min_seconds by `clock`
// (read between doubling batches of calls: reading the thread CPU clock is
// a system call, too slow to time a small GEMM call by call).
template <class Fn>
double Rate(double flops, double (*clock)(), Fn&& fn) {
  fn();  // Warm-up: sizes the packing buffers and faults in the pages.
  int64_t reps = 0;
  const double start = clock();
  double elapsed = 0;
  for (int64_t batch = 1; elapsed < FLAGS_min_seconds; batch *= 2) {
    for (int64_t i = 0; i < batch; ++i) fn();
    reps += batch;
    elapsed = clock() - start;
  }
  return flops * reps / elapsed * 1e-9;
}

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

void Run() {
  CpuContext ctx(FLAGS_threads);
  std::printf("%-14s %5s %5s %5s %2s%2s | %-22s | %-22s\n", "shape", "m", "n",
              "k", "ta", "tb", "1 thread GFLOP/s", "parallel GFLOP/s");
  std::printf("%-14s %5s %5s %5s %2s%2s | %10s %11s | %10s %11s\n", "", "", "",
              "", "", "", "eigen", "avx512", "eigen", "avx512");
  for (const Case& test : kCases) {
    const MatMulShape& s = test.shape;
    const std::vector<float> a = Random(s.m * s.k, 1), b = Random(s.k * s.n, 2);
    std::vector<float> c(s.m * s.n, 0.0f);
    const double flops = 2.0 * s.m * s.n * s.k;
    double single[2] = {0, 0}, parallel[2] = {0, 0};
    const GemmPath paths[2] = {GemmPath::kPortable, GemmPath::kAvx512};
    for (int i = 0; i < 2; ++i) {
      if (!GemmPathSupported(paths[i])) continue;
      single[i] = Rate(flops, ThreadCpuSeconds, [&] {
        GemmOnCallingThreadOnPath(paths[i], s, 1.0f, a.data(), b.data(),
                                  test.beta, c.data());
      });
      parallel[i] = Rate(flops, WallSeconds, [&] {
        GemmOnPath(paths[i], ctx, s, 1.0f, a.data(), b.data(), test.beta,
                   c.data());
      });
    }
    std::printf("%-14s %5ld %5ld %5ld %2d%2d | %10.1f %11.1f | %10.1f %11.1f\n",
                test.name, long(s.m), long(s.n), long(s.k), s.transpose_a,
                s.transpose_b, single[0], single[1], parallel[0], parallel[1]);
  }
  // The direct convolution's batch-reduce GEMMs (conv_direct.cc) for one
  // output row of LeNet's second layer (a 14x14x32 image padded to 18x18,
  // 5x5 filter, 64 outputs), on the calling thread.
  std::printf("%-20s %-17s | %10s %11s\n", "direct conv2", "m x n, terms",
              "eigen", "avx512");
  const std::vector<float> padded = Random(18 * 18 * 32, 3);
  const std::vector<float> filter = Random(5 * 5 * 32 * 64, 4);
  const std::vector<float> dy = Random(14 * 14 * 64, 5);
  std::vector<float> out(160 * 64);
  struct BatchCase {
    const char* name;
    const char* dims;
    BatchReduceGemm gemm;
    std::vector<GemmTerm> terms;
  };
  BatchCase batch_cases[3] = {
      {"fwd row", "14x64, 5 x k160",
       {14, 64, false, false, nullptr, 5, 32, 64, 1.0f, 0.0f, out.data(), 64},
       {}},
      {"dfilter kh", "160x64, 14 x k14",
       {160, 64, true, false, nullptr, 14, 32, 64, 1.0f, 1.0f, out.data(), 64},
       {}},
      {"dx row", "14x32, 5 x k320",
       {14, 32, false, false, nullptr, 5, 64, 32, 1.0f, 0.0f, out.data(), 32},
       {}},
  };
  for (int64_t kh = 0; kh < 5; ++kh) {
    batch_cases[0].terms.push_back(
        {padded.data() + kh * 18 * 32, filter.data() + kh * 160 * 64, 160});
    // dx reads a padded dy (18x18x64) by a [5, 5, 64, 32] filter: reuse
    // the buffers, which are large enough.
    batch_cases[2].terms.push_back(
        {filter.data() + kh * 18 * 64, filter.data() + kh * 320 * 32, 320});
  }
  for (int64_t oh = 0; oh < 14; ++oh) {
    batch_cases[1].terms.push_back(
        {padded.data() + oh * 18 * 32, dy.data() + oh * 14 * 64, 14});
  }
  for (BatchCase& test : batch_cases) {
    test.gemm.terms = test.terms.data();
    double flops = 0;
    for (const GemmTerm& term : test.terms) {
      flops += 2.0 * test.gemm.m * test.gemm.n * term.k;
    }
    double rate[2] = {0, 0};
    const GemmPath paths[2] = {GemmPath::kPortable, GemmPath::kAvx512};
    for (int i = 0; i < 2; ++i) {
      if (!GemmPathSupported(paths[i])) continue;
      rate[i] = Rate(flops, ThreadCpuSeconds,
                     [&] { BatchReduceGemmOnPath(paths[i], test.gemm); });
    }
    std::printf("%-20s %-17s | %10.1f %11.1f\n", test.name, test.dims,
                rate[0], rate[1]);
  }
}

}  // namespace
}  // namespace kernels
}  // namespace psrt

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  psrt::kernels::Run();
  return 0;
}
