// Keras model files (models/keras_model.h): the fixtures of
// scripts/gen_keras_fixtures.py, each written by Keras 3 and by Keras 2
// (tests/data/keras/), against Keras's own parameter counts, psrt's
// built-in lenet, finite differences, and the errors a user meets.
#include "models/keras_model.h"

#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/model.h"
#include "tests/gpu_test_util.h"
#include "tests/models/model_test_util.h"

namespace psrt {
namespace {

using testing::KerasFixture;
using testing::ReadText;

using testing::CheckSampledGradients;
using ::testing::HasSubstr;
using testing::RandomImages;

absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& file, int threads = 2) {
  ModelOptions options;
  options.intra_op_threads = threads;
  return NewKerasModel(ReadText(KerasFixture(file)), file, options);
}

double Norm(const Tensor& t) {
  double sum = 0;
  for (float x : t.flat()) sum += double(x) * x;
  return std::sqrt(sum);
}

// A fixture's tensors by name.
std::map<std::string, const Tensor*> ByName(const SafetensorsFile& file) {
  std::map<std::string, const Tensor*> tensors;
  for (const auto& [key, tensor] : file.tensors) tensors[key] = &tensor;
  return tensors;
}

class KerasFormatTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::string File(const std::string& model) const {
    return absl::StrCat(model, "_", GetParam(), ".json");
  }
};

INSTANTIATE_TEST_SUITE_P(Formats, KerasFormatTest, ::testing::Values("keras3", "keras2"));

TEST_P(KerasFormatTest, ModelsHaveKerasParameterCountsAndShapes) {
  struct Expected {
    const char* model;
    KerasModelShape shape;
    size_t variables;
  };
  for (const Expected& e :
       {Expected{"mnist_convnet", {28, 28, 1, 10}, 6},
        Expected{"residual_block", {16, 16, 3, 5}, 24}, Expected{"lenet", {28, 28, 1, 10}, 8}}) {
    const std::string file = File(e.model);
    absl::StatusOr<KerasModelShape> shape = ReadKerasModelShape(ReadText(KerasFixture(file)), file);
    ASSERT_TRUE(shape.ok()) << shape.status();
    EXPECT_EQ(shape->input_height, e.shape.input_height) << file;
    EXPECT_EQ(shape->input_width, e.shape.input_width) << file;
    EXPECT_EQ(shape->input_channels, e.shape.input_channels) << file;
    EXPECT_EQ(shape->num_classes, e.shape.num_classes) << file;
    absl::StatusOr<std::unique_ptr<Model>> model = Load(file);
    ASSERT_TRUE(model.ok()) << model.status();
    int64_t keras_count = 0;
    ASSERT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadText(
                                     KerasFixture(absl::StrCat(e.model, "_", GetParam(), ".params")))),
                                 &keras_count));
    EXPECT_EQ(CountParameters(**model).all, keras_count) << file;
    EXPECT_EQ((*model)->variables().size(), e.variables) << file;
  }
}

// The Keras lenet has the built-in's layers and names: with the same
// parameters, the same loss and gradients, bit for bit.
TEST_P(KerasFormatTest, TheKerasLenetComputesAsTheBuiltIn) {
  absl::StatusOr<std::unique_ptr<Model>> keras = Load(File("lenet"));
  ASSERT_TRUE(keras.ok()) << keras.status();
  ModelOptions options;
  options.intra_op_threads = 2;
  absl::StatusOr<std::unique_ptr<Model>> builtin = NewModel("lenet", options);
  ASSERT_TRUE(builtin.ok()) << builtin.status();
  ASSERT_EQ((*keras)->variables().size(), (*builtin)->variables().size());
  for (size_t v = 0; v < (*keras)->variables().size(); ++v) {
    EXPECT_EQ((*keras)->variables()[v].name, (*builtin)->variables()[v].name);
    EXPECT_EQ((*keras)->variables()[v].shape, (*builtin)->variables()[v].shape);
  }
  std::vector<Tensor> params, keras_grads, builtin_grads;
  (*builtin)->Initialize(3, &params);
  const Tensor images = RandomImages(8, 28 * 28, 4);
  const std::vector<int32_t> labels = {0, 1, 2, 3, 4, 5, 6, 7};
  const float keras_loss = (*keras)->ComputeGradients(params, images, labels, &keras_grads);
  const float builtin_loss = (*builtin)->ComputeGradients(params, images, labels, &builtin_grads);
  EXPECT_EQ(keras_loss, builtin_loss);
  for (size_t v = 0; v < params.size(); ++v) {
    EXPECT_EQ(testing::ToVector(keras_grads[v]), testing::ToVector(builtin_grads[v]))
        << (*builtin)->variables()[v].name;
  }
}

