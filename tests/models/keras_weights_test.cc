// A Keras model file's weights to and from Keras's .weights.h5
// (models/keras_weights.h): the files Keras wrote for the fixtures of
// scripts/gen_keras_fixtures.py (NAME_keras3.weights.h5, beside the same
// weights under psrt's names in NAME_keras3.safetensors) read back exactly,
// written back as they were read, and the mismatches refused by name.
#include "models/keras_weights.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/keras_model.h"
#include "models/keras_weights_file.h"
#include "tests/models/model_test_util.h"

namespace psrt {
namespace {

using testing::KerasFixture;
using testing::ReadText;

using ::testing::HasSubstr;

// Every kind of layer with weights that psrt reads: plain and fused batch
// norms (with and without scale or center), biases or none, Dense on a
// vector and per pixel, DepthwiseConv2D, SeparableConv2D, a grouped
// Conv2D, LayerNormalization, LayerScale, adapt()'s Normalization, and a
// nested Sequential.
const char* const kModels[] = {"plain_cnn", "residual_block", "app_blocks",    "depthwise",
                               "squeeze_excite", "binary",   "convnext_block"};

std::string TestDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string dir = ::testing::TempDir() + "keras_weights_test_" + info->name();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::vector<VariableDef> Variables(const std::string& json, const std::string& file) {
  absl::StatusOr<std::unique_ptr<Model>> model = NewKerasModel(json, file, ModelOptions());
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? (*model)->variables() : std::vector<VariableDef>();
}

bool SameBits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.num_bytes()) == 0;
}

// Keras's file (of a compiled model: with its optimizer's variables) gives
// every variable the value that Keras held, bit for bit (the fixture's
// safetensors has them under psrt's names, moving statistics included).
TEST(KerasWeightsTest, ReadsKerassFilesExactly) {
  for (const char* name : kModels) {
    SCOPED_TRACE(name);
    const std::string model_file = KerasFixture(absl::StrCat(name, "_keras3.json"));
    const std::string json = ReadText(model_file);
    absl::StatusOr<std::vector<Tensor>> values =
        ReadKerasWeightsOfModel(json, model_file, KerasFixture(absl::StrCat(name, "_keras3.weights.h5")));
    ASSERT_TRUE(values.ok()) << values.status();
    absl::StatusOr<SafetensorsFile> keras =
        ReadSafetensors(KerasFixture(absl::StrCat(name, "_keras3.safetensors")));
    ASSERT_TRUE(keras.ok()) << keras.status();
    std::map<std::string, const Tensor*> by_name;
    for (const auto& [key, tensor] : keras->tensors) by_name[key] = &tensor;
    const std::vector<VariableDef> variables = Variables(json, model_file);
    ASSERT_EQ(values->size(), variables.size());
    for (size_t v = 0; v < variables.size(); ++v) {
      ASSERT_EQ(by_name.count(variables[v].name), 1u) << variables[v].name;
      EXPECT_TRUE(SameBits((*values)[v], *by_name.at(variables[v].name))) << variables[v].name;
    }
  }
}

// Written back, the file holds what Keras's did: the same paths and bits
// (so Keras's model.load_weights takes it as its own; scripts/
// keras_round_trip.sh has Keras load one).
TEST(KerasWeightsTest, WritesWhatKerasWrote) {
  const std::string dir = TestDir();
  for (const char* name : kModels) {
    SCOPED_TRACE(name);
    const std::string model_file = KerasFixture(absl::StrCat(name, "_keras3.json"));
    const std::string keras_file = KerasFixture(absl::StrCat(name, "_keras3.weights.h5"));
    const std::string json = ReadText(model_file);
    absl::StatusOr<std::vector<Tensor>> values = ReadKerasWeightsOfModel(json, model_file, keras_file);
    ASSERT_TRUE(values.ok()) << values.status();
    const std::vector<VariableDef> variables = Variables(json, model_file);
    std::map<std::string, const Tensor*> by_name;
    for (size_t v = 0; v < variables.size(); ++v) by_name[variables[v].name] = &(*values)[v];
    const std::string ours = absl::StrCat(dir, "/", name, ".weights.h5");
    ASSERT_TRUE(WriteKerasWeightsOfModel(
                    json, model_file,
                    [&](const std::string& var) {
                      auto it = by_name.find(var);
                      return it == by_name.end() ? nullptr : it->second;
                    },
                    ours)
                    .ok());
    absl::StatusOr<std::vector<KerasWeightsEntry>> want = ReadKerasWeights(keras_file);
    absl::StatusOr<std::vector<KerasWeightsEntry>> got = ReadKerasWeights(ours);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    // Keras's file is of a compiled model: its optimizer's variables are not
    // the model's.
    want->erase(std::remove_if(want->begin(), want->end(),
                               [](const KerasWeightsEntry& e) {
                                 return absl::StartsWith(e.path, "optimizer");
                               }),
                want->end());
    ASSERT_EQ(got->size(), want->size());
    for (size_t e = 0; e < want->size(); ++e) {
      const KerasWeightsEntry& w = (*want)[e];
      const KerasWeightsEntry& g = (*got)[e];
      EXPECT_EQ(g.path, w.path);
      ASSERT_EQ(g.vars.size(), w.vars.size()) << w.path;
      for (size_t k = 0; k < w.vars.size(); ++k) {
        EXPECT_TRUE(SameBits(g.vars[k], w.vars[k])) << w.path << " weight " << k;
      }
    }
  }
}

// Another model's weights, a weight of another shape, a missing value:
// refused, naming the layer or variable, and nothing written.
TEST(KerasWeightsTest, RefusesMismatchesByName) {
  const std::string residual = KerasFixture("residual_block_keras3.json");
  absl::StatusOr<std::vector<Tensor>> other =
      ReadKerasWeightsOfModel(ReadText(residual), residual, KerasFixture("plain_cnn_keras3.weights.h5"));
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(other.status().message(), HasSubstr("plain_cnn_keras3.weights.h5"));
  EXPECT_THAT(other.status().message(), HasSubstr("layer \""));

  // The same layers, one wider: the shape is named.
  const std::string plain = KerasFixture("plain_cnn_keras3.json");
  const std::string json = ReadText(plain);
  const std::string dir = TestDir();
  absl::StatusOr<std::vector<KerasWeightsEntry>> entries =
      ReadKerasWeights(KerasFixture("plain_cnn_keras3.weights.h5"));
  ASSERT_TRUE(entries.ok()) << entries.status();
  for (KerasWeightsEntry& entry : *entries) {
    if (entry.vars.size() == 2 && entry.vars[1].num_elements() > 1) {
      entry.vars[1] = Tensor({entry.vars[1].num_elements() + 1});
      ASSERT_TRUE(WriteKerasWeights(dir + "/wider.weights.h5", *entries).ok());
      break;
    }
  }
  absl::StatusOr<std::vector<Tensor>> wider =
      ReadKerasWeightsOfModel(json, plain, dir + "/wider.weights.h5");
  ASSERT_FALSE(wider.ok());
  EXPECT_THAT(wider.status().message(), HasSubstr("weight 1 has shape"));

  const std::string out = dir + "/none.weights.h5";
  const absl::Status missing = WriteKerasWeightsOfModel(
      json, plain, [](const std::string&) -> const Tensor* { return nullptr; }, out);
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("/weights\""));
  EXPECT_FALSE(std::filesystem::exists(out));
}

}  // namespace
}  // namespace psrt
