#!/usr/bin/env python3
"""Writes the Keras model files that tests/models/keras_model_test.cc reads
(tests/data/keras/): each model in Keras 3's format (TensorFlow 2.21's
keras) and in Keras 2's (tf_keras, what tf.keras wrote before TF 2.16), with
its count_params() in a .params file beside it; keras.applications' CNNs
(apps/, gzipped, with their counts); and, for the models of EXACT, what
Keras computes on a batch: NAME_keras3.safetensors holds the
weights under psrt's variable names, the images [B, H*W*C] and labels, the
mean softmax cross-entropy (training mode: batch norm on batch statistics)
and its gradient for every weight ("grad:" + the name), and the loss in
inference mode after that step ("eval_loss"), and NAME_keras3.weights.h5
the same weights as model.save_weights writes them; and weights/, the
.weights.h5 files of keras_weights_file_test.cc. The suite itself
needs no Python; rerun this only to change the fixtures:

  . scripts/keras_venv.sh  # tensorflow-cpu and tf_keras, in ~/.cache/psrt-bench/tf-venv
  "$keras_venv/bin/python" scripts/gen_keras_fixtures.py
"""
import json
import os
import struct
import sys

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "keras")


def mnist_convnet(keras):
    """The Keras MNIST tutorial (keras.io/examples/vision/mnist_convnet)."""
    layers = keras.layers
    return keras.Sequential([
        keras.Input(shape=(28, 28, 1)),
        layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Flatten(),
        layers.Dropout(0.5),
        layers.Dense(10, activation="softmax"),
    ])


def residual_block(keras):
    """A strided ResNet block (conv > batch norm > ReLU, a projection
    shortcut, Add), then an Inception-style Concatenate, as a Functional
    model."""
    layers = keras.layers
    inputs = keras.Input(shape=(16, 16, 3))
    x = layers.Conv2D(8, 3, padding="same", use_bias=False)(inputs)
    x = layers.BatchNormalization(epsilon=1e-3, momentum=0.9)(x)
    x = layers.Activation("relu")(x)
    y = layers.Conv2D(8, 3, strides=2, padding="same", use_bias=False,
                      kernel_initializer="he_normal")(x)
    y = layers.BatchNormalization()(y)
    y = layers.ReLU()(y)
    y = layers.Conv2D(16, 1, padding="same", use_bias=False)(y)
    y = layers.BatchNormalization()(y)
    shortcut = layers.Conv2D(16, 1, strides=2, padding="same", use_bias=False)(x)
    shortcut = layers.BatchNormalization()(shortcut)
    z = layers.Add()([y, shortcut])
    z = layers.Activation("relu")(z)
    branch1 = layers.Conv2D(8, 1, activation="relu")(z)
    branch2 = layers.AveragePooling2D(3, strides=1, padding="same")(z)
    joined = layers.Concatenate()([branch1, branch2])
    pooled = layers.GlobalAveragePooling2D()(joined)
    outputs = layers.Dense(5)(pooled)
    return keras.Model(inputs, outputs)


def lenet(keras):
    """psrt's built-in lenet (models/lenet.cc) as a Keras file, with its
    variable names: the two must compute the same."""
    layers = keras.layers
    return keras.Sequential([
        keras.Input(shape=(28, 28, 1)),
        layers.Conv2D(32, 5, padding="same", activation="relu", name="conv1"),
        layers.MaxPooling2D(2, padding="same"),
        layers.Conv2D(64, 5, padding="same", activation="relu", name="conv2"),
        layers.MaxPooling2D(2, padding="same"),
        layers.Flatten(),
        layers.Dense(512, activation="relu", name="fc1"),
        layers.Dense(10, name="fc2"),
    ])


def plain_cnn(keras):
    """A Sequential CNN with every plain layer and a linear output."""
    layers = keras.layers
    return keras.Sequential([
        keras.Input(shape=(12, 10, 2)),
        layers.Conv2D(6, 3, activation="relu"),
        layers.MaxPooling2D(2, padding="same"),
        layers.Conv2D(8, 3, strides=2, padding="same", activation="relu"),
        layers.AveragePooling2D(2, strides=1, padding="same"),
        layers.Flatten(),
        layers.Dense(16, activation="relu"),
        layers.Dense(4),
    ])


def unsupported(keras):
    """A layer psrt does not read (the error must name it)."""
    layers = keras.layers
    return keras.Sequential([
        keras.Input(shape=(8, 8, 1)),
        layers.Conv2D(4, 3),
        layers.UpSampling2D(name="up_sampling2d"),
        layers.Flatten(),
        layers.Dense(2),
    ])


def write(keras, suffix):
    for name, build in [("mnist_convnet", mnist_convnet), ("residual_block", residual_block),
                        ("lenet", lenet), ("unsupported", unsupported)]:
        model = build(keras)
        base = os.path.join(OUT, f"{name}_{suffix}")
        with open(base + ".json", "w") as f:
            f.write(model.to_json())
        with open(base + ".params", "w") as f:
            f.write(f"{model.count_params()}\n")
        print(base, model.count_params())


