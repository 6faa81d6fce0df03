#include "models/mlp.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/model.h"

namespace psrt {
namespace {

using ::testing::ElementsAre;
using ::testing::FloatNear;
using ::testing::Pointwise;

// The tiny configuration of the gradient checks: 4x4 images, 3 classes.
ModelOptions TinyOptions(std::vector<int> hidden_units) {
  ModelOptions options;
  options.input_height = 4;
  options.input_width = 4;
  options.num_classes = 3;
  options.hidden_units = std::move(hidden_units);
  options.intra_op_threads = 1;
  return options;
}

std::unique_ptr<Model> MakeMlp(const ModelOptions& options) {
  absl::StatusOr<std::unique_ptr<Model>> model = NewMlp(options);
  EXPECT_TRUE(model.ok()) << model.status();
  return *std::move(model);
}

Tensor RandomImages(int64_t batch, int64_t pixels, uint64_t seed) {
  Tensor images({batch, pixels});
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(0.0f, 1.0f);
  for (float& x : images.flat()) x = dist(rng);
  return images;
}

std::vector<float> ToVector(const Tensor& t) {
  return std::vector<float>(t.flat().begin(), t.flat().end());
}

TEST(MlpTest, VariablesFollowTensorFlowNames) {
  std::unique_ptr<Model> mlp = MakeMlp(ModelOptions());
  const std::vector<VariableDef>& vars = mlp->variables();
  ASSERT_EQ(vars.size(), 4u);
  EXPECT_EQ(vars[0].name, "hidden1/weights");
  EXPECT_EQ(vars[0].shape, (Shape{784, 512}));
  EXPECT_EQ(vars[1].name, "hidden1/biases");
  EXPECT_EQ(vars[1].shape, (Shape{512}));
  EXPECT_EQ(vars[2].name, "softmax_linear/weights");
  EXPECT_EQ(vars[2].shape, (Shape{512, 10}));
  EXPECT_EQ(vars[3].name, "softmax_linear/biases");
  EXPECT_EQ(vars[3].shape, (Shape{10}));

  std::unique_ptr<Model> deep = MakeMlp(TinyOptions({5, 4}));
  std::vector<std::string> names;
  for (const VariableDef& v : deep->variables()) names.push_back(v.name);
  EXPECT_THAT(
      names, ElementsAre("hidden1/weights", "hidden1/biases", "hidden2/weights",
                         "hidden2/biases", "softmax_linear/weights",
                         "softmax_linear/biases"));
  EXPECT_EQ(deep->variables()[2].shape, (Shape{5, 4}));
}

TEST(MlpTest, InitializeIsDeterministicInTheSeed) {
  std::unique_ptr<Model> mlp = MakeMlp(TinyOptions({5}));
  std::vector<Tensor> a, b, c;
  mlp->Initialize(42, &a);
  mlp->Initialize(42, &b);
  mlp->Initialize(43, &c);
  ASSERT_EQ(a.size(), mlp->variables().size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].shape(), mlp->variables()[i].shape);
    EXPECT_EQ(ToVector(a[i]), ToVector(b[i])) << i;
  }
  EXPECT_NE(ToVector(a[0]), ToVector(c[0]));
  // Another instance with the same options agrees too.
  std::vector<Tensor> d;
  MakeMlp(TinyOptions({5}))->Initialize(42, &d);
  EXPECT_EQ(ToVector(a[2]), ToVector(d[2]));
}

TEST(MlpTest, InitialWeightsAreTruncatedNormalAndBiasesZero) {
  std::unique_ptr<Model> mlp = MakeMlp(ModelOptions());
  std::vector<Tensor> params;
  mlp->Initialize(7, &params);
  for (int layer = 0; layer < 2; ++layer) {
    const Tensor& w = params[2 * layer];
    const double stddev = 1.0 / std::sqrt(double(w.dim(0)));
    double sum = 0, sum_sq = 0;
    for (float x : w.flat()) {
      ASSERT_LE(std::abs(x), 2 * stddev + 1e-6);
      sum += x;
      sum_sq += double(x) * x;
    }
    const double n = w.num_elements();
    // A normal truncated at 2 sigma has standard deviation 0.88 sigma.
    EXPECT_NEAR(sum / n, 0.0, 0.05 * stddev);
    EXPECT_NEAR(std::sqrt(sum_sq / n), 0.88 * stddev, 0.05 * stddev);
    EXPECT_THAT(ToVector(params[2 * layer + 1]),
                ::testing::Each(::testing::Eq(0.0f)));
  }
}

