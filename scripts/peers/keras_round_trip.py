#!/usr/bin/env python3
"""Keras's side of scripts/keras_round_trip.sh.

  keras_round_trip.py models DIR
      writes DIR/sequential_cnn.json (a Sequential CNN) and
      DIR/functional_bn.json (a Functional network with batch norms and a
      residual Add), both for Fashion-MNIST's 28x28x1 images and 10 classes.
  keras_round_trip.py check MODEL.json WEIGHTS.weights.h5 PSRT.txt IDX_DIR
      loads the model file and the weights as a user would
      (keras.models.model_from_json(...).load_weights(...)), predicts the
      first images of IDX_DIR's t10k split, and compares each probability
      with psrt's (PSRT.txt, psrt_predict's lines: label, then one
      probability per class). Prints the largest difference; exits 1 when
      it is above 1e-5 or a label differs.
"""
import gzip
import os
import sys

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def models(out_dir):
    import keras
    from keras import layers
    os.makedirs(out_dir, exist_ok=True)
    sequential = keras.Sequential([
        keras.Input((28, 28, 1)),
        layers.Conv2D(16, 5, padding="same", activation="relu", name="conv1"),
        layers.MaxPooling2D(2),
        layers.Conv2D(32, 3, activation="relu", name="conv2"),
        layers.MaxPooling2D(2),
        layers.Flatten(),
        layers.Dense(64, activation="relu", name="fc1"),
        layers.Dense(10, activation="softmax", name="logits"),
    ], name="sequential_cnn")
    inputs = keras.Input((28, 28, 1))
    x = layers.Conv2D(16, 3, padding="same", use_bias=False, name="stem")(inputs)
    x = layers.BatchNormalization(momentum=0.9, name="stem_bn")(x)
    x = layers.ReLU()(x)
    y = layers.Conv2D(16, 3, padding="same", use_bias=False, name="block_conv")(x)
    y = layers.BatchNormalization(momentum=0.9, name="block_bn")(y)
    x = layers.Activation("relu")(layers.Add()([x, y]))
    x = layers.MaxPooling2D(2)(x)
    x = layers.Conv2D(32, 3, strides=2, name="down")(x)
    x = layers.BatchNormalization(momentum=0.9, center=False, name="down_bn")(x)
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(10, activation="softmax", name="logits")(x)
    functional = keras.Model(inputs, outputs, name="functional_bn")
    for model, name in ((sequential, "sequential_cnn"), (functional, "functional_bn")):
        with open(os.path.join(out_dir, name + ".json"), "w") as f:
            f.write(model.to_json())


def idx_images(path, count):
    import numpy as np
    with gzip.open(path) if path.endswith(".gz") else open(path, "rb") as f:
        data = f.read()
    rows, cols = int.from_bytes(data[8:12], "big"), int.from_bytes(data[12:16], "big")
    pixels = np.frombuffer(data, np.uint8, count * rows * cols, 16)
    return (pixels.astype("float32") / 255.0).reshape(count, rows, cols, 1)


def check(model_file, weights, psrt_file, idx_dir):
    import keras
    import numpy as np
    psrt = np.loadtxt(psrt_file, ndmin=2)
    model = keras.models.model_from_json(open(model_file).read())
    model.load_weights(weights)
    names = [n for n in ("t10k-images-idx3-ubyte", "t10k-images-idx3-ubyte.gz")
             if os.path.exists(os.path.join(idx_dir, n))]
    images = idx_images(os.path.join(idx_dir, names[0]), len(psrt))
    keras_p = model.predict(images, batch_size=len(psrt), verbose=0).astype("float64")
    difference = float(np.max(np.abs(keras_p - psrt[:, 1:])))
    same_classes = bool(np.all(keras_p.argmax(1) == psrt[:, 1:].argmax(1)))
    print(f"round_trip: model={os.path.basename(model_file)} images={len(psrt)} "
          f"max_abs_difference={difference:.3g} same_predicted_classes={same_classes} "
          f"keras={keras.__version__}")
    return 0 if difference <= 1e-5 and same_classes else 1


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "models":
        models(sys.argv[2])
        return 0
    if len(sys.argv) == 6 and sys.argv[1] == "check":
        return check(*sys.argv[2:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