# The built-in models as Keras files (models/zoo/), layer for layer as
# models/*.cc build them, so that the two compute the same: the same layer
# order (psrt's variable order), padding, batch norm settings and weight
# initializers (psrt's He: he_normal before a ReLU, lecun_normal
# elsewhere). Keras names cannot hold "/": "Mixed_5b/Branch_0" becomes
# "Mixed_5b_Branch_0".


def zoo_conv(layers, x, name, filters, kernel, stride=1, padding="same", relu=True,
             bias=False, bn=None):
    """A psrt ConvSpec in Keras layers: Conv2D (+ BatchNormalization) (+ ReLU)."""
    init = "he_normal" if relu else "lecun_normal"
    if bn is None:
        return layers.Conv2D(filters, kernel, strides=stride, padding=padding,
                             use_bias=bias, activation="relu" if relu else "linear",
                             kernel_initializer=init, name=name)(x)
    x = layers.Conv2D(filters, kernel, strides=stride, padding=padding, use_bias=False,
                      kernel_initializer=init, name=name)(x)
    x = layers.BatchNormalization(epsilon=bn[0], momentum=bn[1], name=name + "_bn")(x)
    return layers.Activation("relu", name=name + "_relu")(x) if relu else x


def zoo_resnet(keras, units, shape, classes, name):
    layers = keras.layers
    bn = (1e-5, 0.9)
    inputs = keras.Input(shape=shape)
    x = zoo_conv(layers, inputs, "conv1", 64, 7, 2, bn=bn)
    x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
    for block, (count, channels) in enumerate(zip(units, [64, 128, 256, 512])):
        for unit in range(count):
            scope = f"block{block + 1}_unit_{unit + 1}"
            stride = 2 if block > 0 and unit == 0 else 1
            shortcut = x
            if stride != 1 or x.shape[-1] != 4 * channels:
                shortcut = zoo_conv(layers, x, scope + "_shortcut", 4 * channels, 1, stride,
                                    relu=False, bn=bn)
            y = zoo_conv(layers, x, scope + "_conv1", channels, 1, bn=bn)
            y = zoo_conv(layers, y, scope + "_conv2", channels, 3, stride, bn=bn)
            y = zoo_conv(layers, y, scope + "_conv3", 4 * channels, 1, relu=False, bn=bn)
            x = layers.Activation("relu")(layers.Add()([y, shortcut]))
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(classes, kernel_initializer="lecun_normal", name="logits")(x)
    return keras.Model(inputs, outputs, name=name)


def zoo_classifier(layers, x, classes):
    x = layers.Flatten()(x)
    x = layers.Dense(4096, activation="relu", kernel_initializer="he_normal", name="fc6")(x)
    x = layers.Dropout(0.5)(x)
    x = layers.Dense(4096, activation="relu", kernel_initializer="he_normal", name="fc7")(x)
    x = layers.Dropout(0.5)(x)
    return layers.Dense(classes, kernel_initializer="lecun_normal", name="fc8")(x)


def zoo_vgg16(keras, shape, classes):
    layers = keras.layers
    inputs = keras.Input(shape=shape)
    x = inputs
    for block, (channels, convs) in enumerate(zip([64, 128, 256, 512, 512], [2, 2, 3, 3, 3])):
        for i in range(convs):
            x = zoo_conv(layers, x, f"conv{block + 1}_{i + 1}", channels, 3, bias=True)
        x = layers.MaxPooling2D(2, padding="same")(x)
    return keras.Model(inputs, zoo_classifier(layers, x, classes), name="vgg16")


def zoo_alexnet(keras, shape, classes):
    layers = keras.layers
    inputs = keras.Input(shape=shape)
    x = zoo_conv(layers, inputs, "conv1", 64, 11, 4, bias=True)
    x = layers.MaxPooling2D(3, strides=2)(x)
    x = zoo_conv(layers, x, "conv2", 192, 5, bias=True)
    x = layers.MaxPooling2D(3, strides=2)(x)
    x = zoo_conv(layers, x, "conv3", 384, 3, bias=True)
    x = zoo_conv(layers, x, "conv4", 256, 3, bias=True)
    x = zoo_conv(layers, x, "conv5", 256, 3, bias=True)
    x = layers.MaxPooling2D(3, strides=2)(x)
    return keras.Model(inputs, zoo_classifier(layers, x, classes), name="alexnet")