// The whole model against central differences of its loss, for every
// parameter.
void CheckModelGradients(const ModelOptions& options, uint64_t seed) {
  std::unique_ptr<Model> mlp = MakeMlp(options);
  std::vector<Tensor> params;
  mlp->Initialize(seed, &params);
  // Non-zero biases, so that their gradients are tested away from zero.
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-0.3f, 0.3f);
  for (size_t i = 1; i < params.size(); i += 2) {
    for (float& b : params[i].flat()) b = dist(rng);
  }
  const int64_t batch = 6;
  const Tensor images = RandomImages(batch, 16, seed + 1);
  const std::vector<int32_t> labels = {0, 2, 1, 1, 0, 2};

  std::vector<Tensor> grads;
  mlp->ComputeGradients(params, images, labels, &grads);
  ASSERT_EQ(grads.size(), params.size());
  // Small enough that a step rarely moves a hidden pre-activation across the
  // ReLU's kink at 0 (where differences and derivative disagree), large
  // enough that float rounding of the loss stays far below the tolerance.
  constexpr float kStep = 1e-3f;
  for (size_t v = 0; v < params.size(); ++v) {
    ASSERT_EQ(grads[v].shape(), params[v].shape());
    std::vector<Tensor> scratch;
    for (int64_t j = 0; j < params[v].num_elements(); ++j) {
      float& x = params[v].data()[j];
      const float saved = x;
      x = saved + kStep;
      const double plus =
          mlp->ComputeGradients(params, images, labels, &scratch);
      x = saved - kStep;
      const double minus =
          mlp->ComputeGradients(params, images, labels, &scratch);
      x = saved;
      const double numeric = (plus - minus) / (2 * kStep);
      EXPECT_NEAR(grads[v].data()[j], numeric, 5e-4 + 1e-2 * std::abs(numeric))
          << mlp->variables()[v].name << " element " << j;
    }
  }
}

TEST(MlpTest, GradientsMatchFiniteDifferences) {
  CheckModelGradients(TinyOptions({5}), 1);
}

TEST(MlpTest, GradientsMatchFiniteDifferencesWithTwoHiddenLayers) {
  CheckModelGradients(TinyOptions({5, 4}), 2);
}

TEST(MlpTest, GradientsMatchFiniteDifferencesWithoutHiddenLayers) {
  CheckModelGradients(TinyOptions({}), 3);
}

TEST(MlpTest, ComputeGradientsOverwritesAndSurvivesBatchSizeChanges) {
  std::unique_ptr<Model> mlp = MakeMlp(TinyOptions({5}));
  std::vector<Tensor> params;
  mlp->Initialize(5, &params);
  const Tensor big = RandomImages(8, 16, 6);
  const Tensor small = RandomImages(3, 16, 7);
  const std::vector<int32_t> big_labels = {0, 1, 2, 0, 1, 2, 0, 1};
  const std::vector<int32_t> small_labels = {2, 2, 1};

  std::vector<Tensor> want;
  const float want_loss =
      MakeMlp(TinyOptions({5}))
          ->ComputeGradients(params, small, small_labels, &want);
  // Grads full of NaN, and scratch sized for a larger batch first.
  std::vector<Tensor> grads;
  mlp->ComputeGradients(params, big, big_labels, &grads);
  for (Tensor& g : grads) {
    for (float& x : g.flat()) x = std::numeric_limits<float>::quiet_NaN();
  }
  EXPECT_EQ(mlp->ComputeGradients(params, small, small_labels, &grads),
            want_loss);
  for (size_t i = 0; i < grads.size(); ++i) {
    EXPECT_EQ(ToVector(grads[i]), ToVector(want[i])) << i;
  }
}

TEST(MlpTest, ThreadCountDoesNotChangeResults) {
  ModelOptions options;  // 784-512-10, large enough to split the GEMMs.
  options.intra_op_threads = 1;
  std::unique_ptr<Model> one = MakeMlp(options);
  options.intra_op_threads = 3;
  std::unique_ptr<Model> three = MakeMlp(options);
  std::vector<Tensor> params;
  one->Initialize(9, &params);
  const Tensor images = RandomImages(50, 784, 10);
  std::vector<int32_t> labels(50);
  for (int i = 0; i < 50; ++i) labels[i] = i % 10;
  std::vector<Tensor> g1, g3;
  EXPECT_NEAR(one->ComputeGradients(params, images, labels, &g1),
              three->ComputeGradients(params, images, labels, &g3), 1e-5);
  for (size_t i = 0; i < g1.size(); ++i) {
    EXPECT_THAT(ToVector(g3[i]), Pointwise(FloatNear(1e-5f), ToVector(g1[i])))
        << one->variables()[i].name;
  }
}

