// Fuzzes the Keras model file reader (models/keras_model.h) with the input
// as the file's text, and checks what a file it accepts promises: the model
// builds, with the shape and class count that ReadKerasModelShape said.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "fuzz/fuzz_util.h"
#include "glog/logging.h"
#include "models/keras_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  psrt::fuzz::InitOnce();
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<psrt::KerasModelShape> shape = psrt::ReadKerasModelShape(text, "fuzz.json");
  if (!shape.ok()) {
    CHECK(shape.status().code() == absl::StatusCode::kInvalidArgument) << shape.status();
    CHECK(absl::StrContains(shape.status().message(), "model file fuzz.json"));
    return 0;
  }
  CHECK_GT(shape->input_height, 0);
  CHECK_GT(shape->input_width, 0);
  CHECK_GT(shape->input_channels, 0);
  CHECK_GT(shape->num_classes, 0);
  psrt::ModelOptions options;
  options.intra_op_threads = 1;
  absl::StatusOr<std::unique_ptr<psrt::Model>> model =
      psrt::NewKerasModel(text, "fuzz.json", options);
  CHECK(model.ok()) << model.status();
  // A small one also trains a step (every layer must reach the logits).
  int64_t params = 0;
  for (const psrt::VariableDef& v : (*model)->variables()) params += psrt::NumElements(v.shape);
  const int64_t pixels = int64_t{shape->input_height} * shape->input_width * shape->input_channels;
  if (params <= 100000 && pixels <= 4096) {
    std::vector<psrt::Tensor> values, grads;
    (*model)->Initialize(1, &values);
    psrt::Tensor images({2, pixels});
    for (float& x : images.flat()) x = 0.5f;
    const std::vector<int32_t> labels = {0, shape->num_classes - 1};
    (*model)->ComputeGradients(values, images, labels, &grads);
    CHECK_EQ(grads.size(), values.size());
  }
  return 0;
}
