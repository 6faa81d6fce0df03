#include "worker/input/image_decoder.h"

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>

// clang-format off: jpeglib.h needs stdio's FILE first.
#include <jpeglib.h>
#include <jerror.h>
// clang-format on
#include <png.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace psrt {
namespace {

// Larger images are refused before their pixels are allocated (a corrupt
// header can claim 65535 x 65535).
constexpr int64_t kMaxPixels = int64_t{1} << 27;

absl::Status CheckSize(int64_t height, int64_t width) {
  if (height <= 0 || width <= 0 || height * width > kMaxPixels) {
    return absl::InvalidArgumentError(absl::StrCat(
        "image of ", height, "x", width, " pixels (at most ", kMaxPixels, " are decoded)"));
  }
  return absl::OkStatus();
}

// libjpeg reports fatal errors through error_exit, which must not return:
// it jumps back to the setjmp in the caller with the message saved.
struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool truncated;
};

void JpegErrorExit(j_common_ptr cinfo) {
  JpegError* error = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, error->message);
  std::longjmp(error->jump, 1);
}

// Warnings are quiet, except that data ending early is an error (libjpeg
// would fill the rest of the image with gray).
void JpegEmitMessage(j_common_ptr cinfo, int level) {
  JpegError* error = reinterpret_cast<JpegError*>(cinfo->err);
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF && !error->truncated) {
    error->truncated = true;
    (*cinfo->err->format_message)(cinfo, error->message);
  }
}

// One row of CMYK pixels to RGB (or gray). Adobe's CMYK JPEGs (the marker
// Photoshop writes) store the inks inverted: 255 is no ink.
void CmykToRgbOrGray(const uint8_t* in, size_t width, bool inverted, int channels,
                     uint8_t* out) {
  for (size_t x = 0; x < width; ++x, in += 4) {
    int rgb[3];
    const int k = inverted ? in[3] : 255 - in[3];
    for (int c = 0; c < 3; ++c) {
      const int ink = inverted ? in[c] : 255 - in[c];
      rgb[c] = (ink * k + 127) / 255;
    }
    if (channels == 3) {
      for (int c = 0; c < 3; ++c) *out++ = static_cast<uint8_t>(rgb[c]);
    } else {  // Luminance, as libjpeg's RGB to gray.
      *out++ = static_cast<uint8_t>((299 * rgb[0] + 587 * rgb[1] + 114 * rgb[2] + 500) / 1000);
    }
  }
}

absl::Status JpegFailure(const char* message) {
  return absl::InvalidArgumentError(absl::StrCat("JPEG: ", message));
}

