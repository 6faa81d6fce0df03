// The model registry: an explicit table from name to factory.
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/ctr_models.h"
#include "models/inception.h"
#include "models/keras_model.h"
#include "models/lenet.h"
#include "models/mlp.h"
#include "models/model.h"
#include "models/zoo.h"

namespace psrt {
namespace {

struct ModelFactory {
  const char* name;
  absl::StatusOr<std::unique_ptr<Model>> (*create)(const ModelOptions&);
};

constexpr ModelFactory kModels[] = {
    {"mlp", NewMlp},
    {"lenet", NewLenet},
    {"inception_mini", NewInceptionMini},
    {"inception_v3", NewInceptionV3},
    {"resnet50", NewResnet50},
    {"resnet101", NewResnet101},
    {"vgg16", NewVgg16},
    {"alexnet", NewAlexnet},
    {"wide_deep", NewWideDeep},
    {"dlrm", NewDlrm},
};

}  // namespace

ParameterCount CountParameters(const Model& model) {
  ParameterCount count;
  for (const VariableDef& v : model.variables()) {
    const int64_t n = NumElements(v.shape);
    count.all += n;
    if (!IsMovingStatistic(v.name)) count.trainable += n;
  }
  count.all += model.num_non_trainable();
  return count;
}

const std::vector<TableDef>& Model::tables() const {
  static const std::vector<TableDef>* const kNone = new std::vector<TableDef>();
  return *kNone;
}

absl::StatusOr<std::unique_ptr<Model>> NewModel(const std::string& name,
                                                const ModelOptions& options) {
  if (name == "keras") {
    if (options.model_json.empty()) {
      return absl::InvalidArgumentError("model \"keras\" is read from a file: give --model_file");
    }
    return NewKerasModel(options.model_json, options.model_file, options);
  }
  std::vector<std::string> known;
  for (const ModelFactory& factory : kModels) {
    if (name == factory.name) return factory.create(options);
    known.push_back(factory.name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown model \"", name,
                   "\"; known models: ", absl::StrJoin(known, ", ")));
}

}  // namespace psrt
