#!/usr/bin/env python3
"""Keras peer of psrt's training benchmark (scripts/bench_train.sh): times
Keras's own model.fit of a Keras model file on tensorflow-cpu, and prints
one line:
    keras: file=F batch=B threads=T examples_per_sec=X
The model is the file's (keras.models.model_from_json), compiled with plain
SGD (learning rate 0.01) and sparse softmax cross-entropy (from the
probabilities where the file ends in a softmax, else from the logits; a
single unit: binary cross-entropy), trained on one batch of random images
of the file's input shape and random labels, fed again every step as
psrt's --synthetic_data does. Examples/sec is the median of --runs timed
fit() calls of --steps steps each, after a warm-up call (tracing and the
first steps). TensorFlow runs on --threads threads (intra- and inter-op).

Also writes keras.applications' files at a reduced size for the benchmark:
    keras_train.py --write_app ResNet50 --image_size 64 --classes 10 --out F
Needs tensorflow-cpu (scripts/keras_venv.sh).
"""
import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def last_activation(config):
    """The activation of the model's output layer, "" when it has none."""
    layers = config["config"]["layers"]
    return layers[-1]["config"].get("activation", "") or ""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model_file")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--write_app", help="a keras.applications name: write its file")
    parser.add_argument("--image_size", type=int, default=64)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--out")
    args = parser.parse_args()

    import numpy as np
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    import keras

    if args.write_app:
        model = getattr(keras.applications, args.write_app)(
            weights=None, input_shape=(args.image_size, args.image_size, 3),
            classes=args.classes)
        with open(args.out, "w") as f:
            f.write(model.to_json())
        return 0

    text = open(args.model_file).read()
    model = keras.models.model_from_json(text)
    activation = last_activation(json.loads(text))
    shape = tuple(model.inputs[0].shape[1:])
    classes = model.outputs[0].shape[-1]
    rng = np.random.default_rng(1)
    images = rng.uniform(0, 1, (args.batch_size,) + shape).astype("float32")
    if classes == 1:
        labels = rng.integers(0, 2, (args.batch_size, 1)).astype("float32")
        loss = keras.losses.BinaryCrossentropy(from_logits=activation != "sigmoid")
    else:
        labels = rng.integers(0, classes, args.batch_size)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=activation != "softmax")
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss=loss)
    data = tf.data.Dataset.from_tensors((images, labels)).repeat().prefetch(2)
    model.fit(data, steps_per_epoch=args.steps, epochs=1, verbose=0)  # Warm-up.
    rates = []
    for _ in range(args.runs):
        start = time.perf_counter()
        model.fit(data, steps_per_epoch=args.steps, epochs=1, verbose=0)
        rates.append(args.steps * args.batch_size / (time.perf_counter() - start))
    print(f"keras: file={os.path.basename(args.model_file)} batch={args.batch_size} "
          f"threads={args.threads} examples_per_sec={statistics.median(rates):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
