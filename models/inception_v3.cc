#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "models/inception.h"
#include "models/net.h"

namespace psrt {
namespace {

using kernels::Padding;

// Builds Inception-v3's layers, following torchvision's Inception3 module by
// module (names after TF-slim's inception_v3).
class InceptionV3Builder {
 public:
  explicit InceptionV3Builder(NetBuilder* net) : net_(*net) {}

  // conv + batch norm + ReLU.
  int Conv(const std::string& scope, int x, int64_t fh, int64_t fw, int64_t out,
           int64_t stride = 1, Padding padding = Padding::kSame) {
    ConvSpec spec;
    spec.filter_height = fh;
    spec.filter_width = fw;
    spec.out_channels = out;
    spec.stride = stride;
    spec.padding = padding;
    spec.batch_norm = true;
    return net_.Conv(scope, x, spec);
  }

  // 35x35: 1x1 | 1x1 > 5x5 | 1x1 > 3x3 > 3x3 | avg pool > 1x1.
  int BlockA(const std::string& s, int x, int64_t pool_features) {
    const int b0 = Conv(s + "/Branch_0/Conv2d_0a_1x1", x, 1, 1, 64);
    int b1 = Conv(s + "/Branch_1/Conv2d_0a_1x1", x, 1, 1, 48);
    b1 = Conv(s + "/Branch_1/Conv2d_0b_5x5", b1, 5, 5, 64);
    int b2 = Conv(s + "/Branch_2/Conv2d_0a_1x1", x, 1, 1, 64);
    b2 = Conv(s + "/Branch_2/Conv2d_0b_3x3", b2, 3, 3, 96);
    b2 = Conv(s + "/Branch_2/Conv2d_0c_3x3", b2, 3, 3, 96);
    int b3 = net_.AvgPool(x, 3, 1, Padding::kSame);
    b3 = Conv(s + "/Branch_3/Conv2d_0b_1x1", b3, 1, 1, pool_features);
    return net_.Concat({b0, b1, b2, b3});
  }

  // 35x35 -> 17x17: 3x3/2 | 1x1 > 3x3 > 3x3/2 | max pool 3x3/2.
  int BlockB(const std::string& s, int x) {
    const int b0 =
        Conv(s + "/Branch_0/Conv2d_1a_1x1", x, 3, 3, 384, 2, Padding::kValid);
    int b1 = Conv(s + "/Branch_1/Conv2d_0a_1x1", x, 1, 1, 64);
    b1 = Conv(s + "/Branch_1/Conv2d_0b_3x3", b1, 3, 3, 96);
    b1 = Conv(s + "/Branch_1/Conv2d_1a_1x1", b1, 3, 3, 96, 2, Padding::kValid);
    const int b2 = net_.MaxPool(x, 3, 2, Padding::kValid);
    return net_.Concat({b0, b1, b2});
  }

  // 17x17 with factorized 7x7s: 1x1 | 1x1 > 1x7 > 7x1 |
  // 1x1 > 7x1 > 1x7 > 7x1 > 1x7 | avg pool > 1x1.
  int BlockC(const std::string& s, int x, int64_t c7) {
    const int b0 = Conv(s + "/Branch_0/Conv2d_0a_1x1", x, 1, 1, 192);
    int b1 = Conv(s + "/Branch_1/Conv2d_0a_1x1", x, 1, 1, c7);
    b1 = Conv(s + "/Branch_1/Conv2d_0b_1x7", b1, 1, 7, c7);
    b1 = Conv(s + "/Branch_1/Conv2d_0c_7x1", b1, 7, 1, 192);
    int b2 = Conv(s + "/Branch_2/Conv2d_0a_1x1", x, 1, 1, c7);
    b2 = Conv(s + "/Branch_2/Conv2d_0b_7x1", b2, 7, 1, c7);
    b2 = Conv(s + "/Branch_2/Conv2d_0c_1x7", b2, 1, 7, c7);
    b2 = Conv(s + "/Branch_2/Conv2d_0d_7x1", b2, 7, 1, c7);
    b2 = Conv(s + "/Branch_2/Conv2d_0e_1x7", b2, 1, 7, 192);
    int b3 = net_.AvgPool(x, 3, 1, Padding::kSame);
    b3 = Conv(s + "/Branch_3/Conv2d_0b_1x1", b3, 1, 1, 192);
    return net_.Concat({b0, b1, b2, b3});
  }

