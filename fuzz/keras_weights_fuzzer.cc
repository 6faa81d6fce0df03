// Fuzzes the Keras weights file reader (models/keras_weights_file.h, the
// HDF5 C library underneath) with the input as a .weights.h5 file's bytes.
// A file that reads must survive a round trip through the writer: the same
// groups, names, shapes and bits.
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "glog/logging.h"
#include "models/keras_weights_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  psrt::fuzz::InitOnce();
  const std::string path = psrt::fuzz::ScratchDir() + "/input.weights.h5";
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  absl::StatusOr<std::vector<psrt::KerasWeightsEntry>> entries = psrt::ReadKerasWeights(path);
  if (!entries.ok()) return 0;
  // Paths the writer refuses (a path given twice, a slash at an end) cannot
  // come from a file; anything that reads must write.
  const std::string again_path = psrt::fuzz::ScratchDir() + "/round_trip.weights.h5";
  const absl::Status written = psrt::WriteKerasWeights(again_path, *entries);
  CHECK(written.ok()) << written;
  absl::StatusOr<std::vector<psrt::KerasWeightsEntry>> again = psrt::ReadKerasWeights(again_path);
  CHECK(again.ok()) << "a file psrt wrote does not read back: " << again.status();
  CHECK_EQ(again->size(), entries->size());
  for (size_t e = 0; e < entries->size(); ++e) {
    const psrt::KerasWeightsEntry& a = (*entries)[e];
    const psrt::KerasWeightsEntry& b = (*again)[e];
    CHECK_EQ(a.path, b.path);
    CHECK_EQ(a.name, b.name) << a.path;
    CHECK_EQ(a.vars.size(), b.vars.size()) << a.path;
    for (size_t k = 0; k < a.vars.size(); ++k) {
      CHECK(a.vars[k].shape() == b.vars[k].shape()) << a.path;
      CHECK(a.vars[k].num_bytes() == 0 ||
            std::memcmp(a.vars[k].data(), b.vars[k].data(), a.vars[k].num_bytes()) == 0)
          << a.path;
    }
  }
  return 0;
}
