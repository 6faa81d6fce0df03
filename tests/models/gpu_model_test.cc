// Whole models on a GPU against the same models on the CPU (the oracle):
// loss, every gradient (and batch norms' new moving statistics),
// predictions on the statistics of a training step, and a steady state that allocates no device memory
// (towers on the GPU: tests/worker/towers_test.cc). Every case
// skips itself where no GPU is visible (or the build has no CUDA), as in CI,
// and fails instead under PSRT_REQUIRE_GPU=1 (tests/gpu_test_util.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/device.h"
#include "models/model.h"
#include "tests/gpu_test_util.h"
#include "tests/models/model_test_util.h"

namespace psrt {
namespace {

using testing::RandomImages;

struct Case {
  std::string model;
  int size;  // Input height and width.
  int channels;
  int classes;
  int batch;
  // The "keras" model's file, in tests/data/keras/.
  std::string keras_file = "";
};

// The built-in model's name, or the Keras file's.
std::string Label(const Case& c) {
  return c.keras_file.empty() ? c.model : c.keras_file.substr(0, c.keras_file.find('.'));
}

void PrintTo(const Case& c, std::ostream* os) { *os << Label(c); }

std::string CaseName(const ::testing::TestParamInfo<Case>& info) { return Label(info.param); }

ModelOptions OptionsFor(const Case& c, kernels::DeviceSpec device) {
  ModelOptions options;
  if (!c.keras_file.empty()) {
    // From the repository root where the tests run (a GPU machine's copy of
    // the tree, scripts/gpu_first_run.sh), else from the build's source.
    options.model_file = absl::StrCat("tests/data/keras/", c.keras_file);
    if (!std::ifstream(options.model_file)) {
      options.model_file = absl::StrCat(PSRT_SOURCE_DIR, "/", options.model_file);
    }
    std::ifstream in(options.model_file);
    std::stringstream text;
    text << in.rdbuf();
    options.model_json = text.str();
  }
  options.input_height = options.input_width = c.size;
  options.input_channels = c.channels;
  options.num_classes = c.classes;
  options.intra_op_threads = 2;
  options.device = device;
  return options;
}

kernels::DeviceSpec Gpu(int gpu = 0) {
  kernels::DeviceSpec spec;
  spec.type = kernels::DeviceType::kGpu;
  spec.gpu = gpu;
  return spec;
}

std::vector<int32_t> Labels(const Case& c) {
  std::vector<int32_t> labels(c.batch);
  for (int i = 0; i < c.batch; ++i) labels[i] = (i * 7 + 3) % c.classes;
  return labels;
}

// Two training steps' losses and gradients (the second on reused buffers,
// with dropout's second mask).
struct TwoSteps {
  float loss[2];
  std::vector<Tensor> grads[2];
};

TwoSteps RunTwoSteps(Model& model, const std::vector<Tensor>& params, const Tensor& images,
                     const std::vector<int32_t>& labels) {
  TwoSteps run;
  for (int step = 0; step < 2; ++step) {
    run.loss[step] = model.ComputeGradients(params, images, labels, &run.grads[step]);
  }
  return run;
}

// How far the CPU's own gradients move when every pixel moves one ulp up or
// down (fresh models, so the same dropout masks), times 3, at the most
// moved variable: the GPU rounds otherwise in every op, so it may differ
// from the CPU by as much, in any variable. Most models move by about
// 1e-7, far inside the floor of 1e-3 that the GPU must meet anyway; LeNet's
// first layer by up to 1%. Inception-v3 at its random initialization is
// chaotic: ~95 batch-normalized layers on 4 examples amplify rounding about
// 1e5-fold, and one ulp moves its gradients by 2-5% (the H100 differed from
// the CPU by as much, 5.2% at worst). Which variables move most differs
// from one perturbation to the next (the H100's difference was 5x the
// nudges' in some), so the bound is one per step, not one per variable.
// It catches wiring bugs, which move gradients by order 1; the op parity
// tests (tests/kernels/cuda) hold each kernel to 1e-4. The loss is one
// number where the gradients' bound is the worst of hundreds, so two
// nudges sample its spread more thinly: it gets a wider margin (an H200
// once differed from the CPU by 3.4x the larger nudge's loss move on
// Inception-v3, 1.2e-4 of the loss; every other model stays on the floor).
struct Tolerance {
  float loss[2];
  double gradients[2];  // Relative, in the 2-norm, for every variable.
};

Tolerance CpuRoundingTolerance(const Case& c, const TwoSteps& cpu,
                               const std::vector<Tensor>& params, const Tensor& images,
                               const std::vector<int32_t>& labels) {
  constexpr double kMargin = 3;       // Over the larger of the two nudges.
  constexpr double kLossMargin = 10;  // Likewise, for the loss.
  Tolerance tolerance;
  for (int step = 0; step < 2; ++step) {
    tolerance.loss[step] = 1e-4f * std::abs(cpu.loss[step]) + 1e-5f;
    tolerance.gradients[step] = 1e-3;
  }
  for (const float toward : {2.0f, -1.0f}) {
    Tensor nudged = images.Clone();
    for (float& x : nudged.flat()) x = std::nextafter(x, toward);
    auto model = NewModel(c.model, OptionsFor(c, {}));
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return tolerance;
    const TwoSteps moved = RunTwoSteps(**model, params, nudged, labels);
    for (int step = 0; step < 2; ++step) {
      tolerance.loss[step] =
          std::max(tolerance.loss[step],
                   static_cast<float>(kLossMargin * std::abs(moved.loss[step] - cpu.loss[step])));
      for (size_t v = 0; v < cpu.grads[step].size(); ++v) {
        const Tensor& reference = cpu.grads[step][v];
        tolerance.gradients[step] = std::max(
            tolerance.gradients[step],
            kMargin * psrt::testing::RelativeErrorInNorm(
                          moved.grads[step][v].data(), reference.data(), reference.num_elements()));
      }
    }
  }
  return tolerance;
}

// Relative error in the 2-norm (gpu_test_util.h): the GPU's sums run in
// another order (and with atomics), and batch norm's backward subtracts
// means.
void ExpectNear(const Tensor& gpu, const Tensor& cpu, double relative, const std::string& what) {
  ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
  EXPECT_TRUE(psrt::testing::NearInNorm(gpu.data(), cpu.data(), cpu.num_elements(), relative))
      << what;
}

class GpuModelTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    PSRT_SKIP_WITHOUT_GPU(
        kernels::VisibleGpuCount(),
        (kernels::BuiltWithCuda() ? "the driver reports none" : "built without CUDA"));
  }
};

