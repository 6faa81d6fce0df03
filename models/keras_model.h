// Models from Keras model files: the JSON that `model.to_json()` writes, in
// Keras 3's format (TensorFlow 2.16 on) and Keras 2's (tf.keras before it),
// for Sequential and Functional models, built with NetBuilder (net.h).
//
// The layers, activations and initializers read are listed in
// docs/models-and-kernels.md (Conv2D, Dense, BatchNormalization,
// DepthwiseConv2D and SeparableConv2D, pooling, Add, Concatenate, Multiply,
// Rescaling, Normalization, Dropout, ...). The input shape comes from the
// input layer, the class count from the output's units; a softmax last is
// the loss's, and one output unit (linear, or a sigmoid) is a binary
// classifier of two classes, trained as Keras's binary cross-entropy.
// Anything else is an InvalidArgument error naming the layer, its class and
// the file.
//
// Variables are named after the Keras layers: "conv2d/weights",
// "conv2d/biases", "conv2d/BatchNorm/gamma" (of the batch norm fused into
// conv2d), "dense/weights".
//
// Reading the file is keras_file.h's; keras_network.h turns its layers into
// the network, one method per layer class.
//
// Thread safety: pure functions.
#ifndef PSRT_MODELS_KERAS_MODEL_H_
#define PSRT_MODELS_KERAS_MODEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "models/model.h"

namespace psrt {

struct KerasModelShape {
  int input_height = 0;
  int input_width = 0;
  int input_channels = 0;
  int num_classes = 0;
};

// The input shape and class count of the model in `json`; `source` (the
// file) names it in errors. Checks the whole model as NewKerasModel would.
absl::StatusOr<KerasModelShape> ReadKerasModelShape(absl::string_view json,
                                                    const std::string& source);

// The model in `json`, with options' threads and device; its input shape
// and classes are the file's (options' are ignored).
absl::StatusOr<std::unique_ptr<Model>> NewKerasModel(absl::string_view json,
                                                     const std::string& source,
                                                     const ModelOptions& options);

}  // namespace psrt

#endif  // PSRT_MODELS_KERAS_MODEL_H_
