// The multilayer perceptron of TensorFlow's MNIST example: the flattened
// image, one or more fully connected ReLU layers (options.hidden_units), and
// a linear layer to num_classes logits trained with softmax cross-entropy.
//
// Variables, in order (TensorFlow's names), for hidden layers 1..L:
//   hidden1/weights [H*W*C, units1], hidden1/biases [units1], ...,
//   hiddenL/weights [unitsL-1, unitsL], hiddenL/biases [unitsL],
//   softmax_linear/weights [unitsL, classes], softmax_linear/biases [classes].
// Weights start truncated-normal (cut at 2 stddev) with stddev
// 1/sqrt(fan_in), biases at zero, as in the TensorFlow example. Built by
// NetBuilder (net.h), so it runs on the CPU or a GPU.
#ifndef PSRT_MODELS_MLP_H_
#define PSRT_MODELS_MLP_H_

#include <memory>

#include "absl/status/statusor.h"
#include "models/model.h"

namespace psrt {

// InvalidArgument when a size in `options` is not positive.
absl::StatusOr<std::unique_ptr<Model>> NewMlp(const ModelOptions& options);

}  // namespace psrt

#endif  // PSRT_MODELS_MLP_H_
