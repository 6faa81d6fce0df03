// cuDNN's convolutions (cudnn_conv.h) against the CPU's (the oracle) and
// the GPU's im2col path, in fp32 and tf32, alone (kCudnn) and as measured
// against im2col per shape (kAuto), on the shapes that take each of
// its branches: padding cuDNN can express, SAME padding it cannot (more
// after than before: copied into zeros), VALID windows that leave rows
// unread, strided 1x1 and 7x7 first layers, and 1x1 stride 1 (one GEMM).
// CudnnLibraryTest needs no GPU: it proves that cuDNN loads where psrt was
// built (CI), as psrtctl devices says. The rest skips without a GPU (fails
// under PSRT_REQUIRE_GPU=1).
#include "kernels/cudnn_conv.h"

#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/conv.h"
#include "kernels/cudnn_library.h"
#include "kernels/workspace.h"
#include "tests/gpu_test_util.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace psrt {
namespace kernels {
namespace testing {
namespace {

using ::psrt::testing::NearInNorm;

TEST(CudnnLibraryTest, LoadsWithoutAGpu) {
  absl::StatusOr<const CudnnLibrary*> cudnn = LoadCudnn();
  ASSERT_TRUE(cudnn.ok()) << cudnn.status();
  EXPECT_GE((*cudnn)->version, 90000u) << (*cudnn)->path;
  EXPECT_EQ(CudnnVersionString(91900), "9.19.0");
  EXPECT_EQ(CudnnVersionString((*cudnn)->version).substr(0, 2), "9.");

  // What users see: psrtctl devices (beside this test, in a build or a GPU
  // bundle) names the version.
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  ASSERT_GT(n, 0);
  std::string psrtctl(exe, n);
  psrtctl.resize(psrtctl.rfind('/') + 1);
  psrtctl += "psrtctl devices 2>&1";
  FILE* pipe = popen(psrtctl.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[256];
  while (fgets(buf, sizeof(buf), pipe) != nullptr) out += buf;
  EXPECT_EQ(pclose(pipe), 0) << out;
  EXPECT_NE(out.find(" cudnn=" + CudnnVersionString((*cudnn)->version) + "\n"), std::string::npos)
      << out;
}

// Relative 2-norm errors: fp32 sums in other orders (about 1e-6 seen on
// the im2col path, 1e-4 allowed); tf32 rounds each input to a 10-bit
// mantissa (about 5e-4 per product).
constexpr double kFp32Tolerance = 1e-4;
constexpr double kTf32Tolerance = 5e-3;

struct Case {
  Conv2DShape shape;
  int cudnn_directions;  // 3, or 0 for 1x1 stride 1 (one GEMM).
};

const Case kCases[] = {
    {{3, 9, 8, 5, 3, 3, 7, 1, 1, Padding::kSame}, 3},     // Symmetric padding.
    {{2, 12, 10, 4, 3, 3, 6, 2, 2, Padding::kSame}, 3},   // 1 after, 0 before.
    {{2, 11, 11, 4, 5, 5, 6, 2, 2, Padding::kSame}, 3},   // Odd size, symmetric.
    {{2, 10, 9, 3, 3, 3, 4, 2, 2, Padding::kValid}, 3},   // Unread last rows.
    {{2, 6, 9, 4, 1, 7, 5, 1, 1, Padding::kSame}, 3},     // Inception's 1x7.
    {{2, 32, 32, 3, 7, 7, 8, 2, 2, Padding::kSame}, 3},   // ResNet's first: 2 + 3.
    {{2, 14, 14, 8, 1, 1, 16, 2, 2, Padding::kSame}, 3},  // Strided shortcut.
    {{3, 7, 7, 6, 1, 1, 8, 1, 1, Padding::kSame}, 0},     // One GEMM.
    {{100, 14, 14, 32, 5, 5, 64, 1, 1, Padding::kSame}, 3},  // LeNet's conv2.
};

class CudnnConvTest : public CudaParityTest, public ::testing::WithParamInterface<GpuMath> {
 protected:
  std::unique_ptr<CudaConvolutions> Make(GpuConv mode) {
    absl::StatusOr<std::unique_ptr<CudaConvolutions>> convolutions =
        CudaConvolutions::Create(*gpu_, mode, GetParam());
    EXPECT_TRUE(convolutions.ok()) << convolutions.status();
    return convolutions.ok() ? *std::move(convolutions) : nullptr;
  }
};

TEST_P(CudnnConvTest, MatchesTheCpuAndIm2col) {
  // The fixture's context does fp32 GEMMs; tf32 needs its own.
  if (GetParam() == GpuMath::kTf32) {
    absl::StatusOr<std::unique_ptr<CudaContext>> tf32 = CudaContext::Create(0, GpuMath::kTf32);
    ASSERT_TRUE(tf32.ok()) << tf32.status();
    gpu_ = *std::move(tf32);
  }
  const double tolerance = GetParam() == GpuMath::kTf32 ? kTf32Tolerance : kFp32Tolerance;
  std::unique_ptr<CudaConvolutions> cudnn = Make(GpuConv::kCudnn);
  std::unique_ptr<CudaConvolutions> fastest = Make(GpuConv::kAuto);
  std::unique_ptr<CudaConvolutions> im2col = Make(GpuConv::kIm2col);
  ASSERT_TRUE(cudnn != nullptr && fastest != nullptr && im2col != nullptr);
  EXPECT_TRUE(cudnn->uses_cudnn());
  EXPECT_EQ(cudnn->description().rfind("cuDNN 9.", 0), 0u) << cudnn->description();
  EXPECT_FALSE(im2col->uses_cudnn());
  int i = 0;
  for (const Case& c : kCases) {
    const Conv2DShape& s = c.shape;
    SCOPED_TRACE(i);
    const std::vector<float> x = RandomVector(s.input_size(), 1 + i);
    const std::vector<float> f = RandomVector(s.filter_size(), 2 + i);
    const std::vector<float> dy = RandomVector(s.output_size(), 3 + i);
    std::vector<float> y(s.output_size()), dx(x.size()), df(f.size());
    Workspace ws;
    Conv2DForward(cpu_, s, x.data(), f.data(), nullptr, y.data(), &ws);
    Conv2DBackward(cpu_, s, x.data(), f.data(), dy.data(), dx.data(), df.data(), nullptr, &ws);

    for (CudaConvolutions* convolutions : {cudnn.get(), fastest.get(), im2col.get()}) {
      // Twice: the second call runs the plan the first one measured.
      for (int call = 0; call < 2; ++call) {
        DeviceArray<float> gx(x), gf(f), gdy(dy), gy(y.size()), gdx(x.size()), gdf(f.size());
        Conv2DForward(*gpu_, s, gx.get(), gf.get(), nullptr, gy.get(), convolutions);
        Conv2DBackward(*gpu_, s, gx.get(), gf.get(), gdy.get(), gdx.get(), gdf.get(), nullptr,
                       convolutions);
        Sync();
        EXPECT_TRUE(NearInNorm(gy.ToHost(), y, tolerance)) << convolutions->description();
        EXPECT_TRUE(NearInNorm(gdx.ToHost(), dx, tolerance)) << convolutions->description();
        EXPECT_TRUE(NearInNorm(gdf.ToHost(), df, tolerance)) << convolutions->description();
      }
    }
    EXPECT_EQ(cudnn->CudnnDirections(s), c.cudnn_directions);
    // Measured: any mix, but only where cuDNN can.
    EXPECT_LE(fastest->CudnnDirections(s), c.cudnn_directions);
    EXPECT_EQ(im2col->CudnnDirections(s), 0);
    ++i;
  }
}

TEST_P(CudnnConvTest, OneGradientAlone) {
  // A first layer asks for no dx; a frozen filter for no dfilter.
  const Conv2DShape s{2, 12, 10, 4, 3, 3, 6, 2, 2, Padding::kSame};
  const std::vector<float> x = RandomVector(s.input_size(), 7);
  const std::vector<float> f = RandomVector(s.filter_size(), 8);
  const std::vector<float> dy = RandomVector(s.output_size(), 9);
  std::vector<float> dx(x.size()), df(f.size());
  Workspace ws;
  Conv2DBackward(cpu_, s, x.data(), f.data(), dy.data(), dx.data(), df.data(), nullptr, &ws);
  const double tolerance = GetParam() == GpuMath::kTf32 ? kTf32Tolerance : kFp32Tolerance;
  std::unique_ptr<CudaConvolutions> cudnn = Make(GpuConv::kCudnn);
  ASSERT_NE(cudnn, nullptr);
  DeviceArray<float> gx(x), gf(f), gdy(dy), gdx(x.size()), gdf(f.size());
  Conv2DBackward(*gpu_, s, gx.get(), gf.get(), gdy.get(), nullptr, gdf.get(), nullptr,
                 cudnn.get());
  Sync();
  EXPECT_TRUE(NearInNorm(gdf.ToHost(), df, tolerance));
  EXPECT_EQ(cudnn->CudnnDirections(s), 1);
  Conv2DBackward(*gpu_, s, gx.get(), gf.get(), gdy.get(), gdx.get(), nullptr, nullptr,
                 cudnn.get());
  Sync();
  EXPECT_TRUE(NearInNorm(gdx.ToHost(), dx, tolerance));
  EXPECT_EQ(cudnn->CudnnDirections(s), 2);
}

INSTANTIATE_TEST_SUITE_P(Math, CudnnConvTest, ::testing::Values(GpuMath::kFp32, GpuMath::kTf32),
                         [](const ::testing::TestParamInfo<GpuMath>& info) {
                           return info.param == GpuMath::kTf32 ? std::string("Tf32")
                                                               : std::string("Fp32");
                         });

}  // namespace
}  // namespace testing
}  // namespace kernels
}  // namespace psrt