def zoo_inception_v3(keras, shape, classes):
    layers = keras.layers
    bn = (1e-3, 0.99)

    def conv(x, name, filters, kernel, stride=1, padding="same"):
        return zoo_conv(layers, x, name.replace("/", "_"), filters, kernel, stride, padding, bn=bn)

    def avg(x):
        return layers.AveragePooling2D(3, strides=1, padding="same")(x)

    def block_a(s, x, pool_features):
        b0 = conv(x, s + "/Branch_0/Conv2d_0a_1x1", 64, 1)
        b1 = conv(x, s + "/Branch_1/Conv2d_0a_1x1", 48, 1)
        b1 = conv(b1, s + "/Branch_1/Conv2d_0b_5x5", 64, 5)
        b2 = conv(x, s + "/Branch_2/Conv2d_0a_1x1", 64, 1)
        b2 = conv(b2, s + "/Branch_2/Conv2d_0b_3x3", 96, 3)
        b2 = conv(b2, s + "/Branch_2/Conv2d_0c_3x3", 96, 3)
        b3 = conv(avg(x), s + "/Branch_3/Conv2d_0b_1x1", pool_features, 1)
        return layers.Concatenate()([b0, b1, b2, b3])

    def block_b(s, x):
        b0 = conv(x, s + "/Branch_0/Conv2d_1a_1x1", 384, 3, 2, "valid")
        b1 = conv(x, s + "/Branch_1/Conv2d_0a_1x1", 64, 1)
        b1 = conv(b1, s + "/Branch_1/Conv2d_0b_3x3", 96, 3)
        b1 = conv(b1, s + "/Branch_1/Conv2d_1a_1x1", 96, 3, 2, "valid")
        b2 = layers.MaxPooling2D(3, strides=2)(x)
        return layers.Concatenate()([b0, b1, b2])

    def block_c(s, x, c7):
        b0 = conv(x, s + "/Branch_0/Conv2d_0a_1x1", 192, 1)
        b1 = conv(x, s + "/Branch_1/Conv2d_0a_1x1", c7, 1)
        b1 = conv(b1, s + "/Branch_1/Conv2d_0b_1x7", c7, (1, 7))
        b1 = conv(b1, s + "/Branch_1/Conv2d_0c_7x1", 192, (7, 1))
        b2 = conv(x, s + "/Branch_2/Conv2d_0a_1x1", c7, 1)
        b2 = conv(b2, s + "/Branch_2/Conv2d_0b_7x1", c7, (7, 1))
        b2 = conv(b2, s + "/Branch_2/Conv2d_0c_1x7", c7, (1, 7))
        b2 = conv(b2, s + "/Branch_2/Conv2d_0d_7x1", c7, (7, 1))
        b2 = conv(b2, s + "/Branch_2/Conv2d_0e_1x7", 192, (1, 7))
        b3 = conv(avg(x), s + "/Branch_3/Conv2d_0b_1x1", 192, 1)
        return layers.Concatenate()([b0, b1, b2, b3])

    def block_d(s, x):
        b0 = conv(x, s + "/Branch_0/Conv2d_0a_1x1", 192, 1)
        b0 = conv(b0, s + "/Branch_0/Conv2d_1a_3x3", 320, 3, 2, "valid")
        b1 = conv(x, s + "/Branch_1/Conv2d_0a_1x1", 192, 1)
        b1 = conv(b1, s + "/Branch_1/Conv2d_0b_1x7", 192, (1, 7))
        b1 = conv(b1, s + "/Branch_1/Conv2d_0c_7x1", 192, (7, 1))
        b1 = conv(b1, s + "/Branch_1/Conv2d_1a_3x3", 192, 3, 2, "valid")
        b2 = layers.MaxPooling2D(3, strides=2)(x)
        return layers.Concatenate()([b0, b1, b2])

    def block_e(s, x):
        b0 = conv(x, s + "/Branch_0/Conv2d_0a_1x1", 320, 1)
        b1 = conv(x, s + "/Branch_1/Conv2d_0a_1x1", 384, 1)
        b1a = conv(b1, s + "/Branch_1/Conv2d_0b_1x3", 384, (1, 3))
        b1b = conv(b1, s + "/Branch_1/Conv2d_0c_3x1", 384, (3, 1))
        b2 = conv(x, s + "/Branch_2/Conv2d_0a_1x1", 448, 1)
        b2 = conv(b2, s + "/Branch_2/Conv2d_0b_3x3", 384, 3)
        b2a = conv(b2, s + "/Branch_2/Conv2d_0c_1x3", 384, (1, 3))
        b2b = conv(b2, s + "/Branch_2/Conv2d_0d_3x1", 384, (3, 1))
        b3 = conv(avg(x), s + "/Branch_3/Conv2d_0b_1x1", 192, 1)
        return layers.Concatenate()([b0, b1a, b1b, b2a, b2b, b3])

    inputs = keras.Input(shape=shape)
    x = conv(inputs, "Conv2d_1a_3x3", 32, 3, 2, "valid")
    x = conv(x, "Conv2d_2a_3x3", 32, 3, 1, "valid")
    x = conv(x, "Conv2d_2b_3x3", 64, 3)
    x = layers.MaxPooling2D(3, strides=2)(x)
    x = conv(x, "Conv2d_3b_1x1", 80, 1, 1, "valid")
    x = conv(x, "Conv2d_4a_3x3", 192, 3, 1, "valid")
    x = layers.MaxPooling2D(3, strides=2)(x)
    x = block_a("Mixed_5b", x, 32)
    x = block_a("Mixed_5c", x, 64)
    x = block_a("Mixed_5d", x, 64)
    x = block_b("Mixed_6a", x)
    for name, c7 in [("Mixed_6b", 128), ("Mixed_6c", 160), ("Mixed_6d", 160), ("Mixed_6e", 192)]:
        x = block_c(name, x, c7)
    x = block_d("Mixed_7a", x)
    x = block_e("Mixed_7b", x)
    x = block_e("Mixed_7c", x)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dropout(0.2)(x)
    outputs = layers.Dense(classes, kernel_initializer="lecun_normal", name="Logits")(x)
    return keras.Model(inputs, outputs, name="inception_v3")


