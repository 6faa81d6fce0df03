// LeNet as in TensorFlow's classic MNIST example (convolutional.py):
//   conv1 5x5x32 SAME + ReLU -> max pool 2x2/2 -> conv2 5x5x64 SAME + ReLU
//   -> max pool 2x2/2 -> fc1 512 + ReLU -> fc2 num_classes (logits),
// trained with softmax cross-entropy. The pools use SAME padding, so any
// input size works (28x28 gives 7x7x64 = 3136 features before fc1).
//
// Variables, in order (HWIO filters; fc1 reads the NHWC-flattened pool2):
//   conv1/weights [5, 5, C, 32], conv1/biases [32],
//   conv2/weights [5, 5, 32, 64], conv2/biases [64],
//   fc1/weights [H/4 * W/4 * 64, 512], fc1/biases [512],
//   fc2/weights [512, classes], fc2/biases [classes]
// (H/4 rounded up). Initial values as net.h says.
#ifndef PSRT_MODELS_LENET_H_
#define PSRT_MODELS_LENET_H_

#include <memory>

#include "absl/status/statusor.h"
#include "models/model.h"

namespace psrt {

// InvalidArgument when a size in `options` is not positive.
absl::StatusOr<std::unique_ptr<Model>> NewLenet(const ModelOptions& options);

}  // namespace psrt

#endif  // PSRT_MODELS_LENET_H_
