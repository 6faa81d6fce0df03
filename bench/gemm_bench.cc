// gemm_bench: GFLOP/s of every CPU GEMM path (gemm.h) on the GEMM shapes of
// LeNet's training step at batch 100, of Inception-v3's large convolutions
// (1x7/7x1, 3x3 stride 2, 1x1 with 2048 channels) and of ResNet-50's 1x1
// ones, and on the batch-reduce GEMMs of LeNet's direct convolution, in
// one run:
//
//   build/bin/gemm_bench [--threads=2] [--min_seconds=0.2] [--runs=1]
//                        [--shapes=SUBSTRING]
//
// --runs=N prints each rate as the median of N measurements (the machine is
// shared and noisy); --shapes keeps the shapes, direct-convolution rows and
// convolution layers whose names contain it (to time one kernel's change,
// alternate the binaries before and after it on the same shapes).
//
// Per shape and path (eigen, avx512, avx2; a path this CPU lacks prints 0)
// it prints the single-thread rate (GemmOnCallingThread, timed in thread
// CPU time, so that other processes on a shared machine distort it little)
// and the rate of Gemm on a --threads context (wall time). The conv shapes
// are what one thread multiplies per im2col chunk. Last, per blocked path,
// one thread's FMA peak, measured here by a loop of independent FMAs, and
// the share of it that the large GEMMs reach:
//   gemm_peak: path=P peak_gflops=X square512=Y fc1_fwd=Z ... fraction_min=F
// and, before them, LeNet's and ResNet-50's convolutions by the direct and
// the Winograd method (ConvLayerRates: conv_layer: lines).
#include <time.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "gflags/gflags.h"
#include "kernels/conv_direct.h"
#include "kernels/conv_winograd.h"
#include "kernels/cpu_context.h"
#include "kernels/gemm.h"

DEFINE_int32(threads, 2, "Threads of the context for the parallel Gemm.");
DEFINE_double(min_seconds, 0.2, "Minimum time per measurement.");
DEFINE_int32(runs, 1, "Measurements per rate; the median is printed.");
DEFINE_string(shapes, "",
              "Only the shapes (GEMMs, direct-convolution rows, convolution layers) whose "
              "names contain this; all when empty.");