def zoo_inception_mini(keras, shape, classes):
    layers = keras.layers
    bn = (1e-3, 0.9)

    def conv(x, name, filters, kernel):
        return zoo_conv(layers, x, name.replace("/", "_"), filters, kernel, bn=bn)

    def module(s, x, c):
        b0 = conv(x, s + "/Branch_0/Conv2d_0a_1x1", c[0], 1)
        b1 = conv(x, s + "/Branch_1/Conv2d_0a_1x1", c[1], 1)
        b1 = conv(b1, s + "/Branch_1/Conv2d_0b_3x3", c[2], 3)
        b2 = conv(x, s + "/Branch_2/Conv2d_0a_1x1", c[3], 1)
        b2 = conv(b2, s + "/Branch_2/Conv2d_0b_5x5", c[4], 5)
        b3 = layers.MaxPooling2D(3, strides=1, padding="same")(x)
        b3 = conv(b3, s + "/Branch_3/Conv2d_0b_1x1", c[5], 1)
        return layers.Concatenate()([b0, b1, b2, b3])

    inputs = keras.Input(shape=shape)
    x = conv(inputs, "Conv2d_1a_3x3", 32, 3)
    x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
    x = module("Mixed_2a", x, [16, 16, 24, 8, 8, 16])
    x = module("Mixed_2b", x, [32, 24, 32, 8, 16, 16])
    x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
    x = module("Mixed_3a", x, [48, 32, 48, 12, 16, 16])
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(classes, kernel_initializer="lecun_normal", name="Logits")(x)
    return keras.Model(inputs, outputs, name="inception_mini")


# name: (builder, the published input and classes, a small input and
# classes for the suite's comparisons with the built-ins).
ZOO = {
    "resnet50": (lambda k, s, c: zoo_resnet(k, [3, 4, 6, 3], s, c, "resnet50"),
                 ((224, 224, 3), 1000), ((32, 32, 3), 5)),
    "resnet101": (lambda k, s, c: zoo_resnet(k, [3, 4, 23, 3], s, c, "resnet101"),
                  ((224, 224, 3), 1000), None),  # resnet50's code: compared in full only.
    "vgg16": (zoo_vgg16, ((224, 224, 3), 1000), ((32, 32, 3), 5)),
    "alexnet": (zoo_alexnet, ((224, 224, 3), 1000), ((63, 63, 3), 5)),
    "inception_v3": (zoo_inception_v3, ((299, 299, 3), 1000), ((75, 75, 3), 5)),
    "inception_mini": (zoo_inception_mini, ((28, 28, 1), 10), ((12, 10, 1), 3)),
    "lenet": (lambda k, s, c: lenet(k), ((28, 28, 1), 10), None),
}
ZOO_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "zoo")


def write_zoo(keras):
    os.makedirs(ZOO_OUT, exist_ok=True)
    for name, (build, full, small) in ZOO.items():
        keras.utils.clear_session()  # Auto names (input_layer, flatten) that do not drift.
        model = build(keras, *full)
        with open(os.path.join(ZOO_OUT, f"{name}.json"), "w") as f:
            f.write(model.to_json())
        print("zoo", name, model.count_params())
        if small is not None:
            keras.utils.clear_session()
            model = build(keras, *small)
            with open(os.path.join(OUT, f"zoo_{name}_small_keras3.json"), "w") as f:
                f.write(model.to_json())


def app_blocks(keras):
    """The keras.applications layers beyond the plain ones: an asymmetric
    ZeroPadding2D, a biased Conv2D > BatchNormalization > ReLU (ResNet50's),
    BatchNormalization(scale=False) (InceptionV3's), pre-activation batch
    norms after Add and Concatenate (ResNetV2's, DenseNet's), center=False,
    a batch norm after a Dense without bias."""
    layers = keras.layers
    inputs = keras.Input(shape=(12, 12, 3))
    x = layers.ZeroPadding2D(((1, 2), (0, 1)))(inputs)
    x = layers.Conv2D(8, 3, strides=2, name="conv_bias")(x)
    x = layers.BatchNormalization(epsilon=1.001e-5, name="conv_bias_bn")(x)
    x = layers.Activation("relu")(x)
    y = layers.Conv2D(8, 3, padding="same", use_bias=False, name="conv_noscale")(x)
    y = layers.BatchNormalization(scale=False, name="noscale_bn")(y)
    y = layers.Activation("relu")(y)
    a = layers.Add()([x, y])
    a = layers.BatchNormalization(name="preact_bn")(a)
    a = layers.Activation("relu")(a)
    z = layers.Conv2D(4, 1, use_bias=False, name="conv_1x1")(a)
    c = layers.Concatenate()([a, z])
    c = layers.BatchNormalization(center=False, momentum=0.9, name="nocenter_bn")(c)
    c = layers.ZeroPadding2D(1)(c)
    c = layers.MaxPooling2D(2)(c)
    g = layers.GlobalAveragePooling2D()(c)
    d = layers.Dense(6, use_bias=False, name="dense_nobias")(g)
    d = layers.BatchNormalization(name="dense_bn")(d)
    d = layers.Activation("relu")(d)
    out = layers.Dense(5, name="logits")(d)
    return keras.Model(inputs, out)


