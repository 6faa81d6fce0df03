// Inception networks (Szegedy et al.): modules of parallel 1x1, 3x3, 5x5
// (or factorized) convolution branches and a pooling branch, concatenated
// along the channels. Every convolution is conv (no bias) + batch norm
// (gamma and beta; epsilon 1e-3) + ReLU, with its moving mean and variance
// as variables too (net.h). Variable names follow TF-slim's
// inception_v3, e.g. "Mixed_5b/Branch_1/Conv2d_0b_5x5/weights",
// "Mixed_5b/Branch_1/Conv2d_0b_5x5/BatchNorm/gamma".
#ifndef PSRT_MODELS_INCEPTION_H_
#define PSRT_MODELS_INCEPTION_H_

#include <memory>

#include "absl/status/statusor.h"
#include "models/model.h"

namespace psrt {

// A small Inception-style network for 28x28 grayscale images that trains
// on a CPU in minutes (Fashion-MNIST: >= 0.90 test accuracy):
//   stem   Conv2d_1a_3x3 (32)                      28x28x32
//          max pool 3x3/2 SAME                     14x14x32
//   Mixed_2a  1x1 16 | 1x1 16 > 3x3 24 | 1x1 8 > 5x5 8 | pool > 1x1 16  -> 64
//   Mixed_2b  1x1 32 | 1x1 24 > 3x3 32 | 1x1 8 > 5x5 16 | pool > 1x1 16 -> 96
//          max pool 3x3/2 SAME                     7x7x96
//   Mixed_3a  1x1 48 | 1x1 32 > 3x3 48 | 1x1 12 > 5x5 16 | pool > 1x1 16 -> 128
//          global average pool, Logits (fully connected to num_classes).
// Pool branches are 3x3/1 SAME max pools. Any input of at least 1x1 works.
absl::StatusOr<std::unique_ptr<Model>> NewInceptionMini(
    const ModelOptions& options);

// Inception-v3 as published ("Rethinking the Inception Architecture",
// 2015; the architecture of TF-slim's inception_v3 and torchvision's
// Inception3) without the auxiliary head: the stem, Mixed_5b..5d (35x35),
// Mixed_6a..6e (17x17), Mixed_7a..7c (8x8), global average pool, dropout
// (keep 0.8) and Logits, for 299x299x3 inputs. Branch pools are 3x3/1 SAME
// average pools (padding not counted, as in TensorFlow). With 1000 classes
// it has 23,834,568 trainable parameters, torchvision's
// inception_v3(aux_logits=False) count. Inputs smaller than 75x75 do not
// fit its VALID windows (InvalidArgument).
absl::StatusOr<std::unique_ptr<Model>> NewInceptionV3(
    const ModelOptions& options);

}  // namespace psrt

#endif  // PSRT_MODELS_INCEPTION_H_
