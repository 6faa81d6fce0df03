#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "models/inception.h"
#include "models/net.h"

namespace psrt {
namespace {

using kernels::Padding;

// Moving statistics that follow the weights within tens of steps: a model
// trained for a few epochs is evaluated with statistics of its current
// weights (0.99 or TF-slim's 0.9997 lag behind a short run).
constexpr float kBatchNormMomentum = 0.9f;

ConvSpec ConvBn(int64_t filter, int64_t out) {
  ConvSpec spec;
  spec.filter_height = spec.filter_width = filter;
  spec.out_channels = out;
  spec.batch_norm = true;
  spec.bn_momentum = kBatchNormMomentum;
  return spec;
}

struct Module {
  int64_t b1, b3_reduce, b3, b5_reduce, b5, pool;
};

int InceptionModule(NetBuilder& net, const std::string& scope, int x,
                    const Module& m) {
  const int b0 =
      net.Conv(scope + "/Branch_0/Conv2d_0a_1x1", x, ConvBn(1, m.b1));
  int b1 =
      net.Conv(scope + "/Branch_1/Conv2d_0a_1x1", x, ConvBn(1, m.b3_reduce));
  b1 = net.Conv(scope + "/Branch_1/Conv2d_0b_3x3", b1, ConvBn(3, m.b3));
  int b2 =
      net.Conv(scope + "/Branch_2/Conv2d_0a_1x1", x, ConvBn(1, m.b5_reduce));
  b2 = net.Conv(scope + "/Branch_2/Conv2d_0b_5x5", b2, ConvBn(5, m.b5));
  int b3 = net.MaxPool(x, 3, 1, Padding::kSame);
  b3 = net.Conv(scope + "/Branch_3/Conv2d_0b_1x1", b3, ConvBn(1, m.pool));
  return net.Concat({b0, b1, b2, b3});
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> NewInceptionMini(
    const ModelOptions& options) {
  if (options.input_height <= 0 || options.input_width <= 0 ||
      options.input_channels <= 0 || options.num_classes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "inception_mini: input size and classes must be positive, got ",
        options.input_height, "x", options.input_width, "x",
        options.input_channels, " and ", options.num_classes, " classes"));
  }
  NetBuilder net(options);
  int x = net.Conv("Conv2d_1a_3x3", NetBuilder::kInput, ConvBn(3, 32));
  x = net.MaxPool(x, 3, 2, Padding::kSame);
  x = InceptionModule(net, "Mixed_2a", x, {16, 16, 24, 8, 8, 16});
  x = InceptionModule(net, "Mixed_2b", x, {32, 24, 32, 8, 16, 16});
  x = net.MaxPool(x, 3, 2, Padding::kSame);
  x = InceptionModule(net, "Mixed_3a", x, {48, 32, 48, 12, 16, 16});
  x = net.GlobalAvgPool(x);
  net.FullyConnected("Logits", x, options.num_classes, /*relu=*/false);
  return net.Build("inception_mini");
}

}  // namespace psrt