def activations(keras):
    """Every activation psrt reads, each on a branch of one conv's output:
    ReLU layers with a cap and with a slope below a threshold, relu6,
    sigmoid, tanh, silu, hard_sigmoid, hard_silu and gelu; then a conv and a
    Dense with activations of their own."""
    layers = keras.layers
    inputs = keras.Input(shape=(6, 6, 3))
    a = layers.Conv2D(6, 3, padding="same", name="conv_a")(inputs)
    branches = [layers.ReLU(max_value=0.5)(a), layers.ReLU(negative_slope=0.1, threshold=0.2)(a)]
    for name in ("relu6", "sigmoid", "tanh", "silu", "hard_sigmoid", "hard_silu", "gelu"):
        branches.append(layers.Activation(name)(a))
    x = layers.Concatenate()(branches)
    x = layers.Conv2D(4, 1, activation="swish", name="conv_swish")(x)
    g = layers.GlobalAveragePooling2D()(x)
    d = layers.Dense(6, activation="tanh", name="dense_tanh")(g)
    out = layers.Dense(3, name="logits")(d)
    return keras.Model(inputs, out)


def depthwise(keras):
    """DepthwiseConv2D as MobileNetV2 uses it (3x3, same, no bias, then batch
    norm and relu6; strided after an asymmetric ZeroPadding2D), and with a
    channel multiplier, a bias, a dilation, valid padding and its own
    activation; then a SeparableConv2D (Xception's layer) with a multiplier,
    a bias and an activation."""
    layers = keras.layers
    inputs = keras.Input(shape=(9, 9, 3))
    x = layers.Conv2D(8, 1, use_bias=False, name="expand")(inputs)
    x = layers.DepthwiseConv2D(3, padding="same", use_bias=False, name="dw_same")(x)
    x = layers.BatchNormalization(name="dw_same_bn")(x)
    x = layers.ReLU(6.0)(x)
    x = layers.ZeroPadding2D(((0, 1), (0, 1)))(x)
    x = layers.DepthwiseConv2D(3, strides=2, use_bias=False, name="dw_strided")(x)
    x = layers.DepthwiseConv2D((3, 2), depth_multiplier=2, dilation_rate=2, padding="same",
                               activation="silu", name="dw_multiplier")(x)
    x = layers.DepthwiseConv2D(2, name="dw_valid_bias")(x)
    x = layers.SeparableConv2D(5, 3, padding="same", depth_multiplier=2, activation="relu",
                               name="separable")(x)
    g = layers.GlobalAveragePooling2D()(x)
    out = layers.Dense(3, name="logits")(g)
    return keras.Model(inputs, out)


def squeeze_excite(keras):
    """EfficientNet's input and a squeeze-and-excitation block: Rescaling,
    Normalization (with constants, and without: its weights' 0 and 1),
    GlobalAveragePooling2D, Reshape to 1x1, two 1x1 convs (swish, sigmoid)
    and the broadcast Multiply; then MobileNet's head: keepdims pooling, a
    1x1 conv, Reshape to a vector."""
    layers = keras.layers
    inputs = keras.Input(shape=(8, 8, 3))
    x = layers.Rescaling(2.0, offset=-1.0)(inputs)
    x = layers.Normalization(mean=[0.1, 0.2, 0.3], variance=[0.5, 1.5, 2.0])(x)
    x = layers.Normalization()(x)
    x = layers.Conv2D(8, 3, padding="same", activation="swish", name="stem")(x)
    se = layers.GlobalAveragePooling2D()(x)
    se = layers.Reshape((1, 1, 8))(se)
    se = layers.Conv2D(2, 1, activation="swish", name="se_reduce")(se)
    se = layers.Conv2D(8, 1, activation="sigmoid", name="se_expand")(se)
    x = layers.Multiply()([x, se])
    g = layers.GlobalAveragePooling2D(keepdims=True)(x)
    g = layers.Conv2D(4, 1, name="head")(g)
    out = layers.Reshape((4,))(g)
    return keras.Model(inputs, out)


def ops_constants(keras):
    """MobileNetV3's hard sigmoid as it writes it, arithmetic with constants
    (x + 3.0, x * (1 / 6)) that Keras records as operations of one tensor,
    in its squeeze-and-excitation block."""
    layers = keras.layers
    inputs = keras.Input(shape=(6, 6, 3))
    x = layers.Conv2D(4, 3, padding="same", name="conv")(inputs)
    se = layers.GlobalAveragePooling2D(keepdims=True)(x)
    se = layers.Conv2D(4, 1, name="se")(se)
    se = layers.ReLU(6.0)(se + 3.0) * (1.0 / 6.0)
    x = layers.Multiply()([x, se])
    g = layers.GlobalAveragePooling2D()(x)
    out = layers.Dense(3, name="logits")(g)
    return keras.Model(inputs, out)