TEST_P(GpuModelTest, GradientsAndPredictionsMatchTheCpu) {
  const Case& c = GetParam();
  auto cpu = NewModel(c.model, OptionsFor(c, {}));
  auto gpu = NewModel(c.model, OptionsFor(c, Gpu()));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_THAT((*gpu)->device_name(), ::testing::StartsWith("gpu:0"));

  std::vector<Tensor> params, gpu_params;
  (*cpu)->Initialize(7, &params);
  (*gpu)->Initialize(7, &gpu_params);  // Page-locked, same values.
  ASSERT_EQ(params.size(), gpu_params.size());
  for (size_t v = 0; v < params.size(); ++v) {
    ExpectNear(gpu_params[v], params[v], 1e-3, "initial " + std::to_string(v));
  }
  const Tensor images = RandomImages(c.batch, int64_t{c.size} * c.size * c.channels, 3);
  const std::vector<int32_t> labels = Labels(c);

  const TwoSteps on_cpu = RunTwoSteps(**cpu, params, images, labels);
  const TwoSteps on_gpu = RunTwoSteps(**gpu, gpu_params, images, labels);
  const Tolerance tolerance = CpuRoundingTolerance(c, on_cpu, params, images, labels);
  for (int step = 0; step < 2; ++step) {
    std::printf("%s step %d: tolerance: loss %.3g, gradients %.3g\n", Label(c).c_str(), step,
                tolerance.loss[step], tolerance.gradients[step]);
    EXPECT_NEAR(on_gpu.loss[step], on_cpu.loss[step], tolerance.loss[step]) << "step " << step;
    ASSERT_EQ(on_gpu.grads[step].size(), on_cpu.grads[step].size());
    for (size_t v = 0; v < on_cpu.grads[step].size(); ++v) {
      ExpectNear(on_gpu.grads[step][v], on_cpu.grads[step][v], tolerance.gradients[step],
                 (*cpu)->variables()[v].name + " at step " + std::to_string(step));
    }
  }
  // Inference mode, on the moving statistics each side's second step made.
  for (size_t v = 0; v < params.size(); ++v) {
    if (!IsMovingStatistic((*cpu)->variables()[v].name)) continue;
    std::memcpy(params[v].data(), on_cpu.grads[1][v].data(), params[v].num_bytes());
    std::memcpy(gpu_params[v].data(), on_gpu.grads[1][v].data(), gpu_params[v].num_bytes());
  }
  const Model::Evaluation gpu_eval = (*gpu)->Evaluate(gpu_params, images, labels);
  const Model::Evaluation cpu_eval = (*cpu)->Evaluate(params, images, labels);
  // A row whose two best logits are nearly tied may flip its arg-max
  // between the two summation orders; more than one such row in a batch of
  // random images is not to be expected.
  EXPECT_LE(std::abs(gpu_eval.correct - cpu_eval.correct), 1)
      << gpu_eval.correct << " right on the GPU, " << cpu_eval.correct << " on the CPU";
  EXPECT_NEAR(gpu_eval.mean_loss, cpu_eval.mean_loss, 1e-4f * std::max(1.0f, cpu_eval.mean_loss));
}

