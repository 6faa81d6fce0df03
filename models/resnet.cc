// ResNet-50 and -101 (zoo.h).
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "models/net.h"
#include "models/zoo.h"

namespace psrt {
namespace {

using kernels::Padding;

ConvSpec BatchNormedConv(int64_t size, int64_t channels, int64_t stride, bool relu) {
  ConvSpec spec;
  spec.filter_height = spec.filter_width = size;
  spec.out_channels = channels;
  spec.stride = stride;
  spec.padding = Padding::kSame;
  spec.batch_norm = true;
  // torchvision's: momentum 0.1 (its moving averages keep 0.9 of the old
  // value), epsilon 1e-5.
  spec.bn_momentum = 0.9f;
  spec.bn_epsilon = 1e-5f;
  spec.relu = relu;
  return spec;
}

// One bottleneck unit: relu(x' + shortcut(x)), x' from 1x1, 3x3 (strided)
// and 1x1 convolutions.
int Bottleneck(NetBuilder& net, const std::string& scope, int x, int64_t channels, int64_t stride) {
  const int64_t out_channels = 4 * channels;
  int shortcut = x;
  if (stride != 1 || net.dims(x).channels != out_channels) {
    shortcut = net.Conv(scope + "/shortcut", x, BatchNormedConv(1, out_channels, stride, false));
  }
  int y = net.Conv(scope + "/conv1", x, BatchNormedConv(1, channels, 1, true));
  y = net.Conv(scope + "/conv2", y, BatchNormedConv(3, channels, stride, true));
  y = net.Conv(scope + "/conv3", y, BatchNormedConv(1, out_channels, 1, false));
  return net.Sum({y, shortcut}, /*relu=*/true);
}

absl::StatusOr<std::unique_ptr<Model>> NewResnet(const std::string& name,
                                                 const std::vector<int>& units,
                                                 const ModelOptions& options) {
  if (options.input_height < 32 || options.input_width < 32 || options.input_channels <= 0 ||
      options.num_classes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " needs inputs of at least 32x32 and a positive class count, got ",
                     options.input_height, "x", options.input_width, "x", options.input_channels,
                     " and ", options.num_classes, " classes"));
  }
  NetBuilder net(options);
  int x = net.Conv("conv1", NetBuilder::kInput, BatchNormedConv(7, 64, 2, true));
  x = net.MaxPool(x, 3, 2, Padding::kSame);
  const int64_t channels[] = {64, 128, 256, 512};
  for (size_t block = 0; block < units.size(); ++block) {
    for (int unit = 0; unit < units[block]; ++unit) {
      const int64_t stride = block > 0 && unit == 0 ? 2 : 1;
      x = Bottleneck(net, absl::StrCat("block", block + 1, "/unit_", unit + 1), x, channels[block],
                     stride);
    }
  }
  x = net.GlobalAvgPool(x);
  net.FullyConnected("logits", x, options.num_classes, /*relu=*/false);
  return net.Build(name);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> NewResnet50(const ModelOptions& options) {
  return NewResnet("resnet50", {3, 4, 6, 3}, options);
}

absl::StatusOr<std::unique_ptr<Model>> NewResnet101(const ModelOptions& options) {
  return NewResnet("resnet101", {3, 4, 23, 3}, options);
}

}  // namespace psrt
