// Every CPU op against PyTorch (float64) on fixed inputs: the fixtures in
// tests/data/oracle_ops.safetensors, written by scripts/gen_oracle.py (run
// it again after changing a case; this test needs no Python).
//
// "Within 1e-4 relative": |ours - torch| <= 1e-4 * (|torch| + 0.01 * max
// |torch| over the tensor), so that values near zero (where differences of
// float32 rounding are larger than the value) are held to the tensor's scale.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "kernels/batch_norm.h"
#include "kernels/conv.h"
#include "kernels/cpu_context.h"
#include "kernels/layer_ops.h"
#include "kernels/pool.h"
#include "kernels/window.h"
#include "kernels/workspace.h"

namespace psrt {
namespace kernels {
namespace {

class OracleTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<SafetensorsFile> file = ReadSafetensors(
        std::string(PSRT_SOURCE_DIR) + "/tests/data/oracle_ops.safetensors");
    ASSERT_TRUE(file.ok()) << file.status();
    fixture_ = new std::map<std::string, std::vector<float>>;
    for (const auto& [name, tensor] : file->tensors) {
      (*fixture_)[name].assign(tensor.flat().begin(), tensor.flat().end());
    }
  }
  static void TearDownTestSuite() { delete fixture_; }

  static const std::vector<float>& Get(const std::string& name) {
    auto it = fixture_->find(name);
    CHECK(it != fixture_->end()) << "no tensor " << name << " in the fixture";
    return it->second;
  }
  // The case names under "<op>/", from their "<op>/<case>/shape" tensors.
  static std::vector<std::string> Cases(const std::string& op) {
    std::vector<std::string> cases;
    for (const auto& [name, values] : *fixture_) {
      if (absl::StartsWith(name, op + "/") && absl::EndsWith(name, "/shape")) {
        cases.push_back(name.substr(0, name.size() - 6));
      }
    }
    return cases;
  }

  static void ExpectClose(const std::vector<float>& ours,
                          const std::vector<float>& want,
                          const std::string& what) {
    ASSERT_EQ(ours.size(), want.size()) << what;
    float scale = 0;
    for (float w : want) scale = std::max(scale, std::abs(w));
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(ours[i], want[i], 1e-4 * (std::abs(want[i]) + 0.01 * scale))
          << what << " element " << i;
    }
  }

  CpuContext ctx_{2};
  static std::map<std::string, std::vector<float>>* fixture_;
};

std::map<std::string, std::vector<float>>* OracleTest::fixture_ = nullptr;

Padding PaddingOf(float same) {
  return same != 0 ? Padding::kSame : Padding::kValid;
}

TEST_F(OracleTest, Conv2D) {
  const std::vector<std::string> cases = Cases("conv");
  ASSERT_EQ(cases.size(), 8u);
  for (const std::string& c : cases) {
    const std::vector<float>& v = Get(c + "/shape");
    const int64_t stride = v[7];
    const Conv2DShape s{int64_t(v[0]),  int64_t(v[1]), int64_t(v[2]),
                        int64_t(v[3]),  int64_t(v[4]), int64_t(v[5]),
                        int64_t(v[6]),  stride,        stride,
                        PaddingOf(v[8])};
    const std::vector<float>& x = Get(c + "/x");
    const std::vector<float>& f = Get(c + "/filter");
    Workspace ws;
    std::vector<float> y(s.output_size()), dx(x.size()), df(f.size());
    Conv2DForward(ctx_, s, x.data(), f.data(), nullptr, y.data(), &ws);
    Conv2DBackward(ctx_, s, x.data(), f.data(), Get(c + "/dy").data(),
                   dx.data(), df.data(), nullptr, &ws);
    ExpectClose(y, Get(c + "/y"), c + "/y");
    ExpectClose(dx, Get(c + "/dx"), c + "/dx");
    ExpectClose(df, Get(c + "/dfilter"), c + "/dfilter");
  }
}

TEST_F(OracleTest, MaxAndAvgPool) {
  const std::vector<std::string> cases = Cases("pool");
  ASSERT_EQ(cases.size(), 5u);
  for (const std::string& c : cases) {
    const std::vector<float>& v = Get(c + "/shape");
    const int64_t k = v[4], stride = v[5];
    const Pool2DShape s{
        int64_t(v[0]), int64_t(v[1]), int64_t(v[2]),  int64_t(v[3]), k, k,
        stride,        stride,        PaddingOf(v[6])};
    const std::vector<float>& x = Get(c + "/x");
    const std::vector<float>& dy = Get(c + "/dy");
    std::vector<float> y(s.output_size()), dx(x.size());
    MaxPoolForward(ctx_, s, x.data(), y.data());
    MaxPoolBackward(ctx_, s, x.data(), y.data(), dy.data(), dx.data());
    ExpectClose(y, Get(c + "/max_y"), c + "/max_y");
    ExpectClose(dx, Get(c + "/max_dx"), c + "/max_dx");
    AvgPoolForward(ctx_, s, x.data(), y.data());
    AvgPoolBackward(ctx_, s, dy.data(), dx.data());
    ExpectClose(y, Get(c + "/avg_y"), c + "/avg_y");
    ExpectClose(dx, Get(c + "/avg_dx"), c + "/avg_dx");
  }
}

