// step_bench: examples/sec of one model's forward + backward pass
// (Model::ComputeGradients) on random data, with no parameter server, so
// that the compute of a training step can be timed and profiled alone:
//
//   build/bin/step_bench --model=lenet --threads=2 --batch_size=100
//   perf record -g build/bin/step_bench --model=lenet --steps=200
//   build/bin/step_bench --device=gpu --model=inception_v3 --input_size=299 \
//       --input_channels=3 --num_classes=1000 --batch_size=32
//   build/bin/step_bench --model_file=MobileNetV2.json --batch_size=32
//
// On a GPU a step is what a GPU worker's is: the parameters copied to the
// device, forward and backward there, the gradients copied back.
//
// Prints the median over --runs runs of --steps steps each, after one
// warm-up run, in wall time and in process CPU time (the CPU-time figure is
// steadier on a shared machine; with spinning pool threads it also counts
// their spin).
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "absl/time/clock.h"
#include "bench/bench_util.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "common/file_system.h"
#include "models/keras_model.h"
#include "models/model.h"

DEFINE_string(model, "lenet", "Model name (mlp, lenet, inception_mini, ...).");
DEFINE_string(model_file, "",
              "A Keras model file to time instead of --model (its input shape and "
              "classes replace --input_size, --input_channels and --num_classes).");
DEFINE_int32(threads, 2, "Intra-op threads.");
DEFINE_int32(batch_size, 100, "Examples per step.");
DEFINE_int32(steps, 20, "Steps per timed run.");
DEFINE_int32(runs, 5, "Timed runs; the median is reported.");
DEFINE_string(device, "cpu", "cpu, or gpu (GPU 0).");
DEFINE_string(gpu_math, "fp32", "fp32 or tf32: how GPU GEMMs and convolutions round.");
DEFINE_string(gpu_conv, "auto", "auto, cudnn or im2col: how GPU convolutions run.");
DEFINE_int32(input_size, 28, "Input height and width (random images).");
DEFINE_int32(input_channels, 1, "Input channels.");
DEFINE_int32(num_classes, 10, "Classes.");

using psrt::bench::Median;

namespace {

double ProcessCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  psrt::ModelOptions options;
  options.intra_op_threads = FLAGS_threads;
  options.input_height = options.input_width = FLAGS_input_size;
  options.input_channels = FLAGS_input_channels;
  options.num_classes = FLAGS_num_classes;
  CHECK(FLAGS_device == "cpu" || FLAGS_device == "gpu")
      << "--device=" << FLAGS_device << " is not cpu or gpu";
  if (FLAGS_device == "gpu") {
    options.device.type = psrt::kernels::DeviceType::kGpu;
    auto math = psrt::kernels::ParseGpuMath(FLAGS_gpu_math);
    CHECK(math.ok()) << math.status();
    options.device.gpu_math = *math;
    auto conv = psrt::kernels::ParseGpuConv(FLAGS_gpu_conv);
    CHECK(conv.ok()) << conv.status();
    options.device.gpu_conv = *conv;
  }
  std::string name = FLAGS_model;
  if (!FLAGS_model_file.empty()) {
    auto json = psrt::FileSystem::Default()->ReadFile(FLAGS_model_file);
    CHECK(json.ok()) << json.status();
    auto shape = psrt::ReadKerasModelShape(*json, FLAGS_model_file);
    CHECK(shape.ok()) << shape.status();
    options.input_height = shape->input_height;
    options.input_width = shape->input_width;
    options.input_channels = shape->input_channels;
    options.num_classes = shape->num_classes;
    options.model_json = *std::move(json);
    options.model_file = FLAGS_model_file;
    name = "keras";
  }
  auto model = psrt::NewModel(name, options);
  CHECK(model.ok()) << model.status();
  if (name == "keras") name = FLAGS_model_file;
  LOG(INFO) << name << " on " << (*model)->device_name();
  std::vector<psrt::Tensor> params, grads;
  (*model)->Initialize(/*seed=*/1, &params);
  const int64_t pixels = int64_t{options.input_height} * options.input_width *
                         options.input_channels;
  // Where the model reads input fastest (page-locked on a GPU), as the
  // trainer's batches are.
  psrt::Tensor images({FLAGS_batch_size, pixels}, (*model)->input_allocator());
  std::vector<int32_t> labels(FLAGS_batch_size);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  for (float& v : images.flat()) v = pixel(rng);
  for (int32_t& l : labels) l = rng() % options.num_classes;

  std::vector<double> wall_eps, cpu_eps;
  for (int run = 0; run <= FLAGS_runs; ++run) {
    const absl::Time start = absl::Now();
    const double cpu_start = ProcessCpuSeconds();
    for (int step = 0; step < FLAGS_steps; ++step) {
      (*model)->ComputeGradients(params, images, labels, &grads);
    }
    const double wall = absl::ToDoubleSeconds(absl::Now() - start);
    const double cpu = ProcessCpuSeconds() - cpu_start;
    if (run == 0) continue;  // Warm-up.
    const double examples = static_cast<double>(FLAGS_steps) * FLAGS_batch_size;
    wall_eps.push_back(examples / wall);
    // CPU seconds shared by the threads: examples per second if each
    // thread had had its core to itself.
    cpu_eps.push_back(examples * FLAGS_threads / cpu);
  }
  std::printf(
      "step: model=%s device=%s gpu_math=%s gpu_conv=%s threads=%d batch=%d "
      "wall_eps=%.1f cpu_eps=%.0f\n",
      name.c_str(), FLAGS_device.c_str(),
      FLAGS_device == "gpu" ? FLAGS_gpu_math.c_str() : "-",
      FLAGS_device == "gpu" ? FLAGS_gpu_conv.c_str() : "-", FLAGS_threads,
      FLAGS_batch_size, Median(wall_eps), Median(cpu_eps));
  return 0;
}