TEST(MlpTest, EvaluateCountsArgMaxOfLogitsAndTheMeanLoss) {
  // No hidden layer and identity weights: the prediction is the brightest
  // of three pixels.
  ModelOptions options = TinyOptions({});
  options.input_height = 1;
  options.input_width = 3;
  std::unique_ptr<Model> mlp = MakeMlp(options);
  std::vector<Tensor> params;
  mlp->Initialize(1, &params);
  params[0].SetZero();
  for (int i = 0; i < 3; ++i) params[0].data()[i * 3 + i] = 1.0f;
  Tensor images({3, 3});
  const float pixels[] = {0.9f, 0.1f, 0.0f, 0.0f, 0.0f, 1.0f, 0.2f, 0.7f, 0.1f};
  std::copy(pixels, pixels + 9, images.data());
  // Predictions 0, 2, 1.
  EXPECT_EQ(mlp->Evaluate(params, images, std::vector<int32_t>{0, 2, 0}).correct, 2);
  const std::vector<int32_t> labels = {0, 2, 1};
  const Model::Evaluation all = mlp->Evaluate(params, images, labels);
  EXPECT_EQ(all.correct, 3);
  // The mean loss is the training loss of the same batch (no dropout or
  // batch norm here to tell the modes apart).
  std::vector<Tensor> grads;
  EXPECT_FLOAT_EQ(all.mean_loss, mlp->ComputeGradients(params, images, labels, &grads));
}

// Three classes, each a noisy copy of its own random 4x4 prototype: plain SGD
// must fit them quickly.
TEST(MlpTest, SgdReducesLossOnSeparableProblem) {
  std::unique_ptr<Model> mlp = MakeMlp(TinyOptions({16}));
  std::vector<Tensor> params;
  mlp->Initialize(11, &params);

  const int64_t batch = 30;
  std::mt19937_64 rng(12);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<std::vector<float>> prototypes(3, std::vector<float>(16));
  for (auto& p : prototypes) {
    for (float& x : p) x = uniform(rng) < 0.5f ? 0.0f : 1.0f;
  }
  Tensor images({batch, 16});
  std::vector<int32_t> labels(batch);
  std::normal_distribution<float> noise(0.0f, 0.1f);
  for (int64_t i = 0; i < batch; ++i) {
    labels[i] = static_cast<int32_t>(i % 3);
    for (int j = 0; j < 16; ++j) {
      images.data()[i * 16 + j] = prototypes[labels[i]][j] + noise(rng);
    }
  }

  std::vector<Tensor> grads;
  const float initial = mlp->ComputeGradients(params, images, labels, &grads);
  float loss = initial;
  constexpr float kLearningRate = 0.5f;
  for (int step = 0; step < 40; ++step) {
    loss = mlp->ComputeGradients(params, images, labels, &grads);
    for (size_t v = 0; v < params.size(); ++v) {
      for (int64_t j = 0; j < params[v].num_elements(); ++j) {
        params[v].data()[j] -= kLearningRate * grads[v].data()[j];
      }
    }
  }
  loss = mlp->ComputeGradients(params, images, labels, &grads);
  EXPECT_GT(initial, 0.8f);  // About log(3) at the start.
  EXPECT_LT(loss, 0.1f) << "initial loss " << initial;
  EXPECT_EQ(mlp->Evaluate(params, images, labels).correct, batch);
}

TEST(NewMlpTest, RejectsNonPositiveSizes) {
  ModelOptions options = TinyOptions({5, 0});
  absl::StatusOr<std::unique_ptr<Model>> mlp = NewMlp(options);
  EXPECT_EQ(mlp.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(mlp.status().message()),
              ::testing::HasSubstr("hidden_units"));
  options = TinyOptions({5});
  options.num_classes = 0;
  EXPECT_EQ(NewMlp(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = TinyOptions({5});
  options.input_width = -1;
  EXPECT_EQ(NewMlp(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MlpDeathTest, WrongParameterShape) {
  std::unique_ptr<Model> mlp = MakeMlp(TinyOptions({5}));
  std::vector<Tensor> params;
  mlp->Initialize(1, &params);
  params[2].Resize({3, 5});
  std::vector<Tensor> grads;
  EXPECT_DEATH(mlp->ComputeGradients(params, RandomImages(2, 16, 1),
                                     std::vector<int32_t>{0, 1}, &grads),
               "softmax_linear/weights has shape \\[3,5\\], want \\[5,3\\]");
}

}  // namespace
}  // namespace psrt
