#!/usr/bin/env python3
"""Writes the Keras model files that tests/models/keras_model_test.cc reads
(tests/data/keras/): each model in Keras 3's format (TensorFlow 2.21's
keras) and in Keras 2's (tf_keras, what tf.keras wrote before TF 2.16), with
its count_params() in a .params file beside it. The suite itself needs no
Python; rerun this only to change the fixtures:

  python3 -m venv ~/.cache/psrt-bench/tf-venv
  ~/.cache/psrt-bench/tf-venv/bin/pip install tensorflow-cpu tf_keras
  ~/.cache/psrt-bench/tf-venv/bin/python scripts/gen_keras_fixtures.py
"""
import os
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


def unsupported(keras):
    """A layer psrt does not read (the error must name it)."""
    layers = keras.layers
    return keras.Sequential([
        keras.Input(shape=(8, 8, 1)),
        layers.Conv2D(4, 3),
        layers.LayerNormalization(),
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


def main():
    os.makedirs(OUT, exist_ok=True)
    import keras  # Keras 3, as TensorFlow 2.21 ships it.
    assert keras.__version__.startswith("3."), keras.__version__
    write(keras, "keras3")
    import tf_keras  # Keras 2.
    write(tf_keras, "keras2")
    return 0


if __name__ == "__main__":
    sys.exit(main())
