// StepHooks (models/model.h): a model reads no variable before before_read
// has announced it, and a gradient that gradients_ready announced is
// final, for every model; the layered models announce layer by layer. And
// Evaluate leaves alone what the next training step sees.
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "models/model.h"
#include "tests/models/model_test_util.h"

namespace psrt {
namespace {

class StepHooksTest : public ::testing::TestWithParam<std::string> {
 protected:
  // Two fresh instances of the model, each at its first step (dropout masks
  // depend on the step).
  void MakeTwoModels(std::unique_ptr<Model>* a, std::unique_ptr<Model>* b) {
    ModelOptions options;
    options.input_height = options.input_width = 20;
    options.intra_op_threads = 2;
    for (std::unique_ptr<Model>* model : {a, b}) {
      absl::StatusOr<std::unique_ptr<Model>> made = NewModel(GetParam(), options);
      ASSERT_TRUE(made.ok()) << made.status();
      *model = *std::move(made);
    }
  }
};

TEST_P(StepHooksTest, VariablesAreReadOnlyAfterBeforeReadAndGradientsFinalWhenAnnounced) {
  std::unique_ptr<Model> model, hooked;
  ASSERT_NO_FATAL_FAILURE(MakeTwoModels(&model, &hooked));
  std::vector<Tensor> params, want;
  model->Initialize(1, &params);
  const Tensor images = testing::RandomImages(8, 400, 2);
  const std::vector<int32_t> labels = {0, 1, 2, 3, 4, 5, 6, 7};
  const float want_loss = model->ComputeGradients(params, images, labels, &want);
  const int n = static_cast<int>(params.size());

  // The step starts with every parameter poisoned; before_read fills in the
  // true values of the variables it announces, as a pull arriving would.
  std::vector<Tensor> poisoned, grads;
  model->Initialize(1, &poisoned);
  for (Tensor& t : poisoned) {
    for (float& x : t.flat()) x = 1e30f;
  }
  std::vector<int> read(n, 0), ready(n, 0);
  std::vector<std::vector<float>> announced(n);
  std::vector<std::pair<int, int>> read_calls, ready_calls;
  StepHooks hooks;
  hooks.before_read = [&](int begin, int end) {
    read_calls.emplace_back(begin, end);
    for (int v = begin; v < end; ++v) {
      ++read[v];
      std::copy_n(params[v].data(), params[v].num_elements(), poisoned[v].data());
    }
  };
  std::vector<float> losses;
  hooks.loss_ready = [&](float loss) {
    EXPECT_TRUE(ready_calls.empty()) << "the loss comes before any gradient";
    losses.push_back(loss);
  };
  hooks.gradients_ready = [&](int begin, int end) {
    ready_calls.emplace_back(begin, end);
    for (int v = begin; v < end; ++v) {
      ++ready[v];
      announced[v] = testing::ToVector(grads[v]);  // As a push would send it.
    }
  };
  const float loss = hooked->ComputeGradients(poisoned, images, labels, &grads, hooks);
  EXPECT_EQ(loss, want_loss);
  EXPECT_EQ(losses, std::vector<float>{want_loss});
  for (int v = 0; v < n; ++v) {
    EXPECT_EQ(read[v], 1) << model->variables()[v].name;
    EXPECT_EQ(ready[v], 1) << model->variables()[v].name;
    EXPECT_EQ(announced[v], testing::ToVector(want[v])) << model->variables()[v].name;
    EXPECT_EQ(testing::ToVector(grads[v]), testing::ToVector(want[v]));
  }
  // Layer by layer: forward in variable order, backward in reverse.
  EXPECT_GT(read_calls.size(), 1u);
  EXPECT_GT(ready_calls.size(), 1u);
  for (size_t i = 1; i < read_calls.size(); ++i) {
    EXPECT_EQ(read_calls[i].first, read_calls[i - 1].second);
  }
  for (size_t i = 1; i < ready_calls.size(); ++i) {
    EXPECT_EQ(ready_calls[i].second, ready_calls[i - 1].first);
  }
  EXPECT_EQ(ready_calls.front().second, n);
  EXPECT_EQ(ready_calls.back().first, 0);
}

// An evaluation between two training steps changes nothing the next step
// sees: no batch-norm statistics, no dropout mask (inception_v3 drops out).
TEST_P(StepHooksTest, EvaluateLeavesTrainingStateAlone) {
  std::unique_ptr<Model> plain, evaluated;
  ASSERT_NO_FATAL_FAILURE(MakeTwoModels(&plain, &evaluated));
  std::vector<Tensor> params, want, got;
  plain->Initialize(1, &params);
  const Tensor images = testing::RandomImages(8, 400, 2);
  const Tensor test_images = testing::RandomImages(8, 400, 3);
  const std::vector<int32_t> labels = {0, 1, 2, 3, 4, 5, 6, 7};
  plain->ComputeGradients(params, images, labels, &want);
  evaluated->ComputeGradients(params, images, labels, &got);
  const Model::Evaluation evaluation = evaluated->Evaluate(params, test_images, labels);
  EXPECT_TRUE(std::isfinite(evaluation.mean_loss));
  EXPECT_GE(evaluation.correct, 0);
  // The second step (and, through batch norm, the second evaluation).
  const float want_loss = plain->ComputeGradients(params, images, labels, &want);
  const float got_loss = evaluated->ComputeGradients(params, images, labels, &got);
  EXPECT_EQ(got_loss, want_loss);
  for (size_t v = 0; v < want.size(); ++v) {
    EXPECT_EQ(testing::ToVector(got[v]), testing::ToVector(want[v]))
        << plain->variables()[v].name;
  }
  EXPECT_EQ(plain->Evaluate(params, test_images, labels).mean_loss,
            evaluated->Evaluate(params, test_images, labels).mean_loss);
}

INSTANTIATE_TEST_SUITE_P(Models, StepHooksTest,
                         ::testing::Values("mlp", "lenet", "inception_mini"));

}  // namespace
}  // namespace psrt