// Keras 3's and Keras 2's files of one model build the same network.
TEST(KerasModelTest, BothFormatsBuildTheSameNetwork) {
  for (const char* model : {"mnist_convnet", "residual_block"}) {
    absl::StatusOr<std::unique_ptr<Model>> k3 = Load(absl::StrCat(model, "_keras3.json"));
    absl::StatusOr<std::unique_ptr<Model>> k2 = Load(absl::StrCat(model, "_keras2.json"));
    ASSERT_TRUE(k3.ok() && k2.ok()) << k3.status() << " " << k2.status();
    ASSERT_EQ((*k3)->variables().size(), (*k2)->variables().size());
    std::vector<Tensor> params, g3, g2;
    (*k3)->Initialize(5, &params);
    for (size_t v = 0; v < params.size(); ++v) {
      EXPECT_EQ((*k3)->variables()[v].shape, (*k2)->variables()[v].shape) << model;
    }
    const std::string file = absl::StrCat(model, "_keras3.json");
    absl::StatusOr<KerasModelShape> shape = ReadKerasModelShape(ReadText(KerasFixture(file)), file);
    ASSERT_TRUE(shape.ok()) << shape.status();
    const int64_t pixels =
        int64_t{shape->input_height} * shape->input_width * shape->input_channels;
    const Tensor images = RandomImages(4, pixels, 6);
    const std::vector<int32_t> labels = {0, 1, 2, 3};
    EXPECT_EQ((*k3)->ComputeGradients(params, images, labels, &g3),
              (*k2)->ComputeGradients(params, images, labels, &g2))
        << model;
  }
}

// Glorot-uniform kernels (the Keras default) land inside their limit,
// He-normal ones spread as they should, biases and batch norm start at 0
// and 1.
TEST(KerasModelTest, InitializersFollowTheFile) {
  absl::StatusOr<std::unique_ptr<Model>> model = Load("residual_block_keras3.json");
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<Tensor> params;
  (*model)->Initialize(1, &params);
  const std::vector<VariableDef>& vars = (*model)->variables();
  for (size_t v = 0; v < vars.size(); ++v) {
    const Shape& shape = vars[v].shape;
    if (shape.size() == 4 && v == 0) {  // Glorot uniform, 3x3x3 -> 8.
      const double limit = std::sqrt(6.0 / (27 + 72));
      double max = 0;
      for (float x : params[v].flat()) max = std::max(max, double(std::abs(x)));
      EXPECT_LE(max, limit);
      EXPECT_GT(max, 0.8 * limit);
    }
    if (vars[v].name.find("/BatchNorm/gamma") != std::string::npos) {
      for (float x : params[v].flat()) ASSERT_EQ(x, 1.0f) << vars[v].name;
    }
    if (vars[v].name.find("/BatchNorm/beta") != std::string::npos ||
        vars[v].name.find("/biases") != std::string::npos) {
      for (float x : params[v].flat()) ASSERT_EQ(x, 0.0f) << vars[v].name;
    }
  }
  // The strided 3x3 conv is he_normal: stddev sqrt(2 / (3 * 3 * 8)).
  const Tensor& he = params[5];  // After the first conv's 4 batch norm variables.
  ASSERT_EQ(he.shape(), (Shape{3, 3, 8, 8}));
  double sum2 = 0;
  for (float x : he.flat()) sum2 += double(x) * x;
  EXPECT_NEAR(std::sqrt(sum2 / he.num_elements()), std::sqrt(2.0 / 72), 0.03);
}