// Decodes (or, with header_only, reads the header of) a JPEG. Kept free of
// C++ objects with destructors between setjmp and the jumps.
absl::Status DecodeJpeg(absl::string_view bytes, int channels, bool header_only,
                        Image* image) {
  jpeg_decompress_struct cinfo;
  JpegError error;
  error.truncated = false;
  error.message[0] = '\0';
  cinfo.err = jpeg_std_error(&error.mgr);
  error.mgr.error_exit = JpegErrorExit;
  error.mgr.emit_message = JpegEmitMessage;
  if (setjmp(error.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return JpegFailure(error.message);
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()),
               static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  const bool gray = cinfo.jpeg_color_space == JCS_GRAYSCALE;
  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  const int out_channels = channels == 0 ? (gray ? 1 : 3) : channels;
  image->height = static_cast<int>(cinfo.image_height);
  image->width = static_cast<int>(cinfo.image_width);
  image->channels = header_only ? (gray ? 1 : 3) : out_channels;
  if (header_only || !CheckSize(image->height, image->width).ok()) {
    jpeg_destroy_decompress(&cinfo);
    return CheckSize(image->height, image->width);
  }
  // libjpeg converts no CMYK to RGB: it gives CMYK (YCCK converted), and
  // the rows are converted here.
  cinfo.out_color_space = cmyk ? JCS_CMYK : out_channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  cinfo.dct_method = JDCT_ISLOW;
  jpeg_start_decompress(&cinfo);
  const size_t stride = size_t{cinfo.output_width} * out_channels;
  image->pixels.resize(stride * cinfo.output_height);
  // CMYK rows land here first (libjpeg's pool: freed by jpeg_destroy).
  JSAMPARRAY cmyk_row =
      cmyk ? (*cinfo.mem->alloc_sarray)(reinterpret_cast<j_common_ptr>(&cinfo), JPOOL_IMAGE,
                                         cinfo.output_width * 4, 1)
           : nullptr;
  while (cinfo.output_scanline < cinfo.output_height && !error.truncated) {
    uint8_t* out = image->pixels.data() + stride * cinfo.output_scanline;
    if (!cmyk) {
      JSAMPROW row = out;
      jpeg_read_scanlines(&cinfo, &row, 1);
      continue;
    }
    jpeg_read_scanlines(&cinfo, cmyk_row, 1);
    CmykToRgbOrGray(cmyk_row[0], cinfo.output_width, cinfo.saw_Adobe_marker, out_channels, out);
  }
  if (!error.truncated) jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  if (error.truncated) return JpegFailure(error.message);
  return absl::OkStatus();
}

absl::Status DecodePng(absl::string_view bytes, int channels, bool header_only,
                       Image* image) {
  png_image png;
  std::memset(&png, 0, sizeof(png));
  png.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&png, bytes.data(), bytes.size())) {
    return absl::InvalidArgumentError(absl::StrCat("PNG: ", png.message));
  }
  const bool gray = (png.format & PNG_FORMAT_FLAG_COLOR) == 0;
  const int out_channels = channels == 0 ? (gray ? 1 : 3) : channels;
  image->height = static_cast<int>(png.height);
  image->width = static_cast<int>(png.width);
  image->channels = header_only ? (gray ? 1 : 3) : out_channels;
  if (header_only || !CheckSize(image->height, image->width).ok()) {
    png_image_free(&png);
    return CheckSize(image->height, image->width);
  }
  // With transparency (an alpha channel or tRNS), libpng would blend onto
  // whatever the buffer held (the previous image): read the alpha channel
  // too and drop it, as TensorFlow's decode_png does for 1 or 3 channels.
  const bool alpha = (png.format & PNG_FORMAT_FLAG_ALPHA) != 0;
  png.format = (out_channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB) |
               (alpha ? PNG_FORMAT_FLAG_ALPHA : 0);
  image->pixels.resize(PNG_IMAGE_SIZE(png));
  if (!png_image_finish_read(&png, /*background=*/nullptr, image->pixels.data(),
                             /*row_stride=*/0, /*colormap=*/nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("PNG: ", png.message));
  }
  if (alpha) {
    const size_t pixels = size_t{png.width} * png.height;
    uint8_t* data = image->pixels.data();
    for (size_t i = 0; i < pixels; ++i) {
      for (int c = 0; c < out_channels; ++c) {
        data[i * out_channels + c] = data[i * (out_channels + 1) + c];
      }
    }
    image->pixels.resize(pixels * out_channels);
  }
  return absl::OkStatus();
}

absl::Status NotAnImage(absl::string_view bytes) {
  std::string first;
  for (size_t i = 0; i < std::min<size_t>(4, bytes.size()); ++i) {
    absl::StrAppendFormat(&first, "%s%02x", i == 0 ? "" : " ",
                          static_cast<uint8_t>(bytes[i]));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "not a JPEG or PNG image (", bytes.size(), " bytes",
      bytes.empty() ? "" : ", first bytes ", first, ")"));
}

absl::Status CheckImage(const Image& image) {
  if ((image.channels != 1 && image.channels != 3) || image.height <= 0 ||
      image.width <= 0 ||
      image.pixels.size() != size_t{1} * image.height * image.width * image.channels) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cannot encode a %dx%dx%d image of %d bytes (channels must be 1 or 3)",
        image.height, image.width, image.channels, image.pixels.size()));
  }
  return absl::OkStatus();
}

}  // namespace