// The step hooks on a GPU: the same calls in the same order as on the CPU
// (each layer's variables, backward order), and a layer's gradients final
// when gradients_ready names them, before the rest of the backward is done.
TEST_P(GpuModelTest, StepHooksComeLayerByLayerAsOnTheCpu) {
  const Case& c = GetParam();
  auto cpu = NewModel(c.model, OptionsFor(c, {}));
  auto gpu = NewModel(c.model, OptionsFor(c, Gpu()));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::vector<Tensor> params;
  (*gpu)->Initialize(7, &params);
  const Tensor images = RandomImages(c.batch, int64_t{c.size} * c.size * c.channels, 3);
  const std::vector<int32_t> labels = Labels(c);

  using Calls = std::vector<std::pair<char, int>>;  // ('r'|'g', begin).
  auto record = [](Calls* calls, std::vector<Tensor>* grads, std::vector<Tensor>* seen) {
    StepHooks hooks;
    hooks.before_read = [calls](int b, int) { calls->push_back({'r', b}); };
    hooks.loss_ready = [calls](float) { calls->push_back({'l', 0}); };
    hooks.gradients_ready = [calls, grads, seen](int b, int e) {
      calls->push_back({'g', b});
      for (int v = b; v < e; ++v) (*seen)[v] = (*grads)[v].Clone();
    };
    return hooks;
  };
  Calls cpu_calls, gpu_calls;
  std::vector<Tensor> cpu_grads, gpu_grads, cpu_seen(params.size()), gpu_seen(params.size());
  (*cpu)->ComputeGradients(params, images, labels, &cpu_grads,
                           record(&cpu_calls, &cpu_grads, &cpu_seen));
  (*gpu)->ComputeGradients(params, images, labels, &gpu_grads,
                           record(&gpu_calls, &gpu_grads, &gpu_seen));
  EXPECT_EQ(gpu_calls, cpu_calls);
  for (size_t v = 0; v < params.size(); ++v) {
    ASSERT_EQ(gpu_seen[v].shape(), gpu_grads[v].shape()) << v << " not announced";
    EXPECT_TRUE(psrt::testing::NearInNorm(gpu_seen[v].data(), gpu_grads[v].data(),
                                          gpu_grads[v].num_elements(), 0))
        << (*gpu)->variables()[v].name << " changed after gradients_ready";
  }
}

TEST_P(GpuModelTest, SteadyStateAllocatesNoDeviceMemory) {
  const Case& c = GetParam();
  auto gpu = NewModel(c.model, OptionsFor(c, Gpu()));
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::vector<Tensor> params, grads;
  (*gpu)->Initialize(1, &params);
  const Tensor images = RandomImages(c.batch, int64_t{c.size} * c.size * c.channels, 5);
  const std::vector<int32_t> labels = Labels(c);
  (*gpu)->ComputeGradients(params, images, labels, &grads);
  (*gpu)->Evaluate(params, images, labels);
  const kernels::DeviceMemoryStats first = (*gpu)->device_memory();
  EXPECT_GT(first.system_allocations, 0);
  for (int i = 0; i < 3; ++i) {
    (*gpu)->ComputeGradients(params, images, labels, &grads);
    (*gpu)->Evaluate(params, images, labels);
  }
  const kernels::DeviceMemoryStats later = (*gpu)->device_memory();
  EXPECT_EQ(later.system_allocations, first.system_allocations);
  EXPECT_EQ(later.bytes_reserved, first.bytes_reserved);
}

INSTANTIATE_TEST_SUITE_P(Models, GpuModelTest,
                         ::testing::Values(Case{"mlp", 28, 1, 10, 16}, Case{"lenet", 28, 1, 10, 16},
                                           Case{"inception_mini", 28, 1, 10, 8},
                                           Case{"inception_v3", 75, 3, 5, 4}, Case{"resnet50", 32, 3, 5, 4},
                                           // Zero padding and batch norms of their own.
                                           Case{"keras", 12, 3, 5, 6, "app_blocks_keras3.json"},
                                           // Squeeze-and-excitation: Rescaling, Normalization,
                                           // a broadcast Multiply, Reshape.
                                           Case{"keras", 8, 3, 4, 6, "squeeze_excite_keras3.json"},
                                           // ConvNeXt's: layer norms, a grouped Conv2D, Dense
                                           // per pixel, LayerScale, gelu.
                                           Case{"keras", 8, 3, 3, 6, "convnext_block_keras3.json"}),
                         CaseName);

TEST(GpuModelErrorTest, AGpuThatIsNotThereIsAClearError) {
  ModelOptions options;
  options.device = Gpu(kernels::VisibleGpuCount());  // One past the last.
  auto model = NewModel("lenet", options);
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(std::string(model.status().message()), ::testing::HasSubstr("lenet: gpu:"));
}

}  // namespace
}  // namespace psrt