// Keras's own loss and gradients (TensorFlow 2.21, training mode) on the
// same weights and batch, from scripts/gen_keras_fixtures.py: a Sequential
// CNN (valid and same, strided convolutions, max and average pools,
// Flatten, Dense), a Functional strided residual block (batch norm, Add,
// Concatenate, global pooling), and the keras.applications blocks
// (app_blocks: an asymmetric ZeroPadding2D, a batch norm after a biased
// conv, without scale, without center, after Add, Concatenate and a Dense
// without bias), and every activation (activations: capped and leaky ReLU
// layers, relu6, sigmoid, tanh, silu, hard_sigmoid, hard_silu, gelu, and a
// conv's and a Dense's own), and DepthwiseConv2D (depthwise: MobileNetV2's, and
// with a multiplier, a dilation, a bias, valid padding and an activation;
// and a SeparableConv2D),
// and squeeze-and-excitation (squeeze_excite: Rescaling, Normalization with
// and without constants, Reshape, a broadcast Multiply, MobileNet's head),
// and MobileNetV3's arithmetic with constants (ops_constants: x + 3.0,
// x * (1 / 6)), and a binary classifier (binary: one sigmoid unit, against
// Keras's binary cross-entropy), and InceptionResNetV2's scaled residual
// (scaled_residual: its CustomScaleLayer, with a ReLU after it and without),
// and GlobalMaxPooling2D (global_max: of a 7x5 map, and with keepdims),
// and ConvNeXt's layers (convnext_block: a nested Sequential stem,
// LayerNormalization of maps and of a vector, a Conv2D with groups equal to
// its channels, Dense per pixel, LayerScale).
// Also the loss in inference mode after that step.
TEST(KerasModelTest, LossAndGradientsMatchKeras) {
  for (const char* name :
       {"plain_cnn", "residual_block", "app_blocks", "activations", "depthwise",
        "squeeze_excite", "ops_constants", "binary", "scaled_residual",
        "global_max", "convnext_block"}) {
    SCOPED_TRACE(name);
    absl::StatusOr<std::unique_ptr<Model>> model = Load(absl::StrCat(name, "_keras3.json"));
    ASSERT_TRUE(model.ok()) << model.status();
    absl::StatusOr<SafetensorsFile> file =
        ReadSafetensors(KerasFixture(absl::StrCat(name, "_keras3.safetensors")));
    ASSERT_TRUE(file.ok()) << file.status();
    const std::map<std::string, const Tensor*> fixture = ByName(*file);
    std::vector<Tensor> params, grads;
    (*model)->Initialize(1, &params);
    for (size_t v = 0; v < params.size(); ++v) {
      const std::string& var = (*model)->variables()[v].name;
      ASSERT_EQ(fixture.count(var), 1u) << var;
      ASSERT_EQ(fixture.at(var)->shape(), params[v].shape()) << var;
      params[v] = fixture.at(var)->Clone();
    }
    std::vector<int32_t> labels;
    for (float l : fixture.at("labels")->flat()) labels.push_back(static_cast<int32_t>(l));
    const float loss = (*model)->ComputeGradients(params, *fixture.at("images"), labels, &grads);
    const float want = fixture.at("loss")->data()[0];
    EXPECT_NEAR(loss, want, 1e-5 * std::abs(want));
    // Inference mode after the step: batch norm on its moving statistics,
    // moved once by the file's momentum.
    // Moving statistics: what the ps does with their "gradients", the new values.
    for (size_t v = 0; v < params.size(); ++v) {
      if (IsMovingStatistic((*model)->variables()[v].name)) params[v] = grads[v].Clone();
    }
    const float eval_loss = (*model)->Evaluate(params, *fixture.at("images"), labels).mean_loss;
    const float want_eval = fixture.at("eval_loss")->data()[0];
    EXPECT_NEAR(eval_loss, want_eval, 1e-5 * std::abs(want_eval));
    for (size_t v = 0; v < params.size(); ++v) {
      const std::string& var = (*model)->variables()[v].name;
      const Tensor& keras = *fixture.at("grad:" + var);
      // A bias before a batch norm has a gradient of 0 (the batch norm
      // takes the mean away) but for rounding, on both sides.
      if (Norm(keras) < 1e-6) {
        EXPECT_LT(Norm(grads[v]), 1e-5) << var;
        continue;
      }
      EXPECT_TRUE(
          psrt::testing::NearInNorm(grads[v].data(), keras.data(), keras.num_elements(), 1e-4))
          << var;
    }
  }
}

