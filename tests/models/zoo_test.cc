// The benchmark models (models/zoo.h) and the residual sum they need:
// torchvision's parameter counts, a step on the smallest input, and the
// sum's gradient against finite differences.
#include "models/zoo.h"

#include <cmath>
#include <memory>
#include <utility>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/model.h"
#include "models/net.h"
#include "tests/models/model_test_util.h"

namespace psrt {
namespace {

using testing::CheckSampledGradients;
using testing::RandomImages;

ModelOptions ImageNet() {
  ModelOptions options;
  options.input_height = options.input_width = 224;
  options.input_channels = 3;
  options.num_classes = 1000;
  return options;
}

// sum(p.numel() for p in torchvision.models.NAME().parameters()).
TEST(ZooTest, ParameterCountsAreTorchvisions) {
  struct Expected {
    const char* name;
    int64_t params;
    size_t variables;
  };
  for (const Expected& e :
       {Expected{"resnet50", 25557032, 267}, Expected{"resnet101", 44549160, 522},
        Expected{"vgg16", 138357544, 32}, Expected{"alexnet", 61100840, 16}}) {
    absl::StatusOr<std::unique_ptr<Model>> model = NewModel(e.name, ImageNet());
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ(CountParameters(**model).trainable, e.params) << e.name;
    EXPECT_EQ((*model)->variables().size(), e.variables) << e.name;
  }
  absl::StatusOr<std::unique_ptr<Model>> resnet = NewResnet50(ImageNet());
  ASSERT_TRUE(resnet.ok());
  const std::vector<VariableDef>& vars = (*resnet)->variables();
  EXPECT_EQ(vars[0].name, "conv1/weights");
  EXPECT_EQ(vars[0].shape, (Shape{7, 7, 3, 64}));
  EXPECT_EQ(vars[3].name, "conv1/BatchNorm/moving_mean");
  EXPECT_EQ(vars[5].name, "block1/unit_1/shortcut/weights");
  EXPECT_EQ(vars[5].shape, (Shape{1, 1, 64, 256}));
  EXPECT_EQ(vars[vars.size() - 2].name, "logits/weights");
  EXPECT_EQ(vars[vars.size() - 2].shape, (Shape{2048, 1000}));
}

TEST(ZooTest, EachTrainsAStepOnItsSmallestInput) {
  struct Case {
    const char* name;
    int size;
  };
  for (const Case& c : {Case{"resnet50", 32}, Case{"vgg16", 32}, Case{"alexnet", 63}}) {
    ModelOptions options;
    options.input_height = options.input_width = c.size;
    options.input_channels = 3;
    options.num_classes = 5;
    options.intra_op_threads = 2;
    absl::StatusOr<std::unique_ptr<Model>> model = NewModel(c.name, options);
    ASSERT_TRUE(model.ok()) << model.status();
    std::vector<Tensor> params, grads;
    (*model)->Initialize(1, &params);
    const Tensor images = RandomImages(2, int64_t{c.size} * c.size * 3, 2);
    const float loss = (*model)->ComputeGradients(params, images, {0, 4}, &grads);
    EXPECT_TRUE(std::isfinite(loss)) << c.name;
    EXPECT_GT(loss, 0.0f) << c.name;
    for (size_t v = 0; v < grads.size(); ++v) {
      for (float x : grads[v].flat()) {
        ASSERT_TRUE(std::isfinite(x)) << c.name << " " << (*model)->variables()[v].name;
      }
    }
    EXPECT_GE((*model)->Evaluate(params, images, {0, 4}).correct, 0);
  }
}

TEST(ZooTest, TooSmallInputsAreErrorsNamingTheModel) {
  ModelOptions options;  // 28x28x1.
  for (const char* name : {"resnet50", "resnet101", "vgg16", "alexnet"}) {
    absl::StatusOr<std::unique_ptr<Model>> model = NewModel(name, options);
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(std::string(model.status().message()),
                ::testing::HasSubstr(std::string(name) + " needs inputs of at least"));
  }
}

// A residual unit in small: conv + batch norm + ReLU, conv + batch norm,
// summed with a 1x1 projection of the input, then ReLU; a sum of three
// without ReLU; pooled to the logits.
TEST(SumLayerTest, GradientsMatchFiniteDifferences) {
  ModelOptions options;
  options.input_height = 6;
  options.input_width = 5;
  options.input_channels = 2;
  options.num_classes = 3;
  options.intra_op_threads = 2;
  NetBuilder net(options);
  ConvSpec conv;
  conv.out_channels = 4;
  conv.batch_norm = true;
  const int a = net.Conv("a", NetBuilder::kInput, conv);
  conv.relu = false;
  const int b = net.Conv("b", a, conv);
  conv.filter_height = conv.filter_width = 1;
  const int projection = net.Conv("projection", NetBuilder::kInput, conv);
  const int unit = net.Sum({b, projection}, /*relu=*/true);
  const int three = net.Sum({unit, a, projection}, /*relu=*/false);
  net.FullyConnected("logits", net.GlobalAvgPool(three), 3, /*relu=*/false);
  absl::StatusOr<std::unique_ptr<Model>> model = net.Build("residual");
  ASSERT_TRUE(model.ok()) << model.status();
  const Tensor images = RandomImages(4, 6 * 5 * 2, 7);
  CheckSampledGradients(model->get(), images, {0, 2, 1, 2}, 3, /*samples=*/4);
}

// A ReLU moves past the max pool that alone consumes it (NetBuilder::Build):
// a convolution's ReLU followed by a pool gives the same loss and
// gradients, bit for bit, as a separate ReLU layer (which stays where it
// is) before the pool; both with windows whose maximum is not positive, and
// with 3x3 windows of stride 2 that overlap and are cut by the padding.
TEST(NetBuilderTest, AReluMovedPastItsMaxPoolGivesTheSameLossAndGradients) {
  ModelOptions options;
  options.input_height = 9;
  options.input_width = 8;
  options.input_channels = 3;
  options.num_classes = 4;
  options.intra_op_threads = 2;
  auto build = [&](bool separate_relu, int64_t window, int64_t stride) {
    NetBuilder net(options);
    ConvSpec conv;
    conv.filter_height = conv.filter_width = 3;
    conv.out_channels = 6;
    conv.bias = true;
    conv.relu = !separate_relu;
    int x = net.Conv("conv", NetBuilder::kInput, conv);
    if (separate_relu) x = net.Relu(x);
    x = net.MaxPool(x, window, stride, kernels::Padding::kSame);
    net.FullyConnected("logits", x, 4, /*relu=*/false);
    absl::StatusOr<std::unique_ptr<Model>> model = net.Build("pool_after_relu");
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() ? std::move(*model) : nullptr;
  };
  const Tensor images = RandomImages(5, 9 * 8 * 3, 11);
  const std::vector<int32_t> labels = {0, 3, 1, 2, 3};
  for (const auto& [window, stride] : {std::pair<int64_t, int64_t>{2, 2}, {3, 2}}) {
    SCOPED_TRACE(::testing::Message() << window << "x" << window << " stride " << stride);
    std::unique_ptr<Model> moved = build(false, window, stride);
    std::unique_ptr<Model> kept = build(true, window, stride);
    ASSERT_TRUE(moved != nullptr && kept != nullptr);
    std::vector<Tensor> params;
    moved->Initialize(3, &params);
    // Biases of both signs: some windows have no positive value.
    for (float& b : params[1].flat()) b = b - 0.5f + 0.2f * (&b - params[1].data());
    std::vector<Tensor> moved_grads, kept_grads;
    const double moved_loss = moved->ComputeGradients(params, images, labels, &moved_grads);
    const double kept_loss = kept->ComputeGradients(params, images, labels, &kept_grads);
    EXPECT_EQ(moved_loss, kept_loss);
    ASSERT_EQ(moved_grads.size(), kept_grads.size());
    for (size_t v = 0; v < moved_grads.size(); ++v) {
      EXPECT_EQ(testing::ToVector(moved_grads[v]), testing::ToVector(kept_grads[v]))
          << moved->variables()[v].name;
    }
  }
}

}  // namespace
}  // namespace psrt
