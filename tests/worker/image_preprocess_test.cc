#include "worker/input/image_preprocess.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace psrt {
namespace {

using ::testing::ElementsAreArray;
using ::testing::Pointwise;
using ::testing::FloatNear;

Image Gray(int height, int width, std::vector<uint8_t> pixels) {
  Image image;
  image.height = height;
  image.width = width;
  image.channels = 1;
  image.pixels = std::move(pixels);
  return image;
}

std::vector<float> Preprocess(const Image& image, const CropBox& box, int h, int w, bool flip,
                              float pixel_max = 1) {
  std::vector<float> out(size_t{1} * h * w * image.channels, -1);
  CropResizeFlip(image, box, h, w, flip, out.data(), pixel_max);
  return out;
}

std::vector<float> Scaled(std::vector<float> v) {
  for (float& x : v) x /= 255;
  return v;
}

TEST(ImagePreprocessTest, SameSizeIsTheImageOver255) {
  const Image image = Gray(2, 3, {0, 51, 102, 153, 204, 255});
  EXPECT_THAT(Preprocess(image, {0, 0, 2, 3}, 2, 3, false),
              Pointwise(FloatNear(1e-6), Scaled({0, 51, 102, 153, 204, 255})));
}

// 2x2 -> 4x4 with half-pixel centers: source coordinates -0.25 (clamped
// to 0), 0.25, 0.75 and 1.25 (clamped to 1) on each axis.
TEST(ImagePreprocessTest, BilinearUpsampleMatchesHandComputedFixture) {
  const Image image = Gray(2, 2, {0, 100, 200, 40});
  // Along x, the top row gives 0, 25, 75, 100 and the bottom row 200, 160,
  // 80, 40; along y, rows 1 and 2 mix them 3:1 and 1:3.
  const std::vector<float> expected = {
      0,   25,     75,    100,  //
      50,  58.75,  76.25, 85,   //
      150, 126.25, 78.75, 55,   //
      200, 160,    80,    40};
  EXPECT_THAT(Preprocess(image, {0, 0, 2, 2}, 4, 4, false),
              Pointwise(FloatNear(1e-5), Scaled(expected)));
  // --pixel_range=0-255: the same values, unscaled.
  EXPECT_THAT(Preprocess(image, {0, 0, 2, 2}, 4, 4, false, 255),
              Pointwise(FloatNear(1e-4), expected));
}

// 4 -> 2 samples the middle of pixel pairs: coordinates 0.5 and 2.5.
TEST(ImagePreprocessTest, BilinearDownsampleAveragesNeighbours) {
  const Image image = Gray(1, 4, {0, 100, 200, 255});
  EXPECT_THAT(Preprocess(image, {0, 0, 1, 4}, 1, 2, false),
              Pointwise(FloatNear(1e-5), Scaled({50, 227.5})));
}

TEST(ImagePreprocessTest, CropAndFlip) {
  const Image image = Gray(3, 3, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  EXPECT_THAT(Preprocess(image, {1, 1, 2, 2}, 2, 2, false),
              Pointwise(FloatNear(1e-6), Scaled({5, 6, 8, 9})));
  EXPECT_THAT(Preprocess(image, {1, 1, 2, 2}, 2, 2, true),
              Pointwise(FloatNear(1e-6), Scaled({6, 5, 9, 8})));
  Image rgb;
  rgb.height = 1;
  rgb.width = 2;
  rgb.channels = 3;
  rgb.pixels = {10, 20, 30, 40, 50, 60};
  // A flip moves whole pixels: channels stay in order.
  EXPECT_THAT(Preprocess(rgb, {0, 0, 1, 2}, 1, 2, true),
              Pointwise(FloatNear(1e-6), Scaled({40, 50, 60, 10, 20, 30})));
}

// tf.image.central_crop(image, 0.875) of 100 x 80: start int(12.5 / 2) = 6
// rows and int(10 / 2) = 5 columns, size 100 - 12 and 80 - 10.
TEST(ImagePreprocessTest, CentralCropAsTensorFlow) {
  EXPECT_EQ(CentralCrop(100, 80, 0.875), (CropBox{6, 5, 88, 70}));
  EXPECT_EQ(CentralCrop(299, 299, 0.875), (CropBox{18, 18, 263, 263}));
  EXPECT_EQ(CentralCrop(7, 7, 1.0), (CropBox{0, 0, 7, 7}));
  EXPECT_EQ(CentralCrop(1, 1, 0.5), (CropBox{0, 0, 1, 1}));
}

TEST(ImagePreprocessTest, DistortedCropsStayInsideWithTheirAreaAndAspect) {
  const DistortedCropOptions options;
  int whole = 0;
  for (int e = 0; e < 500; ++e) {
    ExampleRng rng(1, e, 3);
    const CropBox box = SampleDistortedCrop(120, 160, options, &rng);
    ASSERT_GE(box.y, 0);
    ASSERT_GE(box.x, 0);
    ASSERT_LE(box.y + box.height, 120);
    ASSERT_LE(box.x + box.width, 160);
    if (box == CropBox{0, 0, 120, 160}) {
      ++whole;
      continue;
    }
    const double area = double{1} * box.height * box.width / (120 * 160);
    EXPECT_GE(area, 0.04);
    EXPECT_LE(area, 1.01);
    const double aspect = static_cast<double>(box.width) / box.height;
    EXPECT_GE(aspect, 0.7);
    EXPECT_LE(aspect, 1.4);
  }
  EXPECT_LT(whole, 50);  // Most draws fit in a 3:4 image.
}

TEST(ImagePreprocessTest, DistortedCropIsDeterministicAndFallsBackToTheWholeImage) {
  ExampleRng a(5, 2, 9), b(5, 2, 9), c(5, 2, 10);
  const CropBox box = SampleDistortedCrop(64, 64, {}, &a);
  EXPECT_EQ(box, SampleDistortedCrop(64, 64, {}, &b));
  // A 1 x 100 strip fits no box of aspect 3/4..4/3 above 5% of its area.
  DistortedCropOptions options;
  options.min_area = 0.5;
  EXPECT_EQ(SampleDistortedCrop(1, 100, options, &c), (CropBox{0, 0, 1, 100}));
}

TEST(ImagePreprocessTest, ExampleRngIsUniformEnough) {
  ExampleRng rng(1, 0, 0);
  double sum = 0;
  for (int i = 0; i < 10000; ++i) {
    const double u = rng.Uniform();
    ASSERT_GE(u, 0);
    ASSERT_LT(u, 1);
    sum += u;
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.02);
}

}  // namespace
}  // namespace psrt
