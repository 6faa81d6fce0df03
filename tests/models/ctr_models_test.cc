#include "models/ctr_models.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/embedding_bag.h"
#include "models/model.h"
#include "tests/models/model_test_util.h"

namespace psrt {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kDense = 3;
constexpr int kFields = 4;
constexpr int kDim = 4;

// The tiny configuration of the gradient checks.
ModelOptions TinyOptions() {
  ModelOptions options;
  options.num_dense_features = kDense;
  options.num_sparse_fields = kFields;
  options.embedding_dim = kDim;
  options.hidden_units = {6, 5};
  options.bottom_mlp_units = {5};
  options.top_mlp_units = {6};
  options.intra_op_threads = 1;
  return options;
}

std::unique_ptr<Model> MakeModel(const std::string& name, const ModelOptions& options) {
  absl::StatusOr<std::unique_ptr<Model>> model = NewModel(name, options);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *std::move(model) : nullptr;
}

// An id keyed by its field, as Criteo's reader makes them.
uint64_t FieldId(int field, uint64_t value) { return (uint64_t{1} << 33) * field | value; }

// Fills features from ids (deduplicated here) with rows from `table`, each
// table's rows kept per id (what the ps would hold): a missing id gets a
// row from `rng`.
using FakeTables = std::vector<std::map<uint64_t, std::vector<float>>>;
void Pull(const Model& model, std::vector<uint64_t> ids, FakeTables* tables,
          std::mt19937_64* rng, SparseFeatures* features) {
  features->num_fields = kFields;
  features->ids = std::move(ids);
  kernels::Deduplicate(features->ids, &features->unique);
  const int64_t unique = static_cast<int64_t>(features->unique.unique.size());
  tables->resize(model.tables().size());
  features->rows.resize(model.tables().size());
  std::uniform_real_distribution<float> dist(-0.5f, 0.5f);
  for (size_t t = 0; t < model.tables().size(); ++t) {
    const int dim = model.tables()[t].dim;
    features->rows[t] = Tensor({unique, dim});
    for (int64_t u = 0; u < unique; ++u) {
      std::vector<float>& row = (*tables)[t][features->unique.unique[u]];
      if (row.empty()) {
        row.resize(dim);
        for (float& x : row) x = dist(*rng);
      }
      std::copy(row.begin(), row.end(), features->rows[t].data() + u * dim);
    }
  }
}

// Pushes the rows' gradients back with SGD.
void ApplyRowGradients(float lr, const SparseFeatures& features, FakeTables* tables) {
  for (size_t t = 0; t < tables->size(); ++t) {
    const Tensor& grads = features.grads[t];
    const int64_t dim = grads.dim(1);
    for (size_t u = 0; u < features.unique.unique.size(); ++u) {
      std::vector<float>& row = (*tables)[t][features.unique.unique[u]];
      for (int64_t j = 0; j < dim; ++j) row[j] -= lr * grads.data()[u * dim + j];
    }
  }
}

// A batch of the tiny configuration: kFields ids per example from 3
// values per field (so that ids repeat), and example 3 repeating example
// 0's field 1 for certain.
struct Batch {
  Tensor dense;
  std::vector<int32_t> labels;
  SparseFeatures features;
  FakeTables tables;
};

Batch TinyBatch(const Model& model, int64_t size, uint64_t seed) {
  Batch batch;
  std::mt19937_64 rng(seed);
  batch.dense = testing::RandomImages(size, kDense, seed);
  std::vector<uint64_t> ids(size * kFields);
  for (int64_t b = 0; b < size; ++b) {
    batch.labels.push_back(static_cast<int32_t>(rng() % 2));
    for (int f = 0; f < kFields; ++f) ids[b * kFields + f] = FieldId(f, rng() % 3);
  }
  if (size > 3) ids[3 * kFields + 1] = ids[0 * kFields + 1];
  Pull(model, std::move(ids), &batch.tables, &rng, &batch.features);
  return batch;
}

class CtrModelTest : public ::testing::TestWithParam<std::string> {};

// Central differences of the loss against `analytic` for every element of
// `x`; a coordinate that misses (a ReLU kink crossed) is retried with a
// step 4 times smaller.
void CheckAgainstDifferences(const std::string& what, float* x, int64_t n,
                             const std::vector<float>& analytic,
                             const std::function<double()>& loss) {
  ASSERT_EQ(static_cast<int64_t>(analytic.size()), n) << what;
  for (int64_t j = 0; j < n; ++j) {
    const float saved = x[j];
    auto numeric_at = [&](float h) {
      x[j] = saved + h;
      const double plus = loss();
      x[j] = saved - h;
      const double minus = loss();
      x[j] = saved;
      return (plus - minus) / (2.0 * h);
    };
    auto tolerance = [](double numeric) { return 1e-4 + 1e-2 * std::abs(numeric); };
    double numeric = numeric_at(1e-2f);
    if (std::abs(analytic[j] - numeric) > tolerance(numeric)) numeric = numeric_at(2.5e-3f);
    EXPECT_NEAR(analytic[j], numeric, tolerance(numeric)) << what << " element " << j;
  }
}

TEST_P(CtrModelTest, GradientsMatchDifferences) {
  std::unique_ptr<Model> model = MakeModel(GetParam(), TinyOptions());
  ASSERT_NE(model, nullptr);
  Batch batch = TinyBatch(*model, 5, 11);
  // A row with two contributions from different examples.
  ASSERT_LT(batch.features.unique.unique.size(), batch.features.ids.size());
  model->SetSparseFeatures(&batch.features);
  std::vector<Tensor> params;
  model->Initialize(3, &params);
  // Biases away from their initial zeros, so that their gradients are
  // tested at a general point.
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> dist(-0.2f, 0.2f);
  for (Tensor& p : params) {
    if (p.rank() == 1) {
      for (float& b : p.flat()) b += dist(rng);
    }
  }
  std::vector<Tensor> grads;
  model->ComputeGradients(params, batch.dense, batch.labels, &grads);
  ASSERT_EQ(grads.size(), params.size());
  ASSERT_EQ(batch.features.grads.size(), model->tables().size());
  std::vector<std::vector<float>> row_grads;
  for (size_t t = 0; t < model->tables().size(); ++t) {
    const Tensor& g = batch.features.grads[t];
    EXPECT_EQ(g.shape(), (Shape{static_cast<int64_t>(batch.features.unique.unique.size()),
                                model->tables()[t].dim}));
    row_grads.push_back(testing::ToVector(g));
  }
  std::vector<Tensor> scratch;
  auto loss = [&] {
    return model->ComputeGradients(params, batch.dense, batch.labels, &scratch);
  };
  for (size_t v = 0; v < params.size(); ++v) {
    CheckAgainstDifferences(model->variables()[v].name, params[v].data(),
                            params[v].num_elements(), testing::ToVector(grads[v]), loss);
  }
  for (size_t t = 0; t < model->tables().size(); ++t) {
    Tensor& rows = batch.features.rows[t];
    CheckAgainstDifferences("table " + model->tables()[t].name, rows.data(),
                            rows.num_elements(), row_grads[t], loss);
  }
}

TEST_P(CtrModelTest, EvaluateGivesTheProbabilitiesOfTheLoss) {
  std::unique_ptr<Model> model = MakeModel(GetParam(), TinyOptions());
  ASSERT_NE(model, nullptr);
  Batch batch = TinyBatch(*model, 7, 12);
  model->SetSparseFeatures(&batch.features);
  std::vector<Tensor> params, grads;
  model->Initialize(4, &params);
  const float loss = model->ComputeGradients(params, batch.dense, batch.labels, &grads);
  const Model::Evaluation eval = model->Evaluate(params, batch.dense, batch.labels);
  ASSERT_EQ(eval.probabilities.size(), 7u);
  double sum = 0;
  int64_t correct = 0;
  for (size_t b = 0; b < eval.probabilities.size(); ++b) {
    const double p = eval.probabilities[b];
    ASSERT_GT(p, 0);
    ASSERT_LT(p, 1);
    sum += batch.labels[b] == 1 ? -std::log(p) : -std::log(1 - p);
    correct += (p >= 0.5) == (batch.labels[b] == 1);
  }
  EXPECT_NEAR(eval.mean_loss, sum / 7, 1e-5);
  EXPECT_NEAR(eval.mean_loss, loss, 1e-6);
  EXPECT_EQ(eval.correct, correct);
}

// Labels that a field's id decides: field 0's value is 0 or 1 for clicks.
TEST_P(CtrModelTest, SgdLowersTheLossOfASeparableProblem) {
  ModelOptions options = TinyOptions();
  std::unique_ptr<Model> model = MakeModel(GetParam(), options);
  ASSERT_NE(model, nullptr);
  constexpr int64_t kBatch = 32;
  std::mt19937_64 rng(21);
  const Tensor dense = testing::RandomImages(kBatch, kDense, 22);
  std::vector<uint64_t> ids(kBatch * kFields);
  std::vector<int32_t> labels(kBatch);
  for (int64_t b = 0; b < kBatch; ++b) {
    for (int f = 0; f < kFields; ++f) ids[b * kFields + f] = FieldId(f, rng() % 4);
    labels[b] = ids[b * kFields] % 4 < 2 ? 1 : 0;
  }
  FakeTables tables;
  std::vector<Tensor> params, grads;
  model->Initialize(1, &params);
  constexpr float kLr = 0.3f;
  float first = 0, last = 0;
  for (int step = 0; step < 100; ++step) {
    SparseFeatures features;
    Pull(*model, ids, &tables, &rng, &features);
    model->SetSparseFeatures(&features);
    last = model->ComputeGradients(params, dense, labels, &grads);
    if (step == 0) first = last;
    for (size_t v = 0; v < params.size(); ++v) {
      for (int64_t j = 0; j < params[v].num_elements(); ++j) {
        params[v].data()[j] -= kLr * grads[v].data()[j];
      }
    }
    ApplyRowGradients(kLr, features, &tables);
  }
  EXPECT_LT(last, 0.25f * first) << "first " << first << ", last " << last;
}

TEST_P(CtrModelTest, AnnouncesEveryVariableAtOnce) {
  std::unique_ptr<Model> model = MakeModel(GetParam(), TinyOptions());
  ASSERT_NE(model, nullptr);
  Batch batch = TinyBatch(*model, 5, 13);
  model->SetSparseFeatures(&batch.features);
  std::vector<Tensor> params, grads;
  model->Initialize(1, &params);
  std::vector<std::string> calls;
  StepHooks hooks;
  hooks.before_read = [&](int b, int e) { calls.push_back(absl::StrCat("read ", b, " ", e)); };
  float announced = -1;
  hooks.loss_ready = [&](float loss) {
    announced = loss;
    calls.push_back("loss");
  };
  hooks.gradients_ready = [&](int b, int e) {
    calls.push_back(absl::StrCat("ready ", b, " ", e));
  };
  const float loss = model->ComputeGradients(params, batch.dense, batch.labels, &grads, hooks);
  const std::string n = std::to_string(model->variables().size());
  EXPECT_THAT(calls, ElementsAre("read 0 " + n, "loss", "ready 0 " + n));
  EXPECT_EQ(announced, loss);
}

TEST_P(CtrModelTest, SameSeedSameInitialValues) {
  std::unique_ptr<Model> model = MakeModel(GetParam(), TinyOptions());
  ASSERT_NE(model, nullptr);
  std::vector<Tensor> a, b, c;
  model->Initialize(7, &a);
  MakeModel(GetParam(), TinyOptions())->Initialize(7, &b);
  model->Initialize(8, &c);
  ASSERT_EQ(a.size(), model->variables().size());
  bool differs = false;
  for (size_t v = 0; v < a.size(); ++v) {
    EXPECT_EQ(a[v].shape(), model->variables()[v].shape);
    EXPECT_EQ(testing::ToVector(a[v]), testing::ToVector(b[v])) << model->variables()[v].name;
    differs |= testing::ToVector(a[v]) != testing::ToVector(c[v]);
    if (a[v].rank() == 1) {
      for (float x : a[v].flat()) EXPECT_EQ(x, 0) << model->variables()[v].name;
    }
  }
  EXPECT_TRUE(differs);
}

TEST_P(CtrModelTest, SecondStepReusesItsBuffers) {
  ModelOptions options = TinyOptions();
  options.intra_op_threads = 2;
  std::unique_ptr<Model> model = MakeModel(GetParam(), options);
  ASSERT_NE(model, nullptr);
  Batch batch = TinyBatch(*model, 40, 14);
  model->SetSparseFeatures(&batch.features);
  std::vector<Tensor> params, grads;
  model->Initialize(1, &params);
  model->ComputeGradients(params, batch.dense, batch.labels, &grads);
  const int64_t reserved = model->device_memory().bytes_reserved;
  EXPECT_GT(reserved, 0);
  const float* grad = grads[0].data();
  const float* row_grad = batch.features.grads[0].data();
  model->ComputeGradients(params, batch.dense, batch.labels, &grads);
  EXPECT_EQ(model->device_memory().bytes_reserved, reserved);
  EXPECT_EQ(grads[0].data(), grad);
  EXPECT_EQ(batch.features.grads[0].data(), row_grad);
}

TEST_P(CtrModelTest, ThreadsDoNotChangeTheGradients) {
  ModelOptions options = TinyOptions();
  std::unique_ptr<Model> one = MakeModel(GetParam(), options);
  options.intra_op_threads = 2;
  std::unique_ptr<Model> two = MakeModel(GetParam(), options);
  ASSERT_NE(one, nullptr);
  ASSERT_NE(two, nullptr);
  Batch batch = TinyBatch(*one, 40, 15);
  std::vector<Tensor> params, grads1, grads2;
  one->Initialize(1, &params);
  one->SetSparseFeatures(&batch.features);
  const float loss1 = one->ComputeGradients(params, batch.dense, batch.labels, &grads1);
  const std::vector<float> rows1 = testing::ToVector(batch.features.grads[0]);
  two->SetSparseFeatures(&batch.features);
  const float loss2 = two->ComputeGradients(params, batch.dense, batch.labels, &grads2);
  EXPECT_NEAR(loss1, loss2, 1e-6);
  for (size_t v = 0; v < grads1.size(); ++v) {
    EXPECT_THAT(testing::ToVector(grads2[v]),
                ::testing::Pointwise(::testing::FloatNear(1e-6f), testing::ToVector(grads1[v])));
  }
  EXPECT_THAT(testing::ToVector(batch.features.grads[0]),
              ::testing::Pointwise(::testing::FloatNear(1e-6f), rows1));
}

TEST_P(CtrModelTest, RefusesAGpu) {
  ModelOptions options = TinyOptions();
  options.device.type = kernels::DeviceType::kGpu;
  absl::StatusOr<std::unique_ptr<Model>> model = NewModel(GetParam(), options);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(model.status().message()),
              HasSubstr(GetParam() + " runs on the CPU only for now"));
}

