#!/usr/bin/env python3
"""Writes the PyTorch oracle fixtures of psrt's kernel and model tests.

    /usr/bin/python3 scripts/gen_oracle.py [--out_dir tests/data]

Runs PyTorch on the CPU, in float64, on fixed inputs and writes what the
C++ tests compare against (tests/kernels/oracle_test.cc,
tests/models/lenet_oracle_test.cc), so the C++ suite never needs Python:

  tests/data/oracle_ops.safetensors    every op: inputs, upstream gradient,
                                       outputs and input gradients
  tests/data/oracle_lenet.safetensors  LeNet's loss and parameter gradients
                                       on a fixed batch

Needs torch and numpy (Debian: apt-get install python3-torch, which brings
numpy; or pip install torch numpy). The files are written by hand in the
safetensors format (common/safetensors.h describes it), all F32, so the
`safetensors` package is not needed. Re-running gives the same bytes.

Layouts: psrt is NHWC with HWIO filters; PyTorch is NCHW with OIHW filters.
Inputs are made in psrt's layout, converted for PyTorch, and results
converted back. TensorFlow's SAME padding (asymmetric when the total is
odd: the extra cell goes after) is applied with F.pad before PyTorch's
unpadded ops; pools pad with -inf (max) or skip padded cells (average).

Each op case stores "<op>/<case>/shape", a small F32 vector of the integer
sizes the C++ test needs (documented per op below), so the test iterates
over the cases it finds.
"""

import argparse
import json
import os
import struct

import numpy as np
import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)

MASK64 = (1 << 64) - 1


def splitmix_uniform(seed, n):
    """Uniform [0, 1) floats: the SplitMix64 hash of (seed, i), top 24 bits.

    The same function as functor::DropoutKeep in kernels/layer_functors.h,
    written again here (uint64 arithmetic wraps in numpy as in C++)."""
    with np.errstate(over="ignore"):
        i = np.arange(n, dtype=np.uint64)
        z = np.uint64(seed) + (i + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(40)).astype(np.float64) / float(1 << 24)


def hashed(seed, shape, lo=-1.0, hi=1.0):
    """Values in [lo, hi) from splitmix_uniform, rounded to float32 (so that
    the C++ test, which regenerates them, starts from the same floats)."""
    n = int(np.prod(shape))
    u = splitmix_uniform(seed, n)
    return (lo + (hi - lo) * u).astype(np.float32).astype(np.float64).reshape(shape)


def same_padding(size, k, s):
    out = (size + s - 1) // s
    total = max((out - 1) * s + k - size, 0)
    return total // 2, total - total // 2


def nhwc_to_nchw(x):
    return x.permute(0, 3, 1, 2)


def nchw_to_nhwc(x):
    return x.permute(0, 2, 3, 1)


def pad_same(x_nchw, kh, kw, sh, sw, value=0.0):
    top, bottom = same_padding(x_nchw.shape[2], kh, sh)
    left, right = same_padding(x_nchw.shape[3], kw, sw)
    return F.pad(x_nchw, (left, right, top, bottom), value=value)


def conv2d_nhwc(x, w_hwio, stride, same):
    """TensorFlow's conv2d on NHWC x and an HWIO filter."""
    xc = nhwc_to_nchw(x)
    kh, kw = w_hwio.shape[0], w_hwio.shape[1]
    if same:
        xc = pad_same(xc, kh, kw, stride, stride)
    y = F.conv2d(xc, w_hwio.permute(3, 2, 0, 1), stride=stride)
    return nchw_to_nhwc(y)


def pool_nhwc(x, k, stride, same, is_max):
    """TensorFlow's max_pool / avg_pool (padded cells never count)."""
    xc = nhwc_to_nchw(x)
    if is_max:
        if same:
            xc = pad_same(xc, k, k, stride, stride, value=-float("inf"))
        return nchw_to_nhwc(F.max_pool2d(xc, k, stride))
    ones = torch.ones_like(xc)
    if same:
        xc = pad_same(xc, k, k, stride, stride)
        ones = pad_same(ones, k, k, stride, stride)
    sums = F.avg_pool2d(xc, k, stride, divisor_override=1)
    counts = F.avg_pool2d(ones, k, stride, divisor_override=1)
    return nchw_to_nhwc(sums / counts)


class Fixture:
    def __init__(self):
        self.tensors = {}

    def add(self, name, value):
        a = value.detach().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
        a = np.ascontiguousarray(a, dtype=np.float32)
        if a.ndim == 0:
            a = a.reshape(1)
        assert name not in self.tensors, name
        self.tensors[name] = a

    def write(self, path, metadata):
        header = {"__metadata__": metadata}
        offset = 0
        names = sorted(self.tensors)
        for name in names:
            a = self.tensors[name]
            header[name] = {"dtype": "F32", "shape": list(a.shape),
                            "data_offsets": [offset, offset + a.nbytes]}
            offset += a.nbytes
        text = json.dumps(header, separators=(",", ":"))
        text += " " * ((8 - len(text) % 8) % 8)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text.encode("ascii"))
            for name in names:
                f.write(self.tensors[name].astype("<f4").tobytes())


