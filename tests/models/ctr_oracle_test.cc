// Wide & Deep's and DLRM's loss, probabilities and gradients (dense
// variables and embedding rows) against PyTorch (float64) on a fixed batch:
// tests/data/oracle_ctr.safetensors, written by scripts/gen_oracle.py from
// its own description of the models. The parameters, rows, dense features
// and ids are not read from the fixture: both sides generate them with the
// same hash, as the script's CTR section documents (the fixture keeps the
// dense features, ids and distinct ids only to check that they agree).
// Agreement is "within 1e-4 relative", as in lenet_oracle_test.cc.
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "kernels/embedding_bag.h"
#include "models/model.h"
#include "models/sparse_features.h"
#include "tests/models/model_test_util.h"

namespace psrt {
namespace {

using testing::ExpectCloseToOracle;
using testing::OracleHashed;

// The script's CTR_* constants.
constexpr int64_t kBatch = 5;
constexpr int kDense = 3;
constexpr int kFields = 4;
constexpr int kDim = 4;

ModelOptions OracleOptions() {
  ModelOptions options;
  options.num_dense_features = kDense;
  options.num_sparse_fields = kFields;
  options.embedding_dim = kDim;
  options.hidden_units = {5};
  options.bottom_mlp_units = {5};
  options.top_mlp_units = {6};
  options.intra_op_threads = 2;
  return options;
}

// The script's ctr_batch(): ids[b * kFields + f] = 10 * f + floor(hash),
// then an id shared by examples 0 and 3 (field 1) and one twice in
// example 2 (fields 0 and 3).
std::vector<uint64_t> OracleIds() {
  std::vector<uint64_t> ids(kBatch * kFields);
  for (int64_t i = 0; i < kBatch * kFields; ++i) {
    ids[i] = 10 * (i % kFields) +
             static_cast<uint64_t>(std::floor(OracleHashed(1501, i, 0.0, 3.0)));
  }
  ids[3 * kFields + 1] = ids[0 * kFields + 1];
  ids[2 * kFields + 3] = ids[2 * kFields + 0];
  return ids;
}

void ExpectEqualTo(const std::vector<float>& ours, const Tensor& want, const std::string& what) {
  ASSERT_EQ(static_cast<int64_t>(ours.size()), want.num_elements()) << what;
  for (size_t i = 0; i < ours.size(); ++i) {
    ASSERT_EQ(ours[i], want.data()[i]) << what << " element " << i;
  }
}

class CtrOracleTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    absl::StatusOr<SafetensorsFile> file = ReadSafetensors(
        std::string(PSRT_SOURCE_DIR) + "/tests/data/oracle_ctr.safetensors");
    ASSERT_TRUE(file.ok()) << file.status();
    file_ = *std::move(file);
    for (const auto& [name, tensor] : file_.tensors) fixture_[name] = &tensor;
  }

  const Tensor& Get(const std::string& name) const {
    auto it = fixture_.find(name);
    CHECK(it != fixture_.end()) << "oracle_ctr.safetensors has no " << name;
    return *it->second;
  }

  SafetensorsFile file_;
  std::map<std::string, const Tensor*> fixture_;
};

TEST_P(CtrOracleTest, LossProbabilitiesAndGradientsMatchPyTorch) {
  const std::string& name = GetParam();
  // The script's hash base of the model (CTR_MODELS).
  const uint64_t base = name == "wide_deep" ? 2000 : 3200;
  absl::StatusOr<std::unique_ptr<Model>> model = NewModel(name, OracleOptions());
  ASSERT_TRUE(model.ok()) << model.status();

  Tensor dense({kBatch, kDense});
  for (int64_t i = 0; i < dense.num_elements(); ++i) {
    dense.data()[i] = OracleHashed(1500, i, 0.0, 2.0);
  }
  ExpectEqualTo(testing::ToVector(dense), Get("dense"), "dense");
  std::vector<int32_t> labels;
  for (float l : Get("labels").flat()) labels.push_back(static_cast<int32_t>(l));
  ASSERT_EQ(static_cast<int64_t>(labels.size()), kBatch);

  SparseFeatures features;
  features.num_fields = kFields;
  features.ids = OracleIds();
  kernels::Deduplicate(features.ids, &features.unique);
  ExpectEqualTo(std::vector<float>(features.ids.begin(), features.ids.end()), Get("ids"),
                "ids");
  const std::vector<uint64_t>& unique = features.unique.unique;
  ExpectEqualTo(std::vector<float>(unique.begin(), unique.end()), Get("unique"), "unique");
  const int64_t num_unique = static_cast<int64_t>(unique.size());
  // Rows with several contributions, within an example and across.
  ASSERT_LT(num_unique + 1, kBatch * kFields);
  const std::vector<TableDef>& tables = (*model)->tables();
  for (size_t t = 0; t < tables.size(); ++t) {
    Tensor rows({num_unique, tables[t].dim});
    for (int64_t i = 0; i < rows.num_elements(); ++i) {
      rows.data()[i] = OracleHashed(base + 100 + t, i, -0.5, 0.5);
    }
    features.rows.push_back(std::move(rows));
  }
  (*model)->SetSparseFeatures(&features);

  std::vector<Tensor> params;
  (*model)->Initialize(1, &params);
  for (size_t v = 0; v < params.size(); ++v) {
    const double scale = params[v].rank() == 2 ? 0.5 : 0.2;
    for (int64_t i = 0; i < params[v].num_elements(); ++i) {
      params[v].data()[i] = OracleHashed(base + v, i, -scale, scale);
    }
  }

  std::vector<Tensor> grads;
  const float loss = (*model)->ComputeGradients(params, dense, labels, &grads);
  ExpectCloseToOracle({loss}, Get(name + "/loss"), name + "/loss");
  ASSERT_EQ(grads.size(), params.size());
  for (size_t v = 0; v < grads.size(); ++v) {
    const std::string key = name + "/grad/" + (*model)->variables()[v].name;
    ExpectCloseToOracle(testing::ToVector(grads[v]), Get(key), key);
  }
  ASSERT_EQ(features.grads.size(), tables.size());
  for (size_t t = 0; t < tables.size(); ++t) {
    const std::string key = name + "/rows_grad/" + tables[t].name;
    EXPECT_EQ(features.grads[t].shape(), Get(key).shape()) << key;
    ExpectCloseToOracle(testing::ToVector(features.grads[t]), Get(key), key);
  }

  const Model::Evaluation eval = (*model)->Evaluate(params, dense, labels);
  ExpectCloseToOracle(eval.probabilities, Get(name + "/probabilities"),
                      name + "/probabilities");
  ExpectCloseToOracle({eval.mean_loss}, Get(name + "/loss"), name + "/mean_loss");
}

INSTANTIATE_TEST_SUITE_P(Models, CtrOracleTest, ::testing::Values("wide_deep", "dlrm"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace psrt