// A single output unit is a binary classifier whether the file ends it with
// a sigmoid (the loss's, as softmax is) or linearly (Keras's guide, with
// from_logits=True): two classes, the same loss, and class 1 predicted
// where the unit's logit is above 0.
TEST(KerasModelTest, OneUnitIsABinaryClassifier) {
  const std::string sigmoid = ReadText(KerasFixture("binary_keras3.json"));
  const std::string linear = absl::StrReplaceAll(sigmoid, {{"\"sigmoid\"", "\"linear\""}});
  ASSERT_NE(linear, sigmoid);
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(KerasFixture("binary_keras3.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  const std::map<std::string, const Tensor*> fixture = ByName(*file);
  for (const std::string& json : {sigmoid, linear}) {
    absl::StatusOr<KerasModelShape> shape = ReadKerasModelShape(json, "binary.json");
    ASSERT_TRUE(shape.ok()) << shape.status();
    EXPECT_EQ(shape->num_classes, 2);
    absl::StatusOr<std::unique_ptr<Model>> model =
        NewKerasModel(json, "binary.json", ModelOptions());
    ASSERT_TRUE(model.ok()) << model.status();
    std::vector<Tensor> params;
    (*model)->Initialize(1, &params);
    for (size_t v = 0; v < params.size(); ++v) {
      params[v] = fixture.at((*model)->variables()[v].name)->Clone();
    }
    const Tensor& images = *fixture.at("images");
    std::vector<int32_t> labels, predictions, others;
    for (float l : fixture.at("labels")->flat()) labels.push_back(static_cast<int32_t>(l));
    for (float p : fixture.at("predictions")->flat()) {
      predictions.push_back(static_cast<int32_t>(p));
      others.push_back(1 - static_cast<int32_t>(p));
    }
    std::vector<Tensor> grads;
    const float want = fixture.at("loss")->data()[0];
    EXPECT_NEAR((*model)->ComputeGradients(params, images, labels, &grads), want, 1e-5 * want);
    // Keras's predictions (probability above 0.5) are psrt's, every one.
    EXPECT_EQ((*model)->Evaluate(params, images, predictions).correct,
              static_cast<int64_t>(predictions.size()));
    EXPECT_EQ((*model)->Evaluate(params, images, others).correct, 0);
  }
}

// The built-in model's variable of the Keras zoo file's `name`: Keras
// layer names cannot hold "/", so "Mixed_5b/Branch_0/Conv2d_0a_1x1" is
// "Mixed_5b_Branch_0_Conv2d_0a_1x1" there.
std::string KerasScope(const std::string& name) {
  const size_t leaf =
      name.find("/BatchNorm/") != std::string::npos ? name.find("/BatchNorm/") : name.rfind('/');
  return absl::StrReplaceAll(name.substr(0, leaf), {{"/", "_"}}) + name.substr(leaf);
}

// The zoo's Keras files (models/zoo/, at a small input here) build the
// built-in models: the same variables, and with the same parameters the
// same inference outputs, bit for bit, and training losses and gradients
// (Keras orders a Functional model's layers otherwise, so sums over a
// node's several readers may run in another order, and dropout draws
// other masks: inception_v3's training step is left to its inference).
TEST(KerasModelTest, ZooFilesComputeAsTheBuiltIns) {
  struct Case {
    const char* name;
    int height, width, channels, classes;
    bool train;
  };
  for (const Case& c :
       {Case{"resnet50", 32, 32, 3, 5, true}, Case{"vgg16", 32, 32, 3, 5, true},
        Case{"alexnet", 63, 63, 3, 5, true}, Case{"inception_mini", 12, 10, 1, 3, true},
        Case{"inception_v3", 75, 75, 3, 5, false}}) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<std::unique_ptr<Model>> file =
        Load(absl::StrCat("zoo_", c.name, "_small_keras3.json"));
    ASSERT_TRUE(file.ok()) << file.status();
    ModelOptions options;
    options.input_height = c.height;
    options.input_width = c.width;
    options.input_channels = c.channels;
    options.num_classes = c.classes;
    options.intra_op_threads = 2;
    absl::StatusOr<std::unique_ptr<Model>> builtin = NewModel(c.name, options);
    ASSERT_TRUE(builtin.ok()) << builtin.status();
    std::map<std::string, size_t> file_index;
    for (size_t v = 0; v < (*file)->variables().size(); ++v) {
      file_index[(*file)->variables()[v].name] = v;
    }
    ASSERT_EQ(file_index.size(), (*builtin)->variables().size());
    std::vector<Tensor> params, file_params((*file)->variables().size());
    (*builtin)->Initialize(9, &params);
    std::vector<size_t> at(params.size());
    for (size_t v = 0; v < params.size(); ++v) {
      const VariableDef& def = (*builtin)->variables()[v];
      auto it = file_index.find(KerasScope(def.name));
      ASSERT_NE(it, file_index.end()) << def.name;
      at[v] = it->second;
      ASSERT_EQ((*file)->variables()[at[v]].shape, def.shape) << def.name;
      file_params[at[v]] = params[v].Clone();
    }
    const Tensor images = RandomImages(4, int64_t{c.height} * c.width * c.channels, 10);
    const std::vector<int32_t> labels = {0, 1, 2, 1};
    const Model::Evaluation a = (*builtin)->Evaluate(params, images, labels);
    const Model::Evaluation b = (*file)->Evaluate(file_params, images, labels);
    EXPECT_EQ(a.mean_loss, b.mean_loss);
    EXPECT_EQ(a.correct, b.correct);
    if (!c.train) continue;
    std::vector<Tensor> builtin_grads, file_grads;
    const float loss = (*builtin)->ComputeGradients(params, images, labels, &builtin_grads);
    const float file_loss = (*file)->ComputeGradients(file_params, images, labels, &file_grads);
    EXPECT_NEAR(file_loss, loss, 1e-6 * std::abs(loss));
    for (size_t v = 0; v < params.size(); ++v) {
      // Keras 3's moving variance has no Bessel correction, the built-ins'
      // (TensorFlow's fused batch norm) has.
      if (IsMovingStatistic((*builtin)->variables()[v].name)) continue;
      EXPECT_TRUE(psrt::testing::NearInNorm(file_grads[at[v]].data(), builtin_grads[v].data(),
                                            builtin_grads[v].num_elements(), 1e-5))
          << (*builtin)->variables()[v].name;
    }
  }
}

// models/zoo/*.json at their published sizes: every built-in's variables,
// shapes and parameter count.
TEST(KerasModelTest, ZooFilesAreTheBuiltInsAtFullSize) {
  for (const char* name :
       {"resnet50", "resnet101", "vgg16", "alexnet", "inception_v3", "inception_mini", "lenet"}) {
    SCOPED_TRACE(name);
    const std::string path = absl::StrCat(PSRT_SOURCE_DIR, "/models/zoo/", name, ".json");
    const std::string json = ReadText(path);
    absl::StatusOr<KerasModelShape> shape = ReadKerasModelShape(json, path);
    ASSERT_TRUE(shape.ok()) << shape.status();
    ModelOptions options;
    options.input_height = shape->input_height;
    options.input_width = shape->input_width;
    options.input_channels = shape->input_channels;
    options.num_classes = shape->num_classes;
    absl::StatusOr<std::unique_ptr<Model>> file = NewKerasModel(json, path, options);
    absl::StatusOr<std::unique_ptr<Model>> builtin = NewModel(name, options);
    ASSERT_TRUE(file.ok() && builtin.ok()) << file.status() << builtin.status();
    std::map<std::string, Shape> file_shapes;
    for (const VariableDef& v : (*file)->variables()) file_shapes[v.name] = v.shape;
    ASSERT_EQ(file_shapes.size(), (*builtin)->variables().size());
    for (const VariableDef& v : (*builtin)->variables()) {
      ASSERT_EQ(file_shapes.count(KerasScope(v.name)), 1u) << v.name;
      EXPECT_EQ(file_shapes[KerasScope(v.name)], v.shape) << v.name;
    }
    EXPECT_EQ(CountParameters(**file).trainable, CountParameters(**builtin).trainable);
  }
}

TEST(KerasModelTest, ResidualBlockGradientsMatchFiniteDifferences) {
  absl::StatusOr<std::unique_ptr<Model>> model = Load("residual_block_keras3.json");
  ASSERT_TRUE(model.ok()) << model.status();
  const Tensor images = RandomImages(4, 16 * 16 * 3, 8);
  CheckSampledGradients(model->get(), images, {0, 4, 1, 3}, 2, /*samples=*/2);
}

TEST(KerasModelTest, ErrorsNameTheFileTheLayerAndItsClass) {
  for (const char* file : {"unsupported_keras3.json", "unsupported_keras2.json"}) {
    absl::StatusOr<std::unique_ptr<Model>> model = Load(file);
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(model.status().message()),
                HasSubstr(absl::StrCat("model file ", file,
                                       ": layer \"up_sampling2d\" "
                                       "(UpSampling2D): this layer class is not supported")));
  }
  const std::string convnet = ReadText(KerasFixture("mnist_convnet_keras3.json"));
  const std::string scaled = ReadText(KerasFixture("scaled_residual_keras3.json"));
  struct Bad {
    std::string json;
    const char* message;
  };
  const Bad bad[] = {
      {"", "not JSON"},
      {convnet.substr(0, convnet.size() / 2), "not JSON"},
      {"[1, 2]", "not JSON, or not a JSON object"},
      {R"({"class_name": "Sequential"})", "no \"class_name\" and \"config\""},
      {R"({"class_name": "Subclassed", "config": {}})", "only Sequential and Functional"},
      {absl::StrReplaceAll(convnet, {{R"("activation": "relu")", R"("activation": "elu")"}}),
       "activation \"elu\""},
      // Dense straight on the 5x5x64 maps, which Keras would apply per pixel.
      {absl::StrReplaceAll(convnet, {{R"("class_name": "Flatten")", R"("class_name": "Dropout")"}}),
       "put a Flatten or a pooling before it"},
      {absl::StrReplaceAll(convnet, {{R"("padding": "valid")", R"("padding": "causal")"}}),
       "padding \"causal\""},
      // A Functional layer that leads nowhere (its gradient would be
      // undefined).
      {R"({"class_name": "Functional", "config": {"layers": [
           {"class_name": "InputLayer", "name": "in", "config": {"batch_shape": [null, 4, 4, 1]},
            "inbound_nodes": []},
           {"class_name": "Flatten", "name": "f", "config": {}, "inbound_nodes": [{"args": [
             {"class_name": "__keras_tensor__", "config": {"keras_history": ["in", 0, 0]}}]}]},
           {"class_name": "Dense", "name": "dangling", "config": {"units": 3,
             "kernel_initializer": "glorot_uniform"}, "inbound_nodes": [{"args": [
             {"class_name": "__keras_tensor__", "config": {"keras_history": ["f", 0, 0]}}]}]},
           {"class_name": "Dense", "name": "out", "config": {"units": 2,
             "kernel_initializer": "glorot_uniform"}, "inbound_nodes": [{"args": [
             {"class_name": "__keras_tensor__", "config": {"keras_history": ["f", 0, 0]}}]}]}],
         "input_layers": ["in", 0, 0], "output_layers": ["out", 0, 0]}})",
       "layer \"dangling\" (Dense): read by no layer"},
      {absl::StrReplaceAll(convnet,
                           {{R"("class_name": "GlorotUniform")", R"("class_name": "Orthogonal")"}}),
       "kernel_initializer Orthogonal is not supported"},
      // A class of that name but not keras.applications' could compute
      // anything.
      {absl::StrReplaceAll(scaled, {{"keras.src.applications.inception_resnet_v2", "__main__"}}),
       "(CustomScaleLayer): this layer class is not supported"},
  };
  for (const Bad& b : bad) {
    absl::StatusOr<KerasModelShape> shape = ReadKerasModelShape(b.json, "m.json");
    EXPECT_EQ(shape.status().code(), absl::StatusCode::kInvalidArgument) << b.message;
    EXPECT_THAT(std::string(shape.status().message()), HasSubstr(b.message));
    EXPECT_THAT(std::string(shape.status().message()), HasSubstr("model file m.json"));
  }
}