def leaf(a):
    return torch.tensor(a, requires_grad=True)


def conv_cases(fx):
    # shape: [batch, h, w, c, fh, fw, out, stride, same]
    cases = {
        "same3x3": [2, 5, 6, 3, 3, 3, 4, 1, 1],
        "same3x3s2": [2, 7, 7, 2, 3, 3, 3, 2, 1],
        "same5x5s2even": [2, 8, 6, 2, 5, 5, 3, 2, 1],
        "valid5x5": [2, 8, 7, 2, 5, 5, 3, 1, 0],
        "valid3x3s2": [2, 7, 9, 2, 3, 3, 2, 2, 0],
        "same1x7": [2, 4, 9, 2, 1, 7, 3, 1, 1],
        "same7x1": [2, 9, 4, 2, 7, 1, 3, 1, 1],
        "pointwise": [2, 4, 5, 6, 1, 1, 3, 1, 1],
    }
    for i, (name, s) in enumerate(sorted(cases.items())):
        b, h, w, c, fh, fw, out, stride, same = s
        x = leaf(hashed(100 + i, (b, h, w, c)))
        f = leaf(hashed(200 + i, (fh, fw, c, out)))
        y = conv2d_nhwc(x, f, stride, same)
        dy = torch.tensor(hashed(300 + i, tuple(y.shape)))
        (y * dy).sum().backward()
        p = "conv/" + name + "/"
        fx.add(p + "shape", s)
        fx.add(p + "x", x)
        fx.add(p + "filter", f)
        fx.add(p + "dy", dy)
        fx.add(p + "y", y)
        fx.add(p + "dx", x.grad)
        fx.add(p + "dfilter", f.grad)


def pool_cases(fx):
    # shape: [batch, h, w, c, window, stride, same]
    cases = {
        "valid2x2s2": [2, 4, 6, 3, 2, 2, 0],
        "same2x2s2odd": [2, 5, 5, 2, 2, 2, 1],
        "same3x3s1": [2, 5, 4, 3, 3, 1, 1],
        "same3x3s2": [1, 7, 6, 2, 3, 2, 1],
        "valid3x3s2": [2, 7, 9, 2, 3, 2, 0],
    }
    for i, (name, s) in enumerate(sorted(cases.items())):
        b, h, w, c, k, stride, same = s
        p = "pool/" + name + "/"
        fx.add(p + "shape", s)
        x_np = hashed(400 + i, (b, h, w, c))
        fx.add(p + "x", x_np)
        dy = None
        for kind, is_max in (("max", True), ("avg", False)):
            x = leaf(x_np)
            y = pool_nhwc(x, k, stride, same, is_max)
            if dy is None:
                dy = torch.tensor(hashed(500 + i, tuple(y.shape)))
                fx.add(p + "dy", dy)
            (y * dy).sum().backward()
            fx.add(p + kind + "_y", y)
            fx.add(p + kind + "_dx", x.grad)


def global_avg_pool_case(fx):
    b, pixels, c = 3, 10, 4
    x = leaf(hashed(600, (b, pixels, c)))
    y = x.mean(dim=1)
    dy = torch.tensor(hashed(601, (b, c)))
    (y * dy).sum().backward()
    fx.add("global_avg_pool/shape", [b, pixels, c])
    fx.add("global_avg_pool/x", x)
    fx.add("global_avg_pool/dy", dy)
    fx.add("global_avg_pool/y", y)
    fx.add("global_avg_pool/dx", x.grad)


def concat_case(fx):
    pixels, channels = 6, [2, 3, 1]
    xs = [leaf(hashed(700 + i, (pixels, c))) for i, c in enumerate(channels)]
    y = torch.cat(xs, dim=1)
    dy = torch.tensor(hashed(710, tuple(y.shape)))
    (y * dy).sum().backward()
    fx.add("concat/shape", [pixels] + channels)
    for i, x in enumerate(xs):
        fx.add("concat/x%d" % i, x)
        fx.add("concat/dx%d" % i, x.grad)
    fx.add("concat/dy", dy)
    fx.add("concat/y", y)


