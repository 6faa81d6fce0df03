// psrt_predict: a Keras model file's class probabilities for the first
// images of an IDX data set (Fashion-MNIST's), as psrt's evaluation computes
// them (inference mode: batch norm on its moving statistics), from
// variables in a safetensors file (psrt_export_checkpoint --out, or
// psrt_worker --final_params_out) or a Keras weights file.
//
//   psrt_predict --model_file=MODEL.json --params=PARAMS.safetensors \
//       --data_dir=/usr/share/datasets/fashion-mnist --split=t10k --count=100
//
// Prints a line per image: its label, then the softmax of its logits, one
// probability per class (%.9g). scripts/keras_round_trip.sh compares them
// with Keras's predictions of the exported weights.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_system.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "gflags/gflags.h"
#include "models/keras_weights.h"
#include "models/model.h"
#include "worker/input/idx_dataset.h"

DEFINE_string(model_file, "", "The Keras model file (model.to_json()).");
DEFINE_string(params, "", "The variables, under psrt's names, as a safetensors file.");
DEFINE_string(keras_weights, "", "Or: the variables as a Keras weights file (.weights.h5).");
DEFINE_string(data_dir, "/usr/share/datasets/fashion-mnist", "The IDX data set's folder.");
DEFINE_string(split, "t10k", "Its split: train or t10k.");
DEFINE_int32(count, 100, "How many of its first images.");

namespace psrt {
namespace {

absl::StatusOr<std::vector<Tensor>> ReadParams(const std::string& json, const Model& model) {
  if (!FLAGS_keras_weights.empty()) {
    return ReadKerasWeightsOfModel(json, FLAGS_model_file, FLAGS_keras_weights);
  }
  ASSIGN_OR_RETURN(SafetensorsFile file, ReadSafetensors(FLAGS_params));
  std::map<std::string, Tensor*> by_name;
  for (auto& [name, tensor] : file.tensors) by_name[name] = &tensor;
  std::vector<Tensor> params;
  for (const VariableDef& v : model.variables()) {
    auto it = by_name.find(v.name);
    if (it == by_name.end() || it->second->shape() != v.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          FLAGS_params, ": no variable \"", v.name, "\" of shape ", ShapeToString(v.shape)));
    }
    params.push_back(std::move(*it->second));
  }
  return params;
}

absl::Status Predict() {
  ASSIGN_OR_RETURN(const std::string json, FileSystem::Default()->ReadFile(FLAGS_model_file));
  ModelOptions options;
  options.model_json = json;
  options.model_file = FLAGS_model_file;
  ASSIGN_OR_RETURN(const std::unique_ptr<Model> model, NewModel("keras", options));
  ASSIGN_OR_RETURN(const std::vector<Tensor> params, ReadParams(json, *model));
  ASSIGN_OR_RETURN(const Dataset data, LoadMnistSplit(FLAGS_data_dir, FLAGS_split));
  const int64_t count = std::min<int64_t>(FLAGS_count, data.size());
  if (count == 0) return absl::InvalidArgumentError(absl::StrCat(FLAGS_split, " has no images"));
  const int64_t pixels = data.images.dim(1);
  Tensor images({count, pixels});
  std::copy(data.images.data(), data.images.data() + count * pixels, images.data());
  const std::vector<int32_t> labels(data.labels.begin(), data.labels.begin() + count);
  const Model::Evaluation evaluation = model->Evaluate(params, images, labels);
  RETURN_IF_ERROR(model->status());
  const int64_t classes = static_cast<int64_t>(evaluation.logits.size()) / count;
  for (int64_t i = 0; i < count; ++i) {
    const float* z = evaluation.logits.data() + i * classes;
    double max = z[0], sum = 0;
    for (int64_t c = 1; c < classes; ++c) max = std::max<double>(max, z[c]);
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(z[c] - max);
    std::printf("%d", labels[i]);
    for (int64_t c = 0; c < classes; ++c) std::printf(" %.9g", std::exp(z[c] - max) / sum);
    std::printf("\n");
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace psrt

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "a Keras model file's class probabilities for the first images of an IDX data set\n"
      "  psrt_predict --model_file=MODEL.json (--params=FILE.safetensors | "
      "--keras_weights=FILE.weights.h5) [--data_dir=DIR --split=t10k --count=N]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (FLAGS_model_file.empty() || FLAGS_params.empty() == FLAGS_keras_weights.empty() ||
      FLAGS_count < 1) {
    std::fprintf(stderr, "psrt_predict: needs --model_file, one of --params and --keras_weights, "
                         "and a positive --count\n");
    return 2;
  }
  const absl::Status status = psrt::Predict();
  if (!status.ok()) {
    std::fprintf(stderr, "psrt_predict: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