namespace psrt {
namespace kernels {
namespace {

struct Case {
  const char* name;
  MatMulShape shape;
  float beta;
  bool large = false;  // Counts toward gemm_peak's fraction.
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
    {"fc1 fwd", {100, 512, 3136, false, false}, 0.0f, true},
    {"fc1 dx", {100, 3136, 512, false, true}, 0.0f, true},
    {"fc1 dw", {3136, 512, 100, true, false}, 0.0f, true},
    {"square 512", {512, 512, 512, false, false}, 0.0f, true},
    // Inception-v3 at batch 32 (299x299), whole layers as im2col GEMMs: a
    // 1x7 (or 7x1) 192 -> 192 at 17x17, Mixed_6a's 3x3 stride 2 288 -> 384
    // to 17x17 and its filter gradient, Mixed_7c's 1x1 2048 -> 320 at 8x8.
    {"v3 1x7 fwd", {9248, 192, 1344, false, true}, 0.0f, true},
    {"v3 3x3s2 fwd", {9248, 384, 2592, false, true}, 0.0f, true},
    {"v3 3x3s2 dw", {2592, 384, 9248, true, false}, 1.0f, true},
    {"v3 1x1 2048", {2048, 320, 2048, false, true}, 0.0f, true},
    // ResNet-50 at batch 16 (224x224): its 1x1 convolutions (the largest
    // share of its step), whole, as pointwise layers run them (conv.cc):
    // 64 -> 256 at 56x56 forward, its dx and its filter gradient, and
    // 1024 -> 256 at 14x14's filter gradient.
    {"r50 1x1 fwd", {50176, 256, 64, false, false}, 0.0f, true},
    {"r50 1x1 dx", {50176, 64, 256, false, true}, 0.0f, true},
    {"r50 1x1 dw", {64, 256, 50176, true, false}, 0.0f, true},
    {"r50 1x1 dw 14", {1024, 256, 3136, true, false}, 0.0f, true},
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
// a system call, too slow to time a small GEMM call by call); the median of
// --runs such measurements.
template <class Fn>
double Rate(double flops, double (*clock)(), Fn&& fn) {
  fn();  // Warm-up: sizes the packing buffers and faults in the pages.
  std::vector<double> rates;
  for (int run = 0; run < std::max(1, FLAGS_runs); ++run) {
    int64_t reps = 0;
    const double start = clock();
    double elapsed = 0;
    for (int64_t batch = 1; elapsed < FLAGS_min_seconds; batch *= 2) {
      for (int64_t i = 0; i < batch; ++i) fn();
      reps += batch;
      elapsed = clock() - start;
    }
    rates.push_back(flops * reps / elapsed * 1e-9);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

// Whether --shapes keeps the shape, row or layer `name`.
bool Selected(const char* name) {
  return FLAGS_shapes.empty() || std::string(name).find(FLAGS_shapes) != std::string::npos;
}

// One thread's peak: 12 independent FMA chains in named registers (enough
// to cover the FMA latency on two ports), 2 * lanes flops per FMA.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx512f"))) double Avx512FmaSeconds(int64_t rounds) {
  __m512 a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11;
  a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = a8 = a9 = a10 = a11 = _mm512_set1_ps(1.0f);
  const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
  const double start = ThreadCpuSeconds();
  for (int64_t r = 0; r < rounds; ++r) {
    a0 = _mm512_fmadd_ps(a0, x, y); a1 = _mm512_fmadd_ps(a1, x, y);
    a2 = _mm512_fmadd_ps(a2, x, y); a3 = _mm512_fmadd_ps(a3, x, y);
    a4 = _mm512_fmadd_ps(a4, x, y); a5 = _mm512_fmadd_ps(a5, x, y);
    a6 = _mm512_fmadd_ps(a6, x, y); a7 = _mm512_fmadd_ps(a7, x, y);
    a8 = _mm512_fmadd_ps(a8, x, y); a9 = _mm512_fmadd_ps(a9, x, y);
    a10 = _mm512_fmadd_ps(a10, x, y); a11 = _mm512_fmadd_ps(a11, x, y);
    asm volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6),
                 "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
  }
  return ThreadCpuSeconds() - start;
}
__attribute__((target("avx2,fma"))) double Avx2FmaSeconds(int64_t rounds) {
  __m256 a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11;
  a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = a8 = a9 = a10 = a11 = _mm256_set1_ps(1.0f);
  const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
  const double start = ThreadCpuSeconds();
  for (int64_t r = 0; r < rounds; ++r) {
    a0 = _mm256_fmadd_ps(a0, x, y); a1 = _mm256_fmadd_ps(a1, x, y);
    a2 = _mm256_fmadd_ps(a2, x, y); a3 = _mm256_fmadd_ps(a3, x, y);
    a4 = _mm256_fmadd_ps(a4, x, y); a5 = _mm256_fmadd_ps(a5, x, y);
    a6 = _mm256_fmadd_ps(a6, x, y); a7 = _mm256_fmadd_ps(a7, x, y);
    a8 = _mm256_fmadd_ps(a8, x, y); a9 = _mm256_fmadd_ps(a9, x, y);
    a10 = _mm256_fmadd_ps(a10, x, y); a11 = _mm256_fmadd_ps(a11, x, y);
    asm volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6),
                 "+x"(a7), "+x"(a8), "+x"(a9), "+x"(a10), "+x"(a11));
  }
  return ThreadCpuSeconds() - start;
}
#endif

// GFLOP/s of one thread's FMAs on `path`'s vectors (0 on other paths).
double PeakGflops(GemmPath path) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (path != GemmPath::kAvx512 && path != GemmPath::kAvx2) return 0;
  const int lanes = path == GemmPath::kAvx512 ? 16 : 8;
  auto seconds = [&](int64_t rounds) {
    return path == GemmPath::kAvx512 ? Avx512FmaSeconds(rounds) : Avx2FmaSeconds(rounds);
  };
  int64_t rounds = 1 << 16;
  double elapsed = seconds(rounds);
  while (elapsed < FLAGS_min_seconds) {
    rounds *= 2;
    elapsed = seconds(rounds);
  }
  return 2.0 * lanes * 12 * rounds / elapsed * 1e-9;
#else
  return 0;
#endif
}

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// Convolutions by the direct method and by Winograd's (F(4x4, 5x5) or
// F(4x4, 3x3)), one thread, per blocked path: LeNet's second layer at batch
// 100 (14x14x32 -> 64, 5x5, SAME) and ResNet-50's 3x3 layers at 224x224
// (batch 8). Milliseconds of thread CPU time for the forward and for the
// backward (dx and the filter gradient, with the filter's transforms), and
// whether WinogradConvApplies takes the layer:
//   conv_layer: layer=L path=P fwd_direct_ms=A fwd_winograd_ms=B fwd_ratio=A/B
//               bwd_direct_ms=C bwd_winograd_ms=D bwd_ratio=C/D winograd=yes|no
struct ConvLayer {
  const char* name;
  Conv2DShape shape;
};
const ConvLayer kConvLayers[] = {
    {"lenet_conv2", {100, 14, 14, 32, 5, 5, 64, 1, 1, Padding::kSame}},
    {"resnet50_56x56x64", {8, 56, 56, 64, 3, 3, 64, 1, 1, Padding::kSame}},
    {"resnet50_28x28x128", {8, 28, 28, 128, 3, 3, 128, 1, 1, Padding::kSame}},
    {"resnet50_14x14x256", {8, 14, 14, 256, 3, 3, 256, 1, 1, Padding::kSame}},
    {"resnet50_7x7x512", {8, 7, 7, 512, 3, 3, 512, 1, 1, Padding::kSame}},
};

void ConvLayerRates() {
  for (const ConvLayer& layer : kConvLayers) {
    if (!Selected(layer.name)) continue;
    const Conv2DShape& s = layer.shape;
    const std::vector<float> x = Random(s.input_size(), 6);
    const std::vector<float> filter = Random(s.filter_size(), 7);
    const std::vector<float> dy = Random(s.output_size(), 8);
    std::vector<float> y(s.output_size()), dx(s.input_size()), dfilter(s.filter_size());
    std::vector<float> flipped(s.filter_size());
    std::vector<float> points(internal::WinogradFilterFloats(s));
    std::vector<float> flipped_points(points.size()), dfilter_points(points.size());
    std::vector<float> transform_scratch(internal::WinogradFilterScratch(s));
    std::vector<float> scratch(std::max(
        {internal::DirectConvForwardScratch(s), internal::DirectConvBackwardScratch(s),
         internal::WinogradForwardScratch(s), internal::WinogradBackwardScratch(s)}));
    // Milliseconds per call of fn (Rate's GFLOP/s of one "flop" per call).
    auto ms = [](auto&& fn) { return 1e3 / (Rate(1e9, ThreadCpuSeconds, fn)); };
    for (GemmPath path : {GemmPath::kAvx512, GemmPath::kAvx2}) {
      if (!GemmPathSupported(path)) continue;
      const double fwd_direct = ms([&] {
        internal::DirectConvForward(path, s, x.data(), filter.data(), 0, s.batch,
                                    scratch.data(), y.data());
      });
      const double fwd_winograd = ms([&] {
        internal::WinogradTransformFilter(s, filter.data(), transform_scratch.data(),
                                          points.data());
        internal::WinogradConvForward(path, s, x.data(), points.data(), 0, s.batch,
                                      scratch.data(), y.data());
      });
      const double bwd_direct = ms([&] {
        internal::FlipFilter(s, filter.data(), flipped.data());
        std::fill(dfilter.begin(), dfilter.end(), 0.0f);
        internal::DirectConvBackward(path, s, x.data(), flipped.data(), dy.data(), 0,
                                     s.batch, scratch.data(), dx.data(), dfilter.data());
      });
      const double bwd_winograd = ms([&] {
        internal::FlipFilter(s, filter.data(), flipped.data());
        internal::WinogradTransformFilter(s, flipped.data(), transform_scratch.data(),
                                          flipped_points.data());
        std::fill(dfilter_points.begin(), dfilter_points.end(), 0.0f);
        internal::WinogradConvBackward(path, s, x.data(), flipped_points.data(), dy.data(),
                                       0, s.batch, scratch.data(), dx.data(),
                                       dfilter_points.data());
        internal::WinogradFilterGradient(s, dfilter_points.data(), transform_scratch.data(),
                                         dfilter.data());
      });
      std::printf(
          "conv_layer: layer=%s path=%s fwd_direct_ms=%.2f fwd_winograd_ms=%.2f "
          "fwd_ratio=%.2f bwd_direct_ms=%.2f bwd_winograd_ms=%.2f bwd_ratio=%.2f "
          "winograd=%s\n",
          layer.name, GemmPathName(path), fwd_direct, fwd_winograd, fwd_direct / fwd_winograd,
          bwd_direct, bwd_winograd, bwd_direct / bwd_winograd,
          internal::WinogradConvApplies(path, s) ? "yes" : "no");
      std::fflush(stdout);
    }
  }
}

constexpr int kPaths = 3;
const GemmPath kAllPaths[kPaths] = {GemmPath::kPortable, GemmPath::kAvx512, GemmPath::kAvx2};

void Run() {
  CpuContext ctx(FLAGS_threads);
  std::printf("%-14s %5s %5s %5s %2s%2s | %-28s | %-28s\n", "shape", "m", "n", "k", "ta", "tb",
              "1 thread GFLOP/s", "parallel GFLOP/s");
  std::printf("%-14s %5s %5s %5s %2s%2s | %8s %8s %8s | %8s %8s %8s\n", "", "", "", "", "", "",
              "eigen", "avx512", "avx2", "eigen", "avx512", "avx2");
  // Single-thread rates of the large GEMMs, per path, for gemm_peak.
  std::vector<std::pair<std::string, double>> large[kPaths];
  for (const Case& test : kCases) {
    if (!Selected(test.name)) continue;
    const MatMulShape& s = test.shape;
    const std::vector<float> a = Random(s.m * s.k, 1), b = Random(s.k * s.n, 2);
    std::vector<float> c(s.m * s.n, 0.0f);
    const double flops = 2.0 * s.m * s.n * s.k;
    double single[kPaths] = {}, parallel[kPaths] = {};
    for (int i = 0; i < kPaths; ++i) {
      if (!GemmPathSupported(kAllPaths[i])) continue;
      single[i] = Rate(flops, ThreadCpuSeconds, [&] {
        GemmOnCallingThreadOnPath(kAllPaths[i], s, 1.0f, a.data(), b.data(), test.beta,
                                  c.data());
      });
      parallel[i] = Rate(flops, WallSeconds, [&] {
        GemmOnPath(kAllPaths[i], ctx, s, 1.0f, a.data(), b.data(), test.beta, c.data());
      });
      if (test.large) large[i].emplace_back(test.name, single[i]);
    }
    std::printf("%-14s %5ld %5ld %5ld %2d%2d | %8.1f %8.1f %8.1f | %8.1f %8.1f %8.1f\n",
                test.name, long(s.m), long(s.n), long(s.k), s.transpose_a, s.transpose_b,
                single[0], single[1], single[2], parallel[0], parallel[1], parallel[2]);
  }
  // The direct convolution's batch-reduce GEMMs (conv_direct.cc) for one
  // output row of LeNet's second layer (a 14x14x32 image padded to 18x18,
  // 5x5 filter, 64 outputs), on the calling thread.
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
  bool header = false;
  for (BatchCase& test : batch_cases) {
    if (!Selected(test.name)) continue;
    if (!header) {
      std::printf("%-20s %-17s | %8s %8s %8s\n", "direct conv2", "m x n, terms", "eigen",
                  "avx512", "avx2");
      header = true;
    }
    test.gemm.terms = test.terms.data();
    double flops = 0;
    for (const GemmTerm& term : test.terms) {
      flops += 2.0 * test.gemm.m * test.gemm.n * term.k;
    }
    double rate[kPaths] = {};
    for (int i = 0; i < kPaths; ++i) {
      if (!GemmPathSupported(kAllPaths[i])) continue;
      rate[i] = Rate(flops, ThreadCpuSeconds,
                     [&] { BatchReduceGemmOnPath(kAllPaths[i], test.gemm); });
    }
    std::printf("%-20s %-17s | %8.1f %8.1f %8.1f\n", test.name, test.dims, rate[0], rate[1],
                rate[2]);
  }
  ConvLayerRates();
  for (int i = 1; i < kPaths; ++i) {
    if (!GemmPathSupported(kAllPaths[i])) continue;
    const double peak = PeakGflops(kAllPaths[i]);
    double fraction_min = 1e9;
    std::printf("gemm_peak: path=%s peak_gflops=%.1f", GemmPathName(kAllPaths[i]), peak);
    for (const auto& [name, rate] : large[i]) {
      std::string key = name;
      std::replace(key.begin(), key.end(), ' ', '_');
      std::printf(" %s=%.1f", key.c_str(), rate);
      fraction_min = std::min(fraction_min, rate / peak);
    }
    if (!large[i].empty()) std::printf(" fraction_min=%.2f", fraction_min);
    std::printf("\n");
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
