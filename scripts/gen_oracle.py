#!/usr/bin/env python3
"""Writes the PyTorch oracle fixtures of psrt's kernel and model tests.

    /usr/bin/python3 scripts/gen_oracle.py [--out_dir tests/data]

Runs PyTorch on the CPU, in float64, on fixed inputs and writes what the
C++ tests compare against (tests/kernels/oracle_test.cc,
tests/models/lenet_oracle_test.cc, tests/models/ctr_oracle_test.cc), so the
C++ suite never needs Python:

  tests/data/oracle_ops.safetensors    every op: inputs, upstream gradient,
                                       outputs and input gradients
  tests/data/oracle_lenet.safetensors  LeNet's loss and parameter gradients
                                       on a fixed batch
  tests/data/oracle_ctr.safetensors    Wide & Deep's and DLRM's loss,
                                       probabilities, dense gradients and
                                       embedding row gradients on a fixed
                                       batch with repeated ids

`--only ctr` (or ops, lenet) writes one file and leaves the others alone.

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


# The CTR models (models/ctr_models.h), written again from their
# description. One batch for both models: CTR_BATCH examples of
# CTR_DENSE dense features in [0, 2) (hash seed 1500) and CTR_FIELDS ids
# each, id = 10 * field + floor(hashed(1501, ..., 0, 3)), then example 3's
# field 1 set to example 0's (an id shared by two examples) and example 2's
# field 3 to its own field 0 (an id twice in one example). The ids are
# deduplicated in first-seen order, as kernels::Deduplicate; table t's rows
# [unique, dim] are hashed(base + 100 + t, ..., -0.5, 0.5). Variable v (in
# psrt's order) is hashed(base + v, ..., -s, s), s 0.5 for a weight matrix
# (rank 2) and 0.2 for a vector; base 2000 for wide_deep, 3200 for dlrm
# (3000 put a ReLU input within 1e-4 of 0).
CTR_BATCH, CTR_DENSE, CTR_FIELDS, CTR_DIM = 5, 3, 4, 4
CTR_LABELS = [1, 0, 0, 1, 1]
WIDE_DEEP_HIDDEN = [5]
DLRM_BOTTOM, DLRM_TOP = [5], [6]


def ctr_batch():
    dense = hashed(1500, (CTR_BATCH, CTR_DENSE), 0.0, 2.0)
    ids = np.floor(hashed(1501, (CTR_BATCH, CTR_FIELDS), 0.0, 3.0))
    ids += 10 * np.arange(CTR_FIELDS)
    ids[3, 1] = ids[0, 1]
    ids[2, 3] = ids[2, 0]
    ids = ids.astype(np.int64).reshape(-1)
    unique, index = [], []
    for i in ids:
        if i not in unique:
            unique.append(i)
        index.append(unique.index(i))
    return dense, ids, unique, torch.tensor(index)


def mlp_layers(prefix, fan_in, units):
    """[(name, shape)] of an MLP's variables, as models/dense_mlp.h."""
    out = []
    for l, u in enumerate(units):
        out += [("%s/layer%d/weights" % (prefix, l), (fan_in, u)),
                ("%s/layer%d/biases" % (prefix, l), (u,))]
        fan_in = u
    return out


def mlp(x, params, relu_last, kinks):
    """Fully connected layers over (weights, biases) pairs; ReLU after each
    but the last unless relu_last. Appends every pre-activation that goes
    into a ReLU to `kinks` (the caller checks none sits at 0)."""
    n = len(params) // 2
    for l in range(n):
        x = x @ params[2 * l] + params[2 * l + 1]
        if relu_last or l + 1 < n:
            kinks.append(x)
            x = torch.relu(x)
    return x


def wide_deep(dense, index, rows, params, kinks):
    wide_rows, deep_rows = rows
    dense_weights, bias = params[0], params[1]
    ids = index.reshape(CTR_BATCH, CTR_FIELDS)
    # Each example's wide rows summed: a bag per example.
    wide = F.embedding_bag(ids, wide_rows, mode="sum") + dense @ dense_weights + bias
    embedded = F.embedding(ids, deep_rows).reshape(CTR_BATCH, -1)
    deep = mlp(torch.cat([dense, embedded], dim=1), params[2:], False, kinks)
    return (wide + deep).reshape(-1)


