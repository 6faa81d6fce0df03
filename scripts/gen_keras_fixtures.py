#!/usr/bin/env python3
"""Writes the Keras model files that tests/models/keras_model_test.cc reads
(tests/data/keras/): each model in Keras 3's format (TensorFlow 2.21's
keras) and in Keras 2's (tf_keras, what tf.keras wrote before TF 2.16), with
its count_params() in a .params file beside it; and, for the models of
EXACT, what Keras computes on a batch: NAME_keras3.safetensors holds the
weights under psrt's variable names, the images [B, H*W*C] and labels, the
mean softmax cross-entropy (training mode: batch norm on batch statistics)
and its gradient for every weight ("grad:" + the name). The suite itself
needs no Python; rerun this only to change the fixtures:

  python3 -m venv ~/.cache/psrt-bench/tf-venv
  ~/.cache/psrt-bench/tf-venv/bin/pip install tensorflow-cpu tf_keras
  ~/.cache/psrt-bench/tf-venv/bin/python scripts/gen_keras_fixtures.py
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


# Models whose computation the suite checks against Keras's.
EXACT = [("plain_cnn", plain_cnn), ("residual_block", residual_block)]


def psrt_names(model):
    """Keras weight -> psrt variable name, in psrt's variable order."""
    names = []
    layers = model.layers
    for i, layer in enumerate(layers):
        kind = type(layer).__name__
        if kind in ("Conv2D", "Dense"):
            names.append((layer.kernel, f"{layer.name}/weights"))
            if layer.use_bias:
                names.append((layer.bias, f"{layer.name}/biases"))
        elif kind == "BatchNormalization":
            conv = layer._inbound_nodes[0].parent_nodes[0].operation if hasattr(
                layer._inbound_nodes[0], "parent_nodes") else None
            names.append((layer.gamma, f"{conv.name}/BatchNorm/gamma"))
            names.append((layer.beta, f"{conv.name}/BatchNorm/beta"))
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
        labels = (np.arange(batch) * 3 + 1) % classes
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = loss_fn(labels, logits)
        names = psrt_names(model)
        grads = tape.gradient(loss, [w for w, _ in names])
        tensors = [(n, w.numpy()) for w, n in names]
        tensors += [("grad:" + n, g.numpy()) for (_, n), g in zip(names, grads)]
        tensors.append(("images", images.reshape(batch, -1)))
        tensors.append(("labels", labels.astype("float32")))
        tensors.append(("loss", np.array([float(loss)], dtype="float32")))
        with open(os.path.join(OUT, f"{name}_keras3.json"), "w") as f:
            f.write(model.to_json())
        write_safetensors(os.path.join(OUT, f"{name}_keras3.safetensors"), tensors,
                          {"keras": keras.__version__})
        print(name, "loss", float(loss))


def main():
    os.makedirs(OUT, exist_ok=True)
    import keras  # Keras 3, as TensorFlow 2.21 ships it.
    assert keras.__version__.startswith("3."), keras.__version__
    write(keras, "keras3")
    write_exact(keras)
    import tf_keras  # Keras 2.
    write(tf_keras, "keras2")
    return 0


if __name__ == "__main__":
    sys.exit(main())
