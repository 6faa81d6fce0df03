#include "models/mlp.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "models/initializers.h"
#include "models/net.h"

namespace psrt {

absl::StatusOr<std::unique_ptr<Model>> NewMlp(const ModelOptions& options) {
  if (options.input_height <= 0 || options.input_width <= 0 ||
      options.input_channels <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MLP input size must be positive, got ", options.input_height, "x",
        options.input_width, "x", options.input_channels));
  }
  if (options.num_classes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MLP num_classes must be positive, got ", options.num_classes));
  }
  for (int units : options.hidden_units) {
    if (units <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("MLP hidden_units must be positive, got ", units));
    }
  }
  NetBuilder net(options);
  // TensorFlow's truncated_normal(stddev=1/sqrt(fan_in)): values whose
  // standard deviation is 0.88 of that.
  auto stddev = [&](int node) {
    return init::kTruncatedNormalStddev / std::sqrt(double(net.dims(node).size()));
  };
  int x = NetBuilder::kInput;
  for (size_t l = 0; l < options.hidden_units.size(); ++l) {
    x = net.FullyConnected(absl::StrCat("hidden", l + 1), x,
                           options.hidden_units[l], /*relu=*/true, VariableInit{stddev(x)});
  }
  net.FullyConnected("softmax_linear", x, options.num_classes, /*relu=*/false,
                     VariableInit{stddev(x)});
  return net.Build("mlp");
}

}  // namespace psrt
