#include "models/keras_model.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "models/keras_file.h"
#include "models/keras_network.h"
#include "models/net.h"

namespace psrt {
namespace {

ModelOptions WithShape(ModelOptions options, const KerasModelShape& shape, int classes) {
  options.input_height = shape.input_height;
  options.input_width = shape.input_width;
  options.input_channels = shape.input_channels;
  options.num_classes = classes;
  return options;
}

}  // namespace

absl::StatusOr<KerasModelShape> ReadKerasModelShape(absl::string_view json,
                                                    const std::string& source) {
  KerasFile file(source);
  RETURN_IF_ERROR(file.Parse(json));
  NetBuilder net(WithShape(ModelOptions(), file.input_shape(), 1));
  ASSIGN_OR_RETURN(const int classes, KerasNetwork(file).Build(&net));
  KerasModelShape shape = file.input_shape();
  shape.num_classes = classes;
  return shape;
}

absl::StatusOr<std::unique_ptr<Model>> NewKerasModel(absl::string_view json,
                                                     const std::string& source,
                                                     const ModelOptions& options) {
  ASSIGN_OR_RETURN(const KerasModelShape shape, ReadKerasModelShape(json, source));
  KerasFile file(source);
  RETURN_IF_ERROR(file.Parse(json));
  NetBuilder net(WithShape(options, shape, shape.num_classes));
  RETURN_IF_ERROR(KerasNetwork(file).Build(&net).status());
  return net.Build(absl::StrCat("model file ", source));
}

}  // namespace psrt
