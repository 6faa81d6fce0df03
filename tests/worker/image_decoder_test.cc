#include "worker/input/image_decoder.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

// jpeglib.h needs stdio's FILE first.
#include <cstdio>
#include <jpeglib.h>
#include <png.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/input/synthetic_images.h"

namespace psrt {
namespace {

using ::testing::HasSubstr;

double MeanAbsDiff(const Image& a, const Image& b) {
  double sum = 0;
  for (size_t i = 0; i < a.pixels.size(); ++i) sum += std::abs(a.pixels[i] - b.pixels[i]);
  return sum / a.pixels.size();
}

// Smooth color gradients: what JPEG keeps well.
Image Gradient(int height, int width) {
  Image image;
  image.height = height;
  image.width = width;
  image.channels = 3;
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      image.pixels.push_back(static_cast<uint8_t>(x * 255 / (width - 1)));
      image.pixels.push_back(static_cast<uint8_t>(y * 255 / (height - 1)));
      image.pixels.push_back(128);
    }
  }
  return image;
}

TEST(ImageDecoderTest, JpegRoundTripIsWithinJpegTolerance) {
  const Image image = Gradient(32, 40);
  absl::StatusOr<std::string> jpeg = EncodeJpeg(image, 95);
  ASSERT_TRUE(jpeg.ok()) << jpeg.status();
  EXPECT_EQ(DetectImageFormat(*jpeg), ImageFormat::kJpeg);
  absl::StatusOr<Image> decoded = DecodeImage(*jpeg);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->height, 32);
  EXPECT_EQ(decoded->width, 40);
  EXPECT_EQ(decoded->channels, 3);
  ASSERT_EQ(decoded->pixels.size(), image.pixels.size());
  EXPECT_LT(MeanAbsDiff(image, *decoded), 2.0);
}

TEST(ImageDecoderTest, PngRoundTripIsExact) {
  const Image image = SyntheticImage(2, 4, 17, 9, /*seed=*/3);
  absl::StatusOr<std::string> png = EncodePng(image);
  ASSERT_TRUE(png.ok()) << png.status();
  EXPECT_EQ(DetectImageFormat(*png), ImageFormat::kPng);
  absl::StatusOr<Image> decoded = DecodeImage(*png);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->pixels, image.pixels);
  absl::StatusOr<Image> header = ReadImageHeader(*png);
  ASSERT_TRUE(header.ok());
  EXPECT_EQ(header->height, 17);
  EXPECT_EQ(header->width, 9);
  EXPECT_EQ(header->channels, 3);
}

// A PNG with an alpha channel decodes to its color values, whatever the
// reused buffer held before (libpng would blend onto it).
TEST(ImageDecoderTest, TransparencyIsDroppedNotBlendedOntoTheLastImage) {
  std::vector<uint8_t> rgba;
  for (int i = 0; i < 6 * 5; ++i) {
    rgba.insert(rgba.end(), {static_cast<uint8_t>(i), static_cast<uint8_t>(2 * i), 7,
                             static_cast<uint8_t>(i % 2 ? 0 : 128)});
  }
  png_image png;
  std::memset(&png, 0, sizeof(png));
  png.version = PNG_IMAGE_VERSION;
  png.width = 6;
  png.height = 5;
  png.format = PNG_FORMAT_RGBA;
  png_alloc_size_t size = 0;
  ASSERT_TRUE(png_image_write_get_memory_size(png, size, 0, rgba.data(), 0, nullptr));
  std::string bytes(size, '\0');
  ASSERT_TRUE(png_image_write_to_memory(&png, bytes.data(), &size, 0, rgba.data(), 0, nullptr));
  bytes.resize(size);
  for (int channels : {3, 1}) {
    Image image;
    image.pixels.assign(6 * 5 * 3, 200);  // The previous image, in the reused buffer.
    ASSERT_TRUE(DecodeImage(bytes, channels, &image).ok());
    ASSERT_EQ(image.pixels.size(), 6u * 5 * channels);
    Image again;
    ASSERT_TRUE(DecodeImage(bytes, channels, &again).ok());
    EXPECT_EQ(image.pixels, again.pixels) << channels;
    if (channels == 3) {
      for (int i = 0; i < 6 * 5; ++i) {
        EXPECT_EQ(image.pixels[3 * i], i) << i;
        EXPECT_EQ(image.pixels[3 * i + 1], 2 * i) << i;
        EXPECT_EQ(image.pixels[3 * i + 2], 7) << i;
      }
    }
  }
}

TEST(ImageDecoderTest, GrayBecomesRgbAndBack) {
  Image gray;
  gray.height = 2;
  gray.width = 3;
  gray.channels = 1;
  gray.pixels = {0, 50, 100, 150, 200, 250};
  absl::StatusOr<std::string> png = EncodePng(gray);
  ASSERT_TRUE(png.ok());
  absl::StatusOr<Image> rgb = DecodeImage(*png, 3);
  ASSERT_TRUE(rgb.ok()) << rgb.status();
  ASSERT_EQ(rgb->channels, 3);
  for (int i = 0; i < 6; ++i) {
    for (int c = 0; c < 3; ++c) EXPECT_EQ(rgb->pixels[i * 3 + c], gray.pixels[i]);
  }
  absl::StatusOr<std::string> jpeg = EncodeJpeg(gray, 100);
  ASSERT_TRUE(jpeg.ok());
  absl::StatusOr<Image> own = DecodeImage(*jpeg);  // The image's own channels.
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(own->channels, 1);
  absl::StatusOr<Image> from_rgb = DecodeImage(*EncodeJpeg(SyntheticImage(0, 2, 8, 8, 1)), 1);
  ASSERT_TRUE(from_rgb.ok());
  EXPECT_EQ(from_rgb->channels, 1);
  EXPECT_EQ(from_rgb->pixels.size(), 64u);
}