  // 17x17 -> 8x8: 1x1 > 3x3/2 | 1x1 > 1x7 > 7x1 > 3x3/2 | max pool 3x3/2.
  int BlockD(const std::string& s, int x) {
    int b0 = Conv(s + "/Branch_0/Conv2d_0a_1x1", x, 1, 1, 192);
    b0 = Conv(s + "/Branch_0/Conv2d_1a_3x3", b0, 3, 3, 320, 2, Padding::kValid);
    int b1 = Conv(s + "/Branch_1/Conv2d_0a_1x1", x, 1, 1, 192);
    b1 = Conv(s + "/Branch_1/Conv2d_0b_1x7", b1, 1, 7, 192);
    b1 = Conv(s + "/Branch_1/Conv2d_0c_7x1", b1, 7, 1, 192);
    b1 = Conv(s + "/Branch_1/Conv2d_1a_3x3", b1, 3, 3, 192, 2, Padding::kValid);
    const int b2 = net_.MaxPool(x, 3, 2, Padding::kValid);
    return net_.Concat({b0, b1, b2});
  }

  // 8x8 with split 3x3s: 1x1 | 1x1 > (1x3, 3x1) | 1x1 > 3x3 > (1x3, 3x1) |
  // avg pool > 1x1; the split pairs are concatenated in place.
  int BlockE(const std::string& s, int x) {
    const int b0 = Conv(s + "/Branch_0/Conv2d_0a_1x1", x, 1, 1, 320);
    const int b1 = Conv(s + "/Branch_1/Conv2d_0a_1x1", x, 1, 1, 384);
    const int b1a = Conv(s + "/Branch_1/Conv2d_0b_1x3", b1, 1, 3, 384);
    const int b1b = Conv(s + "/Branch_1/Conv2d_0c_3x1", b1, 3, 1, 384);
    int b2 = Conv(s + "/Branch_2/Conv2d_0a_1x1", x, 1, 1, 448);
    b2 = Conv(s + "/Branch_2/Conv2d_0b_3x3", b2, 3, 3, 384);
    const int b2a = Conv(s + "/Branch_2/Conv2d_0c_1x3", b2, 1, 3, 384);
    const int b2b = Conv(s + "/Branch_2/Conv2d_0d_3x1", b2, 3, 1, 384);
    int b3 = net_.AvgPool(x, 3, 1, Padding::kSame);
    b3 = Conv(s + "/Branch_3/Conv2d_0b_1x1", b3, 1, 1, 192);
    return net_.Concat({b0, b1a, b1b, b2a, b2b, b3});
  }

 private:
  NetBuilder& net_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> NewInceptionV3(
    const ModelOptions& options) {
  if (options.input_height <= 0 || options.input_width <= 0 ||
      options.input_channels <= 0 || options.num_classes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "inception_v3: input size and classes must be positive, got ",
        options.input_height, "x", options.input_width, "x",
        options.input_channels, " and ", options.num_classes, " classes"));
  }
  if (options.input_height < 75 || options.input_width < 75) {
    return absl::InvalidArgumentError(absl::StrCat(
        "inception_v3 needs inputs of at least 75x75 (299x299 as published), "
        "got ",
        options.input_height, "x", options.input_width));
  }
  NetBuilder net(options);
  InceptionV3Builder v3(&net);
  constexpr Padding kValid = Padding::kValid;
  // Stem: 299x299x3 -> 35x35x192.
  int x = v3.Conv("Conv2d_1a_3x3", NetBuilder::kInput, 3, 3, 32, 2, kValid);
  x = v3.Conv("Conv2d_2a_3x3", x, 3, 3, 32, 1, kValid);
  x = v3.Conv("Conv2d_2b_3x3", x, 3, 3, 64);
  x = net.MaxPool(x, 3, 2, kValid);
  x = v3.Conv("Conv2d_3b_1x1", x, 1, 1, 80, 1, kValid);
  x = v3.Conv("Conv2d_4a_3x3", x, 3, 3, 192, 1, kValid);
  x = net.MaxPool(x, 3, 2, kValid);
  x = v3.BlockA("Mixed_5b", x, 32);
  x = v3.BlockA("Mixed_5c", x, 64);
  x = v3.BlockA("Mixed_5d", x, 64);
  x = v3.BlockB("Mixed_6a", x);
  x = v3.BlockC("Mixed_6b", x, 128);
  x = v3.BlockC("Mixed_6c", x, 160);
  x = v3.BlockC("Mixed_6d", x, 160);
  x = v3.BlockC("Mixed_6e", x, 192);
  x = v3.BlockD("Mixed_7a", x);
  x = v3.BlockE("Mixed_7b", x);
  x = v3.BlockE("Mixed_7c", x);
  x = net.GlobalAvgPool(x);
  x = net.Dropout(x, 0.8f);
  net.FullyConnected("Logits", x, options.num_classes, /*relu=*/false);
  return net.Build("inception_v3");
}

}  // namespace psrt