// The ReLU folded into a sum keeps what the sum is: here a vector (two
// flattened maps added), which the Dense after it reads whole, as Keras
// does, not pixel by pixel.
TEST(KerasModelTest, ADenseAfterASumOfFlattenedMapsReadsTheVector) {
  auto tensor = [](const char* layer) {
    return absl::StrCat(R"({"class_name": "__keras_tensor__", "config": {"keras_history": [")",
                        layer, R"(", 0, 0]}})");
  };
  auto layer = [&](const char* cls, const char* name, const std::string& config,
                   std::vector<const char*> inputs) {
    std::string args;
    for (const char* in : inputs) absl::StrAppend(&args, args.empty() ? "" : ", ", tensor(in));
    return absl::StrCat(R"({"class_name": ")", cls, R"(", "name": ")", name,
                        R"(", "config": {)", config, R"(}, "inbound_nodes": [{"args": [)",
                        inputs.size() > 1 ? "[" : "", args, inputs.size() > 1 ? "]" : "",
                        "]}]}");
  };
  const std::string conv =
      R"("filters": 2, "kernel_size": [1, 1], "kernel_initializer": "glorot_uniform", )"
      R"("bias_initializer": "zeros")";
  const std::string dense =
      R"("units": 3, "kernel_initializer": "glorot_uniform", "bias_initializer": "zeros")";
  const std::string json = absl::StrCat(
      R"({"class_name": "Functional", "config": {"layers": [)",
      R"({"class_name": "InputLayer", "name": "in", "config": {"batch_shape": [null, 4, 4, 2]},)",
      R"( "inbound_nodes": []}, )",
      layer("Conv2D", "a", conv, {"in"}), ", ", layer("Conv2D", "b", conv, {"in"}), ", ",
      layer("Flatten", "fa", "", {"a"}), ", ", layer("Flatten", "fb", "", {"b"}), ", ",
      layer("Add", "sum", "", {"fa", "fb"}), ", ", layer("ReLU", "relu", "", {"sum"}), ", ",
      layer("Dense", "out", dense, {"relu"}),
      R"(], "input_layers": ["in", 0, 0], "output_layers": ["out", 0, 0]}})");
  absl::StatusOr<std::unique_ptr<Model>> model = NewKerasModel(json, "sum.json", ModelOptions());
  ASSERT_TRUE(model.ok()) << model.status();
  std::map<std::string, Shape> shapes;
  for (const VariableDef& v : (*model)->variables()) shapes[v.name] = v.shape;
  EXPECT_EQ(shapes["out/weights"], (Shape{4 * 4 * 2, 3}));
}

TEST(KerasModelTest, TheRegistryReadsModelKerasFromTheOptions) {
  ModelOptions options;
  EXPECT_THAT(std::string(NewModel("keras", options).status().message()),
              HasSubstr("give --model_file"));
  options.model_file = "mnist_convnet_keras3.json";
  options.model_json = ReadText(KerasFixture(options.model_file));
  absl::StatusOr<std::unique_ptr<Model>> model = NewModel("keras", options);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(CountParameters(**model).trainable, 34826);
}

}  // namespace
}  // namespace psrt
