#include "worker/training/towers.h"

#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/gpu_test_util.h"

namespace psrt {
namespace {

using ::testing::HasSubstr;

std::vector<std::unique_ptr<Model>> MakeModels(const std::string& name, int n,
                                               kernels::DeviceSpec device = {}) {
  ModelOptions options;
  options.hidden_units = {32};
  options.intra_op_threads = 1;
  options.device = device;
  std::vector<std::unique_ptr<Model>> models;
  for (int i = 0; i < n; ++i) {
    auto model = NewModel(name, options);
    EXPECT_TRUE(model.ok()) << model.status();
    models.push_back(std::move(*model));
  }
  return models;
}

// The averaged gradients of n towers on `device` equal the gradient of the
// whole batch on one model on that device, within `tolerance` relative to
// each variable's largest gradient.
void ExpectTowersEqualTheWholeBatch(const std::string& name, int n,
                                    kernels::DeviceSpec device,
                                    double tolerance) {
  auto single = MakeModels(name, 1, device);
  std::vector<Tensor> params;
  single[0]->Initialize(7, &params);
  constexpr int kBatch = 10;
  Tensor images({kBatch, 784});
  std::vector<int32_t> labels(kBatch);
  std::mt19937 rng(3);
  for (float& x : images.flat()) x = std::uniform_real_distribution<float>(0, 1)(rng);
  for (int i = 0; i < kBatch; ++i) labels[i] = i % 10;

  std::vector<Tensor> want, got;
  const float want_loss = single[0]->ComputeGradients(params, images, labels, &want);
  Towers towers(MakeModels(name, n, device));
  const float got_loss = towers.ComputeGradients(params, images, labels, &got);
  EXPECT_NEAR(got_loss, want_loss, tolerance * std::abs(want_loss)) << name << " " << n;
  ASSERT_EQ(got.size(), want.size());
  for (size_t v = 0; v < want.size(); ++v) {
    double max_diff = 0, max_abs = 0;
    for (int64_t j = 0; j < want[v].num_elements(); ++j) {
      max_diff = std::max(max_diff, double(std::abs(got[v].data()[j] - want[v].data()[j])));
      max_abs = std::max(max_abs, double(std::abs(want[v].data()[j])));
    }
    EXPECT_LE(max_diff, tolerance * std::max(1e-3, max_abs))
        << name << " towers=" << n << " var " << v;
  }
}

// For uneven splits too.
TEST(TowersTest, AveragedTowerGradientsEqualTheWholeBatchGradient) {
  for (const std::string name : {"mlp", "lenet"}) {
    for (int n : {2, 3}) ExpectTowersEqualTheWholeBatch(name, n, {}, 1e-5);
  }
}

// Two towers on GPU 0, each with its own model, device and streams, run
// from two threads. The GPU sums in another order: 1e-4.
TEST(TowersTest, GpuTowersEqualOneGpuOnTheWholeBatch) {
  PSRT_SKIP_WITHOUT_GPU(kernels::VisibleGpuCount(),
                        (kernels::BuiltWithCuda() ? "the driver reports none"
                                                  : "built without CUDA"));
  kernels::DeviceSpec gpu;
  gpu.type = kernels::DeviceType::kGpu;
  ExpectTowersEqualTheWholeBatch("lenet", 2, gpu, 1e-4);
}

TEST(ChooseTowerDevicesTest, AutoIsTheGpusWhenAnyIsVisible) {
  auto cpu = ChooseTowerDevices("auto", 1, 0);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_EQ(cpu->size(), 1u);
  EXPECT_EQ((*cpu)[0].type, kernels::DeviceType::kCpu);

  auto gpus = ChooseTowerDevices("auto", 2, 4);
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  ASSERT_EQ(gpus->size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ((*gpus)[i].type, kernels::DeviceType::kGpu);
    EXPECT_EQ((*gpus)[i].gpu, i);
  }
  auto forced_cpu = ChooseTowerDevices("cpu", 1, 4);
  ASSERT_TRUE(forced_cpu.ok());
  EXPECT_EQ((*forced_cpu)[0].type, kernels::DeviceType::kCpu);
}

TEST(ChooseTowerDevicesTest, RefusesWhatCannotRun) {
  EXPECT_THAT(ChooseTowerDevices("gpu", 1, 0).status().message(),
              HasSubstr("sees 0"));
  EXPECT_THAT(ChooseTowerDevices("gpu", 3, 2).status().message(),
              HasSubstr("--num_gpus=3 asks for 3 GPUs, but this process sees 2"));
  EXPECT_THAT(ChooseTowerDevices("auto", 2, 0).status().message(),
              HasSubstr("--num_gpus=2 asks for GPU towers"));
  EXPECT_THAT(ChooseTowerDevices("tpu", 1, 0).status().message(),
              HasSubstr("--device=tpu is not one of auto, cpu, gpu"));
  EXPECT_THAT(ChooseTowerDevices("cpu", 0, 0).status().message(),
              HasSubstr("--num_gpus=0 must be at least 1"));
}

}  // namespace
}  // namespace psrt