TEST_F(OracleTest, GlobalAvgPool) {
  const std::vector<float>& v = Get("global_avg_pool/shape");
  const int64_t batch = v[0], pixels = v[1], channels = v[2];
  std::vector<float> y(batch * channels), dx(batch * pixels * channels);
  GlobalAvgPoolForward(ctx_, Get("global_avg_pool/x").data(), batch, pixels,
                       channels, y.data());
  GlobalAvgPoolBackward(ctx_, Get("global_avg_pool/dy").data(), batch, pixels,
                        channels, dx.data());
  ExpectClose(y, Get("global_avg_pool/y"), "y");
  ExpectClose(dx, Get("global_avg_pool/dx"), "dx");
}

TEST_F(OracleTest, ConcatChannels) {
  const std::vector<float>& v = Get("concat/shape");
  const int64_t pixels = v[0];
  const std::vector<int64_t> channels = {int64_t(v[1]), int64_t(v[2]),
                                         int64_t(v[3])};
  std::vector<float> y(pixels * (channels[0] + channels[1] + channels[2]));
  const float* inputs[] = {Get("concat/x0").data(), Get("concat/x1").data(),
                           Get("concat/x2").data()};
  ConcatChannelsForward(ctx_, pixels, inputs, channels, y.data());
  ExpectClose(y, Get("concat/y"), "y");
  std::vector<std::vector<float>> dx;
  for (int64_t c : channels) dx.emplace_back(pixels * c);
  float* dinputs[] = {dx[0].data(), dx[1].data(), dx[2].data()};
  ConcatChannelsBackward(ctx_, pixels, Get("concat/dy").data(), channels,
                         dinputs);
  for (int i = 0; i < 3; ++i) {
    ExpectClose(dx[i], Get(absl::StrCat("concat/dx", i)), "dx");
  }
}

TEST_F(OracleTest, BatchNorm) {
  const std::vector<float>& v = Get("batch_norm/shape");
  const BatchNormShape s{int64_t(v[0]), int64_t(v[1]), v[2], v[3]};
  const std::vector<float>& x = Get("batch_norm/x");
  const std::vector<float>& gamma = Get("batch_norm/gamma");
  const std::vector<float>& beta = Get("batch_norm/beta");
  std::vector<float> moving_mean = Get("batch_norm/moving_mean_in");
  std::vector<float> moving_var = Get("batch_norm/moving_var_in");
  std::vector<float> mean(s.channels), inv_std(s.channels), y(x.size()),
      dx(x.size()), dgamma(s.channels), dbeta(s.channels);
  BatchNormTrainingForward(ctx_, s, x.data(), gamma.data(), beta.data(),
                           moving_mean.data(), moving_var.data(), mean.data(),
                           inv_std.data(), y.data());
  BatchNormTrainingBackward(ctx_, s, x.data(), Get("batch_norm/dy").data(),
                            gamma.data(), mean.data(), inv_std.data(),
                            dx.data(), dgamma.data(), dbeta.data());
  ExpectClose(y, Get("batch_norm/y"), "y");
  ExpectClose(moving_mean, Get("batch_norm/moving_mean_out"), "moving_mean");
  ExpectClose(moving_var, Get("batch_norm/moving_var_out"), "moving_var");
  ExpectClose(dx, Get("batch_norm/dx"), "dx");
  ExpectClose(dgamma, Get("batch_norm/dgamma"), "dgamma");
  ExpectClose(dbeta, Get("batch_norm/dbeta"), "dbeta");
  BatchNormInferenceForward(ctx_, s, x.data(), gamma.data(), beta.data(),
                            moving_mean.data(), moving_var.data(), y.data());
  ExpectClose(y, Get("batch_norm/y_inference"), "y_inference");
}

TEST_F(OracleTest, Dropout) {
  const std::vector<float>& v = Get("dropout/shape");
  const int64_t n = v[0];
  std::vector<float> y(n), dx(n);
  DropoutForward(ctx_, Get("dropout/x").data(), n, v[1], uint64_t(v[2]),
                 y.data());
  DropoutBackward(ctx_, Get("dropout/dy").data(), n, v[1], uint64_t(v[2]),
                  dx.data());
  ExpectClose(y, Get("dropout/y"), "y");
  ExpectClose(dx, Get("dropout/dx"), "dx");
}

TEST_F(OracleTest, L2Loss) {
  const std::vector<float>& x = Get("l2_loss/x");
  ExpectClose({L2LossForward(ctx_, x.data(), x.size())}, Get("l2_loss/loss"),
              "loss");
  std::vector<float> dx(x.size());
  L2LossBackward(ctx_, x.data(), x.size(), 1.0f, dx.data());
  ExpectClose(dx, Get("l2_loss/dx"), "dx");
}

}  // namespace
}  // namespace kernels
}  // namespace psrt
