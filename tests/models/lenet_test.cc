#include "models/lenet.h"

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

std::unique_ptr<Model> MakeLenet(const ModelOptions& options) {
  absl::StatusOr<std::unique_ptr<Model>> model = NewLenet(options);
  EXPECT_TRUE(model.ok()) << model.status();
  return *std::move(model);
}

TEST(LenetTest, VariablesOfTensorFlowsMnistNetwork) {
  std::unique_ptr<Model> lenet = MakeLenet(ModelOptions());
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  int64_t params = 0;
  for (const VariableDef& v : lenet->variables()) {
    names.push_back(v.name);
    shapes.push_back(v.shape);
    params += NumElements(v.shape);
  }
  EXPECT_THAT(names, ::testing::ElementsAre("conv1/weights", "conv1/biases",
                                            "conv2/weights", "conv2/biases",
                                            "fc1/weights", "fc1/biases",
                                            "fc2/weights", "fc2/biases"));
  EXPECT_THAT(shapes, ::testing::ElementsAre(Shape{5, 5, 1, 32}, Shape{32},
                                             Shape{5, 5, 32, 64}, Shape{64},
                                             Shape{3136, 512}, Shape{512},
                                             Shape{512, 10}, Shape{10}));
  // 800 + 32 + 51200 + 64 + 1605632 + 512 + 5120 + 10.
  EXPECT_EQ(params, 1663370);
}

TEST(LenetTest, InitialValuesAreDeterministicAndScaled) {
  std::unique_ptr<Model> lenet = MakeLenet(ModelOptions());
  std::vector<Tensor> a, b;
  lenet->Initialize(3, &a);
  lenet->Initialize(3, &b);
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(ToVector(a[i]), ToVector(b[i]));
  // He initialization: conv2's weights have stddev sqrt(2 / 800) = 0.05.
  double sum_sq = 0;
  for (float x : a[2].flat()) sum_sq += double(x) * x;
  EXPECT_NEAR(std::sqrt(sum_sq / a[2].num_elements()), 0.05, 0.003);
  EXPECT_THAT(ToVector(a[1]), ::testing::Each(0.0f));
}

TEST(LenetTest, GradientsMatchFiniteDifferencesOnSmallImages) {
  ModelOptions options;
  options.input_height = 9;  // Pools to 5x5, then 3x3: fc1 reads 576.
  options.input_width = 7;
  options.num_classes = 4;
  options.intra_op_threads = 2;
  std::unique_ptr<Model> lenet = MakeLenet(options);
  EXPECT_EQ(lenet->variables()[4].shape, (Shape{3 * 2 * 64, 512}));
  const Tensor images = RandomImages(3, 63, 1);
  CheckSampledGradients(lenet.get(), images, {0, 3, 1}, 2, /*samples=*/12);
}

TEST(LenetTest, ThreadCountDoesNotChangeResults) {
  ModelOptions options;
  options.intra_op_threads = 1;
  std::unique_ptr<Model> one = MakeLenet(options);
  options.intra_op_threads = 3;
  std::unique_ptr<Model> three = MakeLenet(options);
  std::vector<Tensor> params, g1, g3;
  one->Initialize(4, &params);
  const Tensor images = RandomImages(5, 784, 5);
  const std::vector<int32_t> labels = {1, 2, 3, 4, 5};
  EXPECT_NEAR(one->ComputeGradients(params, images, labels, &g1),
              three->ComputeGradients(params, images, labels, &g3), 1e-5);
  for (size_t i = 0; i < g1.size(); ++i) {
    EXPECT_THAT(
        ToVector(g3[i]),
        ::testing::Pointwise(::testing::FloatNear(1e-5f), ToVector(g1[i])))
        << one->variables()[i].name;
  }
  EXPECT_EQ(one->Evaluate(params, images, labels).correct,
            three->Evaluate(params, images, labels).correct);
}

TEST(LenetTest, SgdFitsASmallBatch) {
  ModelOptions options;
  options.input_height = options.input_width = 12;
  options.num_classes = 3;
  std::unique_ptr<Model> lenet = MakeLenet(options);
  std::vector<Tensor> params, grads;
  lenet->Initialize(6, &params);
  const Tensor images = RandomImages(12, 144, 7);
  std::vector<int32_t> labels(12);
  for (int i = 0; i < 12; ++i) labels[i] = i % 3;
  const float initial = lenet->ComputeGradients(params, images, labels, &grads);
  float loss = initial;
  for (int step = 0; step < 50; ++step) {
    loss = lenet->ComputeGradients(params, images, labels, &grads);
    for (size_t v = 0; v < params.size(); ++v) {
      for (int64_t j = 0; j < params[v].num_elements(); ++j) {
        params[v].data()[j] -= 0.1f * grads[v].data()[j];
      }
    }
  }
  EXPECT_LT(loss, 0.2f * initial) << "initial " << initial;
  EXPECT_EQ(lenet->Evaluate(params, images, labels).correct, 12);
}

TEST(LenetTest, RejectsBadOptions) {
  ModelOptions options;
  options.input_channels = 0;
  EXPECT_EQ(NewLenet(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace psrt