def scaled_residual(keras):
    """InceptionResNetV2's residual: its CustomScaleLayer (x + up * scale),
    with the ReLU after it and without."""
    from keras.src.applications.inception_resnet_v2 import CustomScaleLayer
    layers = keras.layers
    inputs = keras.Input(shape=(6, 6, 3))
    x = layers.Conv2D(4, 3, padding="same", name="stem")(inputs)
    up = layers.Conv2D(4, 1, name="block_up")(x)
    x = CustomScaleLayer(0.17)([x, up])
    x = layers.Activation("relu")(x)
    up = layers.Conv2D(4, 3, padding="same", name="block2_up")(x)
    x = CustomScaleLayer(1.0)([x, up])
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(3, name="logits")(x))


def global_max(keras):
    """GlobalMaxPooling2D over a map of other height than width, and with
    keepdims before a 1x1 Conv2D."""
    layers = keras.layers
    inputs = keras.Input(shape=(7, 5, 3))
    x = layers.Conv2D(4, 3, padding="same", activation="relu", name="conv")(inputs)
    pooled = layers.GlobalMaxPooling2D()(x)
    kept = layers.GlobalMaxPooling2D(keepdims=True)(x)
    kept = layers.Flatten()(layers.Conv2D(4, 1, name="pointwise")(kept))
    joined = layers.Concatenate()([pooled, kept])
    return keras.Model(inputs, layers.Dense(3, name="logits")(joined))


def convnext_block(keras):
    """ConvNeXt's layers as keras.applications writes them: a Sequential stem
    nested in the Functional model (a strided Conv2D, then LayerNormalization),
    a Conv2D with groups = channels, Dense on a map (per pixel), gelu,
    LayerScale, the residual Add, and a LayerNormalization of the pooled
    vector."""
    from keras.src.applications.convnext import LayerScale
    layers = keras.layers
    inputs = keras.Input(shape=(8, 8, 3))
    stem = keras.Sequential([layers.Conv2D(8, 2, strides=2, name="stem_conv"),
                             layers.LayerNormalization(epsilon=1e-6, name="stem_layernorm")],
                            name="stem")
    x = stem(inputs)
    y = layers.Conv2D(8, 3, padding="same", groups=8, name="depthwise_conv")(x)
    y = layers.LayerNormalization(epsilon=1e-6, name="layernorm")(y)
    y = layers.Dense(16, name="pointwise_conv_1")(y)
    y = layers.Activation("gelu", name="gelu")(y)
    y = layers.Dense(8, name="pointwise_conv_2")(y)
    y = LayerScale(0.5, 8, name="layer_scale")(y)
    x = layers.Add()([x, y])
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.LayerNormalization(epsilon=1e-6, name="head_layernorm")(x)
    return keras.Model(inputs, layers.Dense(3, name="logits")(x))


def binary(keras):
    """A binary classifier as Keras's image-classification guide ends one:
    a single sigmoid unit, trained with binary cross-entropy."""
    layers = keras.layers
    inputs = keras.Input(shape=(6, 6, 2))
    x = layers.Conv2D(4, 3, activation="relu", name="conv")(inputs)
    x = layers.GlobalAveragePooling2D()(x)
    out = layers.Dense(1, activation="sigmoid", name="logit")(x)
    return keras.Model(inputs, out)


# Models whose computation the suite checks against Keras's.
EXACT = [("plain_cnn", plain_cnn), ("residual_block", residual_block), ("app_blocks", app_blocks),
         ("activations", activations), ("depthwise", depthwise),
         ("squeeze_excite", squeeze_excite), ("ops_constants", ops_constants),
         ("binary", binary), ("scaled_residual", scaled_residual), ("global_max", global_max),
         ("convnext_block", convnext_block)]


def fused_into_conv(norm):
    """Whether psrt fuses this BatchNormalization into the Conv2D before it:
    a conv without bias or activation that only it reads, and a batch norm
    that centers and scales."""
    conv = norm._inbound_nodes[0].parent_nodes[0].operation
    return (type(conv).__name__ == "Conv2D" and not conv.use_bias and
            conv.activation.__name__ == "linear" and len(conv._outbound_nodes) == 1 and
            norm.center and norm.scale)


def flat_layers(layers):
    """The layers, those of nested Sequential models in their place (psrt
    reads a nested Sequential as its layers)."""
    for layer in layers:
        if type(layer).__name__ == "Sequential":
            yield from flat_layers(layer.layers)
        else:
            yield layer