def dlrm(dense, index, rows, params, kinks):
    (table,) = rows
    n_bottom = 2 * (len(DLRM_BOTTOM) + 1)
    x = mlp(dense, params[:n_bottom], True, kinks)
    ids = index.reshape(CTR_BATCH, CTR_FIELDS)
    vectors = torch.cat([x.unsqueeze(1), F.embedding(ids, table)], dim=1)
    gram = vectors @ vectors.transpose(1, 2)
    # The strictly lower triangle, row-major: (1,0), (2,0), (2,1), ...
    i, j = torch.tril_indices(CTR_FIELDS + 1, CTR_FIELDS + 1, offset=-1)
    z = gram[:, i, j]
    return mlp(torch.cat([x, z], dim=1), params[n_bottom:], False, kinks).reshape(-1)


CTR_MODELS = [
    # name, hash base, variables, tables (name, dim), logits function
    ("wide_deep", 2000,
     [("wide/dense_weights", (CTR_DENSE, 1)), ("wide/bias", (1,))]
     + mlp_layers("deep_mlp", CTR_DENSE + CTR_FIELDS * CTR_DIM, WIDE_DEEP_HIDDEN + [1]),
     [("wide", 1), ("deep", CTR_DIM)], wide_deep),
    ("dlrm", 3200,
     mlp_layers("bottom_mlp", CTR_DENSE, DLRM_BOTTOM + [CTR_DIM])
     + mlp_layers("top_mlp", CTR_DIM + (CTR_FIELDS + 1) * CTR_FIELDS // 2, DLRM_TOP + [1]),
     [("embeddings", CTR_DIM)], dlrm),
]


def ctr_fixture(fx):
    dense_np, ids, unique, index = ctr_batch()
    dense = torch.tensor(dense_np)
    labels = torch.tensor(CTR_LABELS, dtype=torch.float64)
    fx.add("dense", dense)
    fx.add("ids", ids)
    fx.add("unique", unique)
    fx.add("labels", CTR_LABELS)
    for name, base, variables, tables, logits_of in CTR_MODELS:
        params = [leaf(hashed(base + v, shape, -0.5 if len(shape) == 2 else -0.2,
                              0.5 if len(shape) == 2 else 0.2))
                  for v, (_, shape) in enumerate(variables)]
        rows = [leaf(hashed(base + 100 + t, (len(unique), dim), -0.5, 0.5))
                for t, (_, dim) in enumerate(tables)]
        kinks = []
        logits = logits_of(dense, index, rows, params, kinks)
        # psrt computes in float32: a pre-activation this close to 0 could
        # take the other side of the ReLU there.
        closest = min(k.abs().min().item() for k in kinks)
        assert closest > 1e-3, (name, closest)
        loss = F.binary_cross_entropy_with_logits(logits, labels)
        loss.backward()
        fx.add(name + "/loss", loss)
        fx.add(name + "/probabilities", torch.sigmoid(logits))
        for (var, _), p in zip(variables, params):
            fx.add(name + "/grad/" + var, p.grad)
        for (table, _), r in zip(tables, rows):
            fx.add(name + "/rows_grad/" + table, r.grad)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--out_dir",
                        default=os.path.join(here, "..", "tests", "data"))
    parser.add_argument("--only", choices=["ops", "lenet", "ctr"],
                        help="write only this fixture")
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    metadata = {"generator": "scripts/gen_oracle.py",
                "torch": torch.__version__.split("+")[0]}

    written = []
    if args.only in (None, "ops"):
        ops = Fixture()
        conv_cases(ops)
        pool_cases(ops)
        global_avg_pool_case(ops)
        concat_case(ops)
        batch_norm_case(ops)
        dropout_case(ops)
        l2_loss_case(ops)
        written.append(("oracle_ops.safetensors", ops, metadata))
    if args.only in (None, "lenet"):
        lenet = Fixture()
        lenet_fixture(lenet)
        written.append(("oracle_lenet.safetensors", lenet,
                        dict(metadata, samples=str(SAMPLES))))
    if args.only in (None, "ctr"):
        ctr = Fixture()
        ctr_fixture(ctr)
        written.append(("oracle_ctr.safetensors", ctr, metadata))
    for name, fx, meta in written:
        path = os.path.join(args.out_dir, name)
        fx.write(path, meta)
        print("%s: %d bytes" % (os.path.normpath(path), os.path.getsize(path)))


if __name__ == "__main__":
    main()