// A CMYK JPEG as libjpeg writes one (with an Adobe marker, so its inks
// count as inverted: 255 is no ink); `pixels` holds C, M, Y, K per pixel.
std::string EncodeCmykJpeg(int height, int width, const std::vector<uint8_t>& pixels) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr error;
  cinfo.err = jpeg_std_error(&error);
  jpeg_create_compress(&cinfo);
  unsigned char* out = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &out, &size);
  cinfo.image_width = width;
  cinfo.image_height = height;
  cinfo.input_components = 4;
  cinfo.in_color_space = JCS_CMYK;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, 100, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(pixels.data()) + cinfo.next_scanline * width * 4;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::string result(reinterpret_cast<char*>(out), size);
  std::free(out);
  return result;
}

// CMYK (as ImageNet holds a few) becomes RGB: with inverted inks, R = C * K
// / 255 and so on.
TEST(ImageDecoderTest, CmykJpegBecomesRgb) {
  const int h = 16, w = 16;
  std::vector<uint8_t> cmyk;
  for (int i = 0; i < h * w; ++i) {
    const bool left = i % w < w / 2;
    // Left: no black, inks 200, 100, 50; right: half black, no color ink.
    for (uint8_t v : left ? std::vector<uint8_t>{200, 100, 50, 255}
                          : std::vector<uint8_t>{255, 255, 255, 128}) {
      cmyk.push_back(v);
    }
  }
  const std::string jpeg = EncodeCmykJpeg(h, w, cmyk);
  absl::StatusOr<Image> rgb = DecodeImage(jpeg);
  ASSERT_TRUE(rgb.ok()) << rgb.status();
  ASSERT_EQ(rgb->channels, 3);
  const uint8_t* left = &rgb->pixels[(8 * w + 2) * 3];
  const uint8_t* right = &rgb->pixels[(8 * w + 13) * 3];
  EXPECT_NEAR(left[0], 200, 3);
  EXPECT_NEAR(left[1], 100, 3);
  EXPECT_NEAR(left[2], 50, 3);
  for (int c = 0; c < 3; ++c) EXPECT_NEAR(right[c], 128, 3);
  absl::StatusOr<Image> gray = DecodeImage(jpeg, 1);
  ASSERT_TRUE(gray.ok()) << gray.status();
  EXPECT_NEAR(gray->pixels[8 * w + 2], (299 * 200 + 587 * 100 + 114 * 50) / 1000, 3);
  EXPECT_EQ(ReadImageHeader(jpeg)->channels, 3);
}

TEST(ImageDecoderTest, TruncatedJpegIsAnErrorNotACrash) {
  const std::string jpeg = *EncodeJpeg(SyntheticImage(0, 4, 64, 64, 1));
  for (size_t keep : {jpeg.size() / 2, jpeg.size() - 10, size_t{20}, size_t{3}}) {
    absl::StatusOr<Image> decoded = DecodeImage(jpeg.substr(0, keep));
    ASSERT_FALSE(decoded.ok()) << "kept " << keep << " of " << jpeg.size() << " bytes";
    EXPECT_TRUE(absl::IsInvalidArgument(decoded.status()));
    EXPECT_THAT(decoded.status().message(), HasSubstr("JPEG"));
  }
}

TEST(ImageDecoderTest, TruncatedPngIsAnError) {
  const std::string png = *EncodePng(SyntheticImage(0, 4, 32, 32, 1));
  absl::StatusOr<Image> decoded = DecodeImage(png.substr(0, png.size() / 2));
  ASSERT_FALSE(decoded.ok());
  EXPECT_THAT(decoded.status().message(), HasSubstr("PNG"));
}

TEST(ImageDecoderTest, GarbageIsNotAnImage) {
  absl::StatusOr<Image> decoded = DecodeImage(std::string("\x00\x11\x22\x33 garbage", 12));
  ASSERT_FALSE(decoded.ok());
  EXPECT_THAT(decoded.status().message(),
              HasSubstr("not a JPEG or PNG image (12 bytes, first bytes 00 11 22 33)"));
  EXPECT_FALSE(DecodeImage("").ok());
  EXPECT_FALSE(DecodeImage("x", /*channels=*/2).ok());
}

// Flipped bytes anywhere in a JPEG: decoding succeeds or fails with a
// status, never aborts (libjpeg's error_exit would exit()).
TEST(ImageDecoderTest, CorruptedJpegsNeverAbort) {
  const std::string jpeg = *EncodeJpeg(SyntheticImage(3, 4, 32, 32, 1));
  std::srand(1);
  int errors = 0;
  for (int trial = 0; trial < 300; ++trial) {
    std::string bad = jpeg;
    for (int k = 0; k < 4; ++k) bad[2 + std::rand() % (bad.size() - 2)] ^= 1 + std::rand() % 255;
    errors += !DecodeImage(bad).ok();
  }
  EXPECT_GT(errors, 0);
}

}  // namespace
}  // namespace psrt