TEST_P(CtrModelTest, RefusesSizesThatAreNotPositive) {
  struct Case {
    const char* option;
    void (*spoil)(ModelOptions*);
  };
  const Case cases[] = {
      {"num_dense_features", [](ModelOptions* o) { o->num_dense_features = 0; }},
      {"num_sparse_fields", [](ModelOptions* o) { o->num_sparse_fields = 0; }},
      {"embedding_dim", [](ModelOptions* o) { o->embedding_dim = -1; }},
      // Longer than a table's row may be (it crashed allocating 25 GB).
      {"embedding_dim", [](ModelOptions* o) { o->embedding_dim = 100000000; }},
      {"hidden_units", [](ModelOptions* o) { o->hidden_units = {4, 0}; }},
      {"bottom_mlp_units", [](ModelOptions* o) { o->bottom_mlp_units = {0}; }},
      {"top_mlp_units", [](ModelOptions* o) { o->top_mlp_units = {8, -2}; }},
  };
  for (const Case& c : cases) {
    const std::string option = c.option;
    // Each model reads only its own MLPs' units.
    const bool read = GetParam() == "wide_deep" ? option.find("mlp") == std::string::npos
                                                : option != "hidden_units";
    ModelOptions options = TinyOptions();
    c.spoil(&options);
    absl::StatusOr<std::unique_ptr<Model>> model = NewModel(GetParam(), options);
    if (!read) {
      EXPECT_TRUE(model.ok()) << option << ": " << model.status();
      continue;
    }
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << option;
    EXPECT_THAT(std::string(model.status().message()), HasSubstr(option));
  }
}

