#include "models/lenet.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "models/net.h"

namespace psrt {

absl::StatusOr<std::unique_ptr<Model>> NewLenet(const ModelOptions& options) {
  if (options.input_height <= 0 || options.input_width <= 0 ||
      options.input_channels <= 0 || options.num_classes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lenet: input size and classes must be positive, got ",
        options.input_height, "x", options.input_width, "x",
        options.input_channels, " and ", options.num_classes, " classes"));
  }
  using kernels::Padding;
  ConvSpec conv;
  conv.filter_height = conv.filter_width = 5;
  conv.bias = true;
  NetBuilder net(options);
  conv.out_channels = 32;
  int x = net.Conv("conv1", NetBuilder::kInput, conv);
  x = net.MaxPool(x, 2, 2, Padding::kSame);
  conv.out_channels = 64;
  x = net.Conv("conv2", x, conv);
  x = net.MaxPool(x, 2, 2, Padding::kSame);
  x = net.FullyConnected("fc1", x, 512, /*relu=*/true);
  net.FullyConnected("fc2", x, options.num_classes, /*relu=*/false);
  return net.Build("lenet");
}

}  // namespace psrt