ImageFormat DetectImageFormat(absl::string_view bytes) {
  if (bytes.size() >= 3 && static_cast<uint8_t>(bytes[0]) == 0xFF &&
      static_cast<uint8_t>(bytes[1]) == 0xD8 && static_cast<uint8_t>(bytes[2]) == 0xFF) {
    return ImageFormat::kJpeg;
  }
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), "\x89PNG\r\n\x1a\n", 8) == 0) {
    return ImageFormat::kPng;
  }
  return ImageFormat::kUnknown;
}

absl::Status DecodeImage(absl::string_view bytes, int channels, Image* image) {
  if (channels != 0 && channels != 1 && channels != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("channels must be 0, 1 or 3, not ", channels));
  }
  switch (DetectImageFormat(bytes)) {
    case ImageFormat::kJpeg:
      return DecodeJpeg(bytes, channels, /*header_only=*/false, image);
    case ImageFormat::kPng:
      return DecodePng(bytes, channels, /*header_only=*/false, image);
    case ImageFormat::kUnknown:
      break;
  }
  return NotAnImage(bytes);
}

absl::StatusOr<Image> DecodeImage(absl::string_view bytes, int channels) {
  Image image;
  absl::Status status = DecodeImage(bytes, channels, &image);
  if (!status.ok()) return status;
  return image;
}

absl::StatusOr<Image> ReadImageHeader(absl::string_view bytes) {
  Image image;
  absl::Status status;
  switch (DetectImageFormat(bytes)) {
    case ImageFormat::kJpeg:
      status = DecodeJpeg(bytes, 0, /*header_only=*/true, &image);
      break;
    case ImageFormat::kPng:
      status = DecodePng(bytes, 0, /*header_only=*/true, &image);
      break;
    case ImageFormat::kUnknown:
      status = NotAnImage(bytes);
  }
  if (!status.ok()) return status;
  return image;
}

absl::StatusOr<std::string> EncodeJpeg(const Image& image, int quality) {
  if (absl::Status s = CheckImage(image); !s.ok()) return s;
  jpeg_compress_struct cinfo;
  JpegError error;
  error.truncated = false;
  error.message[0] = '\0';
  cinfo.err = jpeg_std_error(&error.mgr);
  error.mgr.error_exit = JpegErrorExit;
  unsigned char* out = nullptr;
  unsigned long out_size = 0;
  if (setjmp(error.jump)) {
    jpeg_destroy_compress(&cinfo);
    std::free(out);
    return JpegFailure(error.message);
  }
  jpeg_create_compress(&cinfo);
  jpeg_mem_dest(&cinfo, &out, &out_size);
  cinfo.image_width = static_cast<JDIMENSION>(image.width);
  cinfo.image_height = static_cast<JDIMENSION>(image.height);
  cinfo.input_components = image.channels;
  cinfo.in_color_space = image.channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  const size_t stride = size_t{1} * image.width * image.channels;
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<JSAMPLE*>(image.pixels.data() + stride * cinfo.next_scanline);
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::string result(reinterpret_cast<const char*>(out), out_size);
  std::free(out);
  return result;
}

absl::StatusOr<std::string> EncodePng(const Image& image) {
  if (absl::Status s = CheckImage(image); !s.ok()) return s;
  png_image png;
  std::memset(&png, 0, sizeof(png));
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(image.width);
  png.height = static_cast<png_uint_32>(image.height);
  png.format = image.channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&png, nullptr, &size, 0, image.pixels.data(), 0, nullptr)) {
    return absl::InternalError(absl::StrCat("PNG: ", png.message));
  }
  std::string result(size, '\0');
  if (!png_image_write_to_memory(&png, result.data(), &size, 0, image.pixels.data(), 0,
                                 nullptr)) {
    return absl::InternalError(absl::StrCat("PNG: ", png.message));
  }
  result.resize(size);
  return result;
}

}  // namespace psrt