TEST_P(CtrModelTest, WithoutSparseFeaturesDies) {
  std::unique_ptr<Model> model = MakeModel(GetParam(), TinyOptions());
  ASSERT_NE(model, nullptr);
  std::vector<Tensor> params, grads;
  model->Initialize(1, &params);
  const Tensor dense = testing::RandomImages(2, kDense, 1);
  const std::vector<int32_t> labels = {0, 1};
  EXPECT_DEATH(model->ComputeGradients(params, dense, labels, &grads), "SetSparseFeatures");
  EXPECT_DEATH(model->Evaluate(params, dense, labels), "SetSparseFeatures");
}

INSTANTIATE_TEST_SUITE_P(Models, CtrModelTest, ::testing::Values("wide_deep", "dlrm"));

std::vector<std::string> Names(const std::vector<VariableDef>& vars) {
  std::vector<std::string> names;
  for (const VariableDef& v : vars) names.push_back(v.name + ShapeToString(v.shape));
  return names;
}

TEST(WideDeepTest, VariablesAndTables) {
  std::unique_ptr<Model> model = MakeModel("wide_deep", TinyOptions());
  ASSERT_NE(model, nullptr);
  // The deep MLP reads 3 dense features and 4 rows of 4.
  EXPECT_THAT(Names(model->variables()),
              ElementsAre("wide/dense_weights[3,1]", "wide/bias[1]",
                          "deep_mlp/layer0/weights[19,6]", "deep_mlp/layer0/biases[6]",
                          "deep_mlp/layer1/weights[6,5]", "deep_mlp/layer1/biases[5]",
                          "deep_mlp/layer2/weights[5,1]", "deep_mlp/layer2/biases[1]"));
  ASSERT_EQ(model->tables().size(), 2u);
  EXPECT_EQ(model->tables()[0].name, "wide");
  EXPECT_EQ(model->tables()[0].dim, 1);
  EXPECT_EQ(model->tables()[1].name, "deep");
  EXPECT_EQ(model->tables()[1].dim, kDim);
  EXPECT_EQ(model->device_name(), "cpu (1 threads)");
}

