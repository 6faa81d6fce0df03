// Fuzzes image input: the JPEG and PNG decoders (worker/input/image_decoder.h,
// libjpeg-turbo and libpng behind error handlers that must turn every
// failure into a status, never an exit), the preprocessing of what decodes
// (worker/input/image_preprocess.h), and the parsing of build_image_data.py
// Examples (worker/input/image_records.h), each with the input as the bytes.
// Seeds: fuzz_make_corpus writes color.jpg, gray.jpg, color.png and
// example; cmyk.jpg and ycck.jpg (8x8, libjpeg's CMYK encoder, the second
// with jpeg_set_colorspace(JCS_YCCK)) were written once by hand.
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "glog/logging.h"
#include "worker/input/image_decoder.h"
#include "worker/input/image_preprocess.h"
#include "worker/input/image_records.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  psrt::fuzz::InitOnce();
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  for (int channels : {0, 1, 3}) {
    absl::StatusOr<psrt::Image> image = psrt::DecodeImage(bytes, channels);
    if (!image.ok()) continue;
    CHECK_GT(image->height, 0);
    CHECK_GT(image->width, 0);
    CHECK(channels == 0 || image->channels == channels);
    CHECK_EQ(image->pixels.size(),
             size_t{1} * image->height * image->width * image->channels);
    absl::StatusOr<psrt::Image> header = psrt::ReadImageHeader(bytes);
    CHECK(header.ok()) << header.status();
    CHECK_EQ(header->height, image->height);
    CHECK_EQ(header->width, image->width);
    psrt::ExampleRng rng(1, 0, 0);
    const psrt::CropBox box = psrt::SampleDistortedCrop(image->height, image->width, {}, &rng);
    std::vector<float> out(8 * 8 * image->channels);
    psrt::CropResizeFlip(*image, box, 8, 8, /*flip=*/true, out.data());
    for (float v : out) CHECK(v >= 0 && v <= 1) << v;
  }
  absl::StatusOr<psrt::ImageRecord> record = psrt::ParseImageExample(bytes);
  if (record.ok()) {
    absl::StatusOr<psrt::ImageRecord> again =
        psrt::ParseImageExample(psrt::SerializeImageExample(*record));
    CHECK(again.ok()) << again.status();
    CHECK(again->encoded == record->encoded && again->label == record->label);
  }
  return 0;
}