def batch_norm_case(fx):
    # shape: [rows, channels, epsilon, momentum (TensorFlow's decay)]
    rows, c, eps, momentum = 12, 5, 1e-3, 0.9
    x = leaf(hashed(800, (rows, c), -2.0, 3.0))
    gamma = leaf(hashed(801, (c,), 0.5, 1.5))
    beta = leaf(hashed(802, (c,)))
    moving_mean = torch.tensor(hashed(803, (c,)))
    moving_var = torch.tensor(hashed(804, (c,), 0.5, 2.0))
    fx.add("batch_norm/shape", [rows, c, eps, momentum])
    fx.add("batch_norm/moving_mean_in", moving_mean)
    fx.add("batch_norm/moving_var_in", moving_var)
    # PyTorch's momentum is TensorFlow's 1 - decay; both update the moving
    # variance with the unbiased batch variance.
    y = F.batch_norm(x, moving_mean, moving_var, gamma, beta, training=True,
                     momentum=1 - momentum, eps=eps)
    dy = torch.tensor(hashed(805, (rows, c)))
    (y * dy).sum().backward()
    for name, t in (("x", x), ("gamma", gamma), ("beta", beta), ("dy", dy),
                    ("y", y), ("dx", x.grad), ("dgamma", gamma.grad),
                    ("dbeta", beta.grad), ("moving_mean_out", moving_mean),
                    ("moving_var_out", moving_var)):
        fx.add("batch_norm/" + name, t)
    with torch.no_grad():
        y_inf = F.batch_norm(x, moving_mean, moving_var, gamma, beta,
                             training=False, eps=eps)
    fx.add("batch_norm/y_inference", y_inf)


def dropout_case(fx):
    n, keep_prob, seed = 64, 0.75, 12345
    x = hashed(900, (n,))
    dy = hashed(901, (n,))
    keep = splitmix_uniform(seed, n).astype(np.float32) < np.float32(keep_prob)
    fx.add("dropout/shape", [n, keep_prob, seed])
    fx.add("dropout/x", x)
    fx.add("dropout/dy", dy)
    fx.add("dropout/y", np.where(keep, x / keep_prob, 0.0))
    fx.add("dropout/dx", np.where(keep, dy / keep_prob, 0.0))


def l2_loss_case(fx):
    x = leaf(hashed(950, (37,)))
    loss = (x * x).sum() / 2  # tf.nn.l2_loss
    loss.backward()
    fx.add("l2_loss/x", x)
    fx.add("l2_loss/loss", loss)
    fx.add("l2_loss/dx", x.grad)


# LeNet: its variables in psrt's order, with the scale of their hashed
# values. The C++ test regenerates them with the same hash (seed 1000 + i).
LENET_VARIABLES = [
    ("conv1/weights", (5, 5, 1, 32), 0.3),
    ("conv1/biases", (32,), 0.1),
    ("conv2/weights", (5, 5, 32, 64), 0.05),
    ("conv2/biases", (64,), 0.1),
    ("fc1/weights", (3136, 512), 0.03),
    ("fc1/biases", (512,), 0.1),
    ("fc2/weights", (512, 10), 0.1),
    ("fc2/biases", (10,), 0.1),
]
LENET_LABELS = [3, 7, 0]
# Gradients of variables with more elements are stored at every
# (n // SAMPLES)-th element: SAMPLES of them.
SAMPLES = 4096


def lenet_fixture(fx):
    batch = len(LENET_LABELS)
    images = torch.tensor(hashed(999, (batch, 28 * 28), 0.0, 1.0))
    params = [leaf(hashed(1000 + i, shape, -scale, scale))
              for i, (_, shape, scale) in enumerate(LENET_VARIABLES)]
    w1, b1, w2, b2, w3, b3, w4, b4 = params
    x = images.reshape(batch, 28, 28, 1)
    x = torch.relu(conv2d_nhwc(x, w1, 1, True) + b1)
    x = pool_nhwc(x, 2, 2, True, True)
    x = torch.relu(conv2d_nhwc(x, w2, 1, True) + b2)
    x = pool_nhwc(x, 2, 2, True, True)
    x = torch.relu(x.reshape(batch, -1) @ w3 + b3)  # NHWC flatten, as TF
    logits = x @ w4 + b4
    loss = F.cross_entropy(logits, torch.tensor(LENET_LABELS))
    loss.backward()
    fx.add("images", images)
    fx.add("labels", LENET_LABELS)
    fx.add("loss", loss)
    fx.add("logits", logits)
    for (name, shape, _), p in zip(LENET_VARIABLES, params):
        g = p.grad.reshape(-1)
        n = g.numel()
        if n > SAMPLES:
            g = g[::n // SAMPLES][:SAMPLES]
        fx.add("grad/" + name, g)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--out_dir",
                        default=os.path.join(here, "..", "tests", "data"))
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    metadata = {"generator": "scripts/gen_oracle.py",
                "torch": torch.__version__.split("+")[0]}

    ops = Fixture()
    conv_cases(ops)
    pool_cases(ops)
    global_avg_pool_case(ops)
    concat_case(ops)
    batch_norm_case(ops)
    dropout_case(ops)
    l2_loss_case(ops)
    ops.write(os.path.join(args.out_dir, "oracle_ops.safetensors"), metadata)

    lenet = Fixture()
    lenet_fixture(lenet)
    lenet.write(os.path.join(args.out_dir, "oracle_lenet.safetensors"),
                dict(metadata, samples=str(SAMPLES)))
    for name in ("oracle_ops.safetensors", "oracle_lenet.safetensors"):
        path = os.path.join(args.out_dir, name)
        print("%s: %d bytes" % (os.path.normpath(path), os.path.getsize(path)))


if __name__ == "__main__":
    main()