def psrt_names(model):
    """Keras weight -> psrt variable name, in psrt's variable order, and
    psrt's shape where it differs from Keras's (else None)."""
    names = []
    for layer in flat_layers(model.layers):
        kind = type(layer).__name__
        if kind == "Conv2D" and layer.groups > 1:  # Depthwise: [h, w, 1, C] -> [h, w, C, 1].
            h, w, _, c = layer.kernel.shape
            names.append((layer.kernel, f"{layer.name}/depthwise_weights", (h, w, c, 1)))
            if layer.use_bias:
                names.append((layer.bias, f"{layer.name}/biases", None))
        elif kind in ("Conv2D", "Dense"):
            per_pixel = kind == "Dense" and len(layer.input.shape) == 4  # A 1x1 conv in psrt.
            shape = (1, 1) + tuple(layer.kernel.shape) if per_pixel else None
            names.append((layer.kernel, f"{layer.name}/weights", shape))
            if layer.use_bias:
                names.append((layer.bias, f"{layer.name}/biases", None))
        elif kind == "LayerNormalization":
            names.append((layer.gamma, f"{layer.name}/gamma", None))
            names.append((layer.beta, f"{layer.name}/beta", None))
        elif kind == "LayerScale":
            names.append((layer.gamma, f"{layer.name}/gamma", None))
        elif kind == "DepthwiseConv2D":
            names.append((layer.kernel, f"{layer.name}/depthwise_weights", None))
            if layer.use_bias:
                names.append((layer.bias, f"{layer.name}/biases", None))
        elif kind == "SeparableConv2D":
            names.append((layer.depthwise_kernel, f"{layer.name}/depthwise_weights", None))
            names.append((layer.pointwise_kernel, f"{layer.name}/pointwise/weights", None))
            if layer.use_bias:
                names.append((layer.bias, f"{layer.name}/pointwise/biases", None))
        elif kind == "BatchNormalization" and fused_into_conv(layer):
            conv = layer._inbound_nodes[0].parent_nodes[0].operation
            names.append((layer.gamma, f"{conv.name}/BatchNorm/gamma", None))
            names.append((layer.beta, f"{conv.name}/BatchNorm/beta", None))
            names.append((layer.moving_mean, f"{conv.name}/BatchNorm/moving_mean", None))
            names.append((layer.moving_variance, f"{conv.name}/BatchNorm/moving_variance", None))
        elif kind == "BatchNormalization":  # A batch norm of its own.
            if layer.scale:
                names.append((layer.gamma, f"{layer.name}/gamma", None))
            if layer.center:
                names.append((layer.beta, f"{layer.name}/beta", None))
            names.append((layer.moving_mean, f"{layer.name}/moving_mean", None))
            names.append((layer.moving_variance, f"{layer.name}/moving_variance", None))
    return names


def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata}
    offset = 0
    blobs = []
    for name, array in tensors:
        data = array.astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def write_exact(keras):
    import numpy as np
    import tensorflow as tf
    keras.utils.set_random_seed(7)
    for name, build in EXACT:
        model = build(keras)
        # Away from the initial point: biases and batch norm's offsets too.
        rng = np.random.default_rng(11)
        for w in model.trainable_weights:
            w.assign(w.numpy() + rng.uniform(-0.1, 0.1, w.shape).astype("float32"))
        shape = model.inputs[0].shape[1:]
        batch = 6
        images = rng.uniform(0, 1, (batch,) + tuple(shape)).astype("float32")
        classes = model.outputs[0].shape[-1]
        if classes == 1:  # A sigmoid unit: labels 0 and 1, binary cross-entropy.
            labels = (np.arange(batch) * 3 + 1) % 2
            binary_loss = keras.losses.BinaryCrossentropy()
            loss_fn = lambda y, p: binary_loss(y.reshape(-1, 1).astype("float32"), p)
        else:
            labels = (np.arange(batch) * 3 + 1) % classes
            loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        names = psrt_names(model)
        before = [w.numpy() for w, _, _ in names]
        # The same weights as Keras saves them, for psrt to read back exactly;
        # compiled, as after model.fit, so the file holds optimizer variables too.
        model.compile(optimizer="adam")
        model.optimizer.build(model.trainable_variables)
        model.save_weights(os.path.join(OUT, f"{name}_keras3.weights.h5"))
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = loss_fn(labels, logits)
        trainable = [w for w, _, _ in names if w.trainable]
        grads = iter(tape.gradient(loss, trainable))
        # A moving statistic's "gradient" in psrt is its new value.
        grads = [next(grads) if w.trainable else w.numpy() for w, _, _ in names]
        # Inference mode after that one training step (batch norm's moving
        # statistics moved once, by the file's momentum).
        eval_loss = loss_fn(labels, model(images, training=False))
        as_psrt = lambda v, shape: np.asarray(v) if shape is None else np.asarray(v).reshape(shape)
        tensors = [(n, b if shape is None else b.reshape(shape))
                   for (_, n, shape), b in zip(names, before)]
        tensors += [("grad:" + n, as_psrt(g, shape)) for (_, n, shape), g in zip(names, grads)]
        tensors.append(("images", images.reshape(batch, -1)))
        tensors.append(("labels", labels.astype("float32")))
        tensors.append(("loss", np.array([float(loss)], dtype="float32")))
        tensors.append(("eval_loss", np.array([float(eval_loss)], dtype="float32")))
        if classes == 1:  # Keras's predicted classes, by its 0.5 threshold.
            probability = model(images, training=False).numpy()[:, 0]
            tensors.append(("predictions", (probability > 0.5).astype("float32")))
        with open(os.path.join(OUT, f"{name}_keras3.json"), "w") as f:
            f.write(model.to_json())
        write_safetensors(os.path.join(OUT, f"{name}_keras3.safetensors"), tensors,
                          {"keras": keras.__version__})
        print(name, "loss", float(loss))


