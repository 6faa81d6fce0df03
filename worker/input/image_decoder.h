// Image decoding and encoding: JPEG (libjpeg-turbo) and PNG (libpng) bytes
// to and from 8-bit HWC pixels.
//
// Corrupt or truncated input never aborts the process: the libraries'
// fatal errors unwind to the caller (a custom error_exit / png error
// function with longjmp) and come back as InvalidArgument carrying the
// library's message, e.g.
//   "not a JPEG or PNG image (first bytes 00 11 22 33)"
//   "JPEG: Premature end of JPEG file"
// Callers add the file and record (worker/image_records.h).
//
// Thread safety: every function is thread-safe (no shared state).
#ifndef PSRT_WORKER_INPUT_IMAGE_DECODER_H_
#define PSRT_WORKER_INPUT_IMAGE_DECODER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace psrt {

// Pixels row-major, channels interleaved (HWC): pixel (y, x) channel c is
// pixels[(y * width + x) * channels + c].
struct Image {
  int height = 0;
  int width = 0;
  int channels = 0;  // 1 (gray) or 3 (RGB).
  std::vector<uint8_t> pixels;
};

enum class ImageFormat { kUnknown, kJpeg, kPng };

// By the magic bytes (FF D8 FF for JPEG, 89 'P' 'N' 'G' for PNG).
ImageFormat DetectImageFormat(absl::string_view bytes);

// Decodes JPEG or PNG `bytes` into `channels` channels (1: gray, 3: RGB;
// 0: the image's own, gray or RGB). Color converts as the libraries do
// (gray is replicated into RGB; RGB to gray by luminance), and CMYK or
// YCCK JPEGs become RGB here (R = (1 - C)(1 - K), ...; Adobe's inverted
// inks included); a PNG's alpha is dropped, palettes are expanded, 16 bits
// become 8. A JPEG whose data ends early is an error too (libjpeg only
// warns and fills gray).
// `image` reuses its pixel storage. REQUIRES: channels is 0, 1 or 3.
absl::Status DecodeImage(absl::string_view bytes, int channels, Image* image);
absl::StatusOr<Image> DecodeImage(absl::string_view bytes, int channels = 0);

// Header only: height, width and the stored channels (pixels left empty).
absl::StatusOr<Image> ReadImageHeader(absl::string_view bytes);

// Baseline JPEG of `image` at `quality` (1..100), 4:2:0 subsampled.
absl::StatusOr<std::string> EncodeJpeg(const Image& image, int quality = 90);
// 8-bit gray or RGB PNG of `image`.
absl::StatusOr<std::string> EncodePng(const Image& image);

}  // namespace psrt

#endif  // PSRT_WORKER_INPUT_IMAGE_DECODER_H_