TEST(DlrmTest, VariablesAndTables) {
  std::unique_ptr<Model> model = MakeModel("dlrm", TinyOptions());
  ASSERT_NE(model, nullptr);
  // 5 vectors (the bottom output and 4 rows) make 10 pairs; the top MLP
  // reads them and the bottom output.
  EXPECT_THAT(Names(model->variables()),
              ElementsAre("bottom_mlp/layer0/weights[3,5]", "bottom_mlp/layer0/biases[5]",
                          "bottom_mlp/layer1/weights[5,4]", "bottom_mlp/layer1/biases[4]",
                          "top_mlp/layer0/weights[14,6]", "top_mlp/layer0/biases[6]",
                          "top_mlp/layer1/weights[6,1]", "top_mlp/layer1/biases[1]"));
  ASSERT_EQ(model->tables().size(), 1u);
  EXPECT_EQ(model->tables()[0].name, "embeddings");
  EXPECT_EQ(model->tables()[0].dim, kDim);
}

// Sizes that matter: DLRM's published Criteo Kaggle configuration
// (13 dense, 26 fields, dim 16, bottom 512-256-64, top 512-256).
TEST(DlrmTest, KaggleConfigurationShapes) {
  ModelOptions options;
  options.bottom_mlp_units = {512, 256, 64};
  options.top_mlp_units = {512, 256};
  std::unique_ptr<Model> model = MakeModel("dlrm", options);
  ASSERT_NE(model, nullptr);
  const std::vector<VariableDef>& vars = model->variables();
  ASSERT_EQ(vars.size(), 14u);
  EXPECT_EQ(vars[6].shape, (Shape{64, 16}));
  // 16 + 27 * 26 / 2 = 367 inputs.
  EXPECT_EQ(vars[8].name, "top_mlp/layer0/weights");
  EXPECT_EQ(vars[8].shape, (Shape{367, 512}));
}

}  // namespace
}  // namespace psrt