# keras.applications' CNNs, as Keras writes them (weights=None, the
# published input size (224x224 where Keras leaves it open), 1000 classes).
APPLICATIONS = [
    "ResNet50", "ResNet101", "ResNet152", "ResNet50V2", "ResNet101V2", "ResNet152V2",
    "VGG16", "VGG19", "InceptionV3", "InceptionResNetV2", "Xception", "MobileNet",
    "MobileNetV2", "MobileNetV3Small", "MobileNetV3Large", "DenseNet121", "DenseNet169",
    "DenseNet201", "EfficientNetB0", "EfficientNetB1", "EfficientNetB2", "EfficientNetB3",
    "ConvNeXtTiny"]


def write_applications(keras):
    """apps/NAME.json.gz, and apps/counts.txt: NAME, count_params() (moving
    statistics included) and the trainable weights' count, a line each."""
    import gzip
    import numpy as np
    apps = os.path.join(OUT, "apps")
    os.makedirs(apps, exist_ok=True)
    lines = []
    for name in APPLICATIONS:
        keras.utils.clear_session()  # Layer names that do not hang on what came before.
        model = getattr(keras.applications, name)(weights=None)
        if None in model.inputs[0].shape[1:]:  # MobileNetV3's default: any size.
            model = getattr(keras.applications, name)(weights=None, input_shape=(224, 224, 3))
        with gzip.GzipFile(os.path.join(apps, f"{name}.json.gz"), "wb", mtime=0) as f:
            f.write(model.to_json().encode())
        trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
        lines.append(f"{name} {model.count_params()} {trainable}\n")
        print(name, model.count_params(), trainable)
    with open(os.path.join(apps, "counts.txt"), "w") as f:
        f.write("".join(lines))


def keras_weights_fixture(out_dir):
    """The files of tests/models/keras_weights_file_test.cc: small.weights.h5,
    what model.save_weights writes for a small Functional model, variable k
    of the file (its vars groups in the order h5py visits them, then vars/0,
    vars/1, ...) holding float32(0.001 * (i + 1) + k) at element i (C order);
    and two that h5py writes and the reader refuses: a float64 variable
    (float64.weights.h5), variables 0 and 2 without 1 (gap.weights.h5)."""
    import h5py
    import keras
    import numpy as np
    os.makedirs(out_dir, exist_ok=True)
    keras.utils.clear_session()  # Layer names that do not hang on what came before.
    layers = keras.layers
    inputs = keras.Input(shape=(8, 8, 3))
    x = layers.Conv2D(4, 3, name="c1")(inputs)
    x = layers.BatchNormalization(name="bn")(x)
    x = layers.Activation("relu")(x)
    x = layers.DepthwiseConv2D(3, name="dw")(x)
    x = layers.SeparableConv2D(4, 1, name="sep")(x)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.LayerNormalization(name="ln")(x)
    model = keras.Model(inputs, layers.Dense(2, name="d")(x))
    path = os.path.join(out_dir, "small.weights.h5")
    model.save_weights(path)
    groups = []  # (layer name, variable shapes), in the file's order.

    def collect(name, obj):
        if name.split("/")[-1] == "vars":
            groups.append((obj.attrs["name"], [obj[str(j)].shape for j in range(len(obj))]))

    with h5py.File(path, "r") as f:
        f.visititems(collect)
    k = 0
    for name, shapes in groups:
        store = {}
        for j, shape in enumerate(shapes):
            i = np.arange(int(np.prod(shape)))
            store[str(j)] = (0.001 * (i + 1) + k).astype(np.float32).reshape(shape)
            k += 1
        if store:
            model.get_layer(name).load_own_variables(store)
    model.save_weights(path)
    for name, write in [("float64", lambda g: g.create_dataset("0", data=np.zeros(2))),
                        ("gap", lambda g: [g.create_dataset(str(j), data=np.zeros(2, np.float32))
                                           for j in (0, 2)])]:
        with h5py.File(os.path.join(out_dir, f"{name}.weights.h5"), "w") as f:
            group = f.create_group("layers/dense/vars")
            group.attrs["name"] = "dense"
            write(group)
    print(path, k, "variables")


def main():
    os.makedirs(OUT, exist_ok=True)
    import keras  # Keras 3, as TensorFlow 2.21 ships it.
    assert keras.__version__.startswith("3."), keras.__version__
    write(keras, "keras3")
    write_exact(keras)
    write_zoo(keras)
    write_applications(keras)
    keras_weights_fixture(os.path.join(OUT, "weights"))
    import tf_keras  # Keras 2.
    write(tf_keras, "keras2")
    return 0


if __name__ == "__main__":
    sys.exit(main())
