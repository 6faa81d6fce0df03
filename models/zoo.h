// The benchmark models of distributed training (tf_cnn_benchmarks',
// Horovod's and torchvision's): ResNet-50 and -101, VGG-16 and AlexNet,
// built with NetBuilder (net.h), at any input size they fit and any class
// count. With 224x224x3 inputs and 1000 classes each has torchvision's
// parameter count (weights, biases, batch-norm gamma and beta):
//   resnet50   25,557,032   resnet101  44,549,160
//   vgg16     138,357,544   alexnet    61,100,840
// Windows are TensorFlow's SAME or VALID padding rather than torchvision's
// explicit padding: the shapes, and so the counts, are the same at 224x224,
// the border pixels' weighting differs.
#ifndef PSRT_MODELS_ZOO_H_
#define PSRT_MODELS_ZOO_H_

#include <memory>

#include "absl/status/statusor.h"
#include "models/model.h"

namespace psrt {

// ResNet v1.5 (He et al. 2015, with the stride of each downsampling
// bottleneck on its 3x3 convolution, as torchvision and NVIDIA's ResNet-50
// put it): a 7x7/2 stem of 64 and a 3x3/2 max pool, then stages of
// bottleneck units (1x1, 3x3, 1x1 convolutions of 64/128/256/512 channels,
// the last one 4x wider, each conv + batch norm (torchvision's: moving
// averages keeping 0.9, epsilon 1e-5), ReLU but after the last),
// whose input is added back (through a 1x1 conv + batch norm, strided, where
// the shape changes) before a ReLU; global average pool and a fully
// connected layer. Stages of 3, 4, 6, 3 units (50) or 3, 4, 23, 3 (101).
// Names: "conv1/weights", "block2/unit_1/conv2/BatchNorm/gamma",
// "block2/unit_1/shortcut/weights", "logits/weights". Inputs of at least
// 32x32.
absl::StatusOr<std::unique_ptr<Model>> NewResnet50(const ModelOptions& options);
absl::StatusOr<std::unique_ptr<Model>> NewResnet101(const ModelOptions& options);

// VGG-16 (Simonyan and Zisserman, configuration D): 13 3x3 convolutions
// with biases and ReLU in five blocks (64, 128, 256, 512, 512 channels)
// each closed by a 2x2/2 max pool, then fully connected 4096, 4096 (ReLU,
// dropout 0.5) and the logits. Names: "conv1_1/weights", "fc6/weights".
// Inputs of at least 32x32.
absl::StatusOr<std::unique_ptr<Model>> NewVgg16(const ModelOptions& options);

// AlexNet as torchvision builds it (the one-tower variant of Krizhevsky's
// "one weird trick" paper): 11x11/4 (64), 3x3/2 max pool, 5x5 (192), max
// pool, 3x3 (384, 256, 256), max pool, fully connected 4096, 4096 (dropout
// 0.5) and the logits; convolutions with biases and ReLU, pools VALID.
// Names: "conv1/weights", "fc6/weights". Inputs of at least 63x63.
absl::StatusOr<std::unique_ptr<Model>> NewAlexnet(const ModelOptions& options);

}  // namespace psrt

#endif  // PSRT_MODELS_ZOO_H_
