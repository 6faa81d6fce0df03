#include "models/inception.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/model.h"
#include "tests/models/model_test_util.h"

namespace psrt {
namespace {

using testing::CheckSampledGradients;
using testing::RandomImages;
using testing::ToVector;

TEST(InceptionV3Test, ParameterCountIsThePublishedOne) {
  ModelOptions options;
  options.input_height = options.input_width = 299;
  options.input_channels = 3;
  options.num_classes = 1000;
  absl::StatusOr<std::unique_ptr<Model>> v3 = NewInceptionV3(options);
  ASSERT_TRUE(v3.ok()) << v3.status();
  // torchvision's inception_v3(aux_logits=False): 23,834,568 trainable
  // parameters in 284 tensors (94 convolutions with batch-norm gamma and
  // beta, and the 2048 x 1000 logits layer); computed by
  // sum(p.numel() for p in inception_v3(aux_logits=False).parameters())
  // with torchvision 0.14 (27,161,264 with the auxiliary head). Keras'
  // InceptionV3 has fewer (23,817,352 trainable) because its batch norms
  // have no gamma.
  EXPECT_EQ(CountParameters(**v3).trainable, 23834568);
  EXPECT_EQ((*v3)->variables().size(), 472u);  // 94 batch norms' moving statistics too.
  EXPECT_EQ((*v3)->variables()[0].name, "Conv2d_1a_3x3/weights");
  EXPECT_EQ((*v3)->variables()[0].shape, (Shape{3, 3, 3, 32}));
  EXPECT_EQ((*v3)->variables().back().name, "Logits/biases");
  EXPECT_EQ((*v3)->variables()[470].shape, (Shape{2048, 1000}));
}

TEST(InceptionV3Test, RunsOnTheSmallestInput) {
  ModelOptions options;
  options.input_height = options.input_width = 75;
  options.input_channels = 3;
  options.num_classes = 5;
  options.intra_op_threads = 2;
  absl::StatusOr<std::unique_ptr<Model>> v3 = NewInceptionV3(options);
  ASSERT_TRUE(v3.ok()) << v3.status();
  std::vector<Tensor> params, grads;
  (*v3)->Initialize(1, &params);
  const Tensor images = RandomImages(2, 75 * 75 * 3, 2);
  const float loss = (*v3)->ComputeGradients(params, images, {0, 4}, &grads);
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_GT(loss, 0.0f);
  for (const Tensor& g : grads) {
    for (float x : g.flat()) ASSERT_TRUE(std::isfinite(x));
  }
  EXPECT_GE((*v3)->Evaluate(params, images, {0, 4}).correct, 0);
}

TEST(InceptionV3Test, TooSmallInputIsAnError) {
  ModelOptions options;  // 28x28x1.
  absl::StatusOr<std::unique_ptr<Model>> v3 = NewInceptionV3(options);
  EXPECT_EQ(v3.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      std::string(v3.status().message()),
      ::testing::HasSubstr("inception_v3 needs inputs of at least 75x75"));
}

TEST(InceptionMiniTest, ModulesAndVariables) {
  absl::StatusOr<std::unique_ptr<Model>> mini =
      NewInceptionMini(ModelOptions());
  ASSERT_TRUE(mini.ok()) << mini.status();
  const std::vector<VariableDef>& vars = (*mini)->variables();
  EXPECT_EQ(vars[0].name, "Conv2d_1a_3x3/weights");
  EXPECT_EQ(vars[1].name, "Conv2d_1a_3x3/BatchNorm/gamma");
  EXPECT_EQ(vars[2].name, "Conv2d_1a_3x3/BatchNorm/beta");
  std::vector<std::string> names;
  for (const VariableDef& v : vars) names.push_back(v.name);
  EXPECT_THAT(names,
              ::testing::Contains("Mixed_2b/Branch_2/Conv2d_0b_5x5/weights"));
  EXPECT_THAT(names,
              ::testing::Contains("Mixed_3a/Branch_3/Conv2d_0b_1x1/weights"));
  EXPECT_EQ(vars[vars.size() - 2].name, "Logits/weights");
  EXPECT_EQ(vars[vars.size() - 2].shape, (Shape{128, 10}));
  EXPECT_LT(CountParameters(**mini).trainable, 200000);
}

TEST(InceptionMiniTest, GradientsMatchFiniteDifferences) {
  ModelOptions options;
  options.input_height = 10;
  options.input_width = 9;
  options.num_classes = 3;
  options.intra_op_threads = 2;
  absl::StatusOr<std::unique_ptr<Model>> mini = NewInceptionMini(options);
  ASSERT_TRUE(mini.ok()) << mini.status();
  const Tensor images = RandomImages(4, 90, 3);
  CheckSampledGradients(mini->get(), images, {0, 2, 1, 2}, 4, /*samples=*/3);
}

TEST(InceptionMiniTest, MovingStatisticsDriveInference) {
  ModelOptions options;
  options.input_height = options.input_width = 8;
  options.num_classes = 2;
  absl::StatusOr<std::unique_ptr<Model>> mini = NewInceptionMini(options);
  ASSERT_TRUE(mini.ok()) << mini.status();
  std::vector<Tensor> params, grads;
  (*mini)->Initialize(5, &params);
  const Tensor images = RandomImages(6, 64, 6);
  const std::vector<int32_t> labels = {0, 1, 0, 1, 0, 1};
  // Inference before and after training steps differs only through the
  // moving statistics (the parameters are unchanged).
  const int64_t before = (*mini)->Evaluate(params, images, labels).correct;
  const float loss1 = (*mini)->ComputeGradients(params, images, labels, &grads);
  const float loss2 = (*mini)->ComputeGradients(params, images, labels, &grads);
  EXPECT_EQ(loss1, loss2);  // Training mode uses batch statistics only.
  EXPECT_GE(before, 0);
}

}  // namespace
}  // namespace psrt
