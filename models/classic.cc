// VGG-16 and AlexNet (zoo.h): plain stacks of convolutions and pools.
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "models/net.h"
#include "models/zoo.h"

namespace psrt {
namespace {

using kernels::Padding;

absl::Status CheckInput(const std::string& name, int64_t min_size, const ModelOptions& options) {
  if (options.input_height < min_size || options.input_width < min_size ||
      options.input_channels <= 0 || options.num_classes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " needs inputs of at least ", min_size, "x", min_size,
        " and a positive class count, got ", options.input_height, "x", options.input_width, "x",
        options.input_channels, " and ", options.num_classes, " classes"));
  }
  return absl::OkStatus();
}

ConvSpec BiasedConv(int64_t size, int64_t channels, int64_t stride = 1) {
  ConvSpec spec;
  spec.filter_height = spec.filter_width = size;
  spec.out_channels = channels;
  spec.stride = stride;
  spec.padding = Padding::kSame;
  spec.bias = true;
  spec.relu = true;
  return spec;
}

// fc6 and fc7 (4096, ReLU, dropout 0.5), then the logits.
void Classifier(NetBuilder& net, int x, int64_t classes) {
  x = net.FullyConnected("fc6", x, 4096, /*relu=*/true);
  x = net.Dropout(x, 0.5f);
  x = net.FullyConnected("fc7", x, 4096, /*relu=*/true);
  x = net.Dropout(x, 0.5f);
  net.FullyConnected("fc8", x, classes, /*relu=*/false);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> NewVgg16(const ModelOptions& options) {
  if (absl::Status s = CheckInput("vgg16", 32, options); !s.ok()) return s;
  NetBuilder net(options);
  int x = NetBuilder::kInput;
  const int64_t channels[] = {64, 128, 256, 512, 512};
  const int convs[] = {2, 2, 3, 3, 3};
  for (int block = 0; block < 5; ++block) {
    for (int i = 0; i < convs[block]; ++i) {
      x = net.Conv(absl::StrCat("conv", block + 1, "_", i + 1), x, BiasedConv(3, channels[block]));
    }
    x = net.MaxPool(x, 2, 2, Padding::kSame);
  }
  Classifier(net, x, options.num_classes);
  return net.Build("vgg16");
}

absl::StatusOr<std::unique_ptr<Model>> NewAlexnet(const ModelOptions& options) {
  if (absl::Status s = CheckInput("alexnet", 63, options); !s.ok()) return s;
  NetBuilder net(options);
  int x = net.Conv("conv1", NetBuilder::kInput, BiasedConv(11, 64, 4));
  x = net.MaxPool(x, 3, 2, Padding::kValid);
  x = net.Conv("conv2", x, BiasedConv(5, 192));
  x = net.MaxPool(x, 3, 2, Padding::kValid);
  x = net.Conv("conv3", x, BiasedConv(3, 384));
  x = net.Conv("conv4", x, BiasedConv(3, 256));
  x = net.Conv("conv5", x, BiasedConv(3, 256));
  x = net.MaxPool(x, 3, 2, Padding::kValid);
  Classifier(net, x, options.num_classes);
  return net.Build("alexnet");
}

}  // namespace psrt
