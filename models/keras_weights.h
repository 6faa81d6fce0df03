// A Keras model file's weights as Keras 3 saves them (model.save_weights(
// "x.weights.h5"), models/keras_weights_file.h), to and from psrt's
// variables of the model that NewKerasModel builds from the file.
//
// Each layer with weights keeps them in Keras's order at its path
// (KerasLayer::weights_path), each one psrt variable in Keras's shape:
//   Conv2D              kernel [h, w, in, out], bias      <- NAME/weights, NAME/biases
//     with groups = in  kernel [h, w, 1, in]              <- NAME/depthwise_weights [h, w, in, 1]
//   Dense               kernel [in, units], bias          <- NAME/weights (per pixel: [1, 1, in, units])
//   DepthwiseConv2D     kernel, bias                      <- NAME/depthwise_weights, NAME/biases
//   SeparableConv2D     depthwise, pointwise, bias        <- .../depthwise_weights, NAME/pointwise/...
//   BatchNormalization  gamma, beta, moving mean, variance <- NAME/... or, fused into the conv it
//                                                            follows, CONV/BatchNorm/...
//   LayerNormalization  gamma, beta; LayerScale gamma
//   Normalization       mean, variance, count (adapt()'s) <- psrt's constants (mean 0, variance 1)
// Every other layer (and the model, and a nested Sequential) has an empty
// vars group, as Keras writes it. Every psrt variable has one place.
//
// Thread safety: pure functions (the file module serializes HDF5 calls).
#ifndef PSRT_MODELS_KERAS_WEIGHTS_H_
#define PSRT_MODELS_KERAS_WEIGHTS_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tensor.h"

namespace psrt {

// Writes the model's weights file `out` for the Keras model file `json`
// (`source` names it in errors): `value(name)` gives psrt variable `name`'s
// values (null: missing, an error naming it). Errors name the file, layer
// or variable at fault; nothing is written unless every weight was found.
absl::Status WriteKerasWeightsOfModel(
    absl::string_view json, const std::string& source,
    const std::function<const Tensor*(const std::string& name)>& value, const std::string& out);

// The model's variables (in the variables() order of NewKerasModel's model
// of `json`) from Keras's weights file `weights`. Refuses, naming the
// layer, a file whose layers or shapes do not match the model file: a
// layer with weights missing or of another count, a weight of another
// shape, a layer with weights that the model lacks (a compiled model's
// optimizer variables are ignored), and a Normalization
// whose statistics differ from the model file's constants (psrt keeps them
// constant: put them in the layer's "mean" and "variance").
absl::StatusOr<std::vector<Tensor>> ReadKerasWeightsOfModel(absl::string_view json,
                                                            const std::string& source,
                                                            const std::string& weights);

}  // namespace psrt

#endif  // PSRT_MODELS_KERAS_WEIGHTS_H_
