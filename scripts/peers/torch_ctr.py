#!/usr/bin/env python3
"""PyTorch peer of psrt's CTR benchmark (scripts/bench_ctr.sh).

Trains the model psrt's --model=dlrm or --model=wide_deep trains
(models/ctr_models.h), single process, on the same Criteo-format files, and
prints one line:
    torch_ctr: model=M threads=T batch=B samples_per_sec=X test_auc=A test_logloss=L train_seconds=S torch=VERSION

    python3 scripts/peers/torch_ctr.py --model dlrm --train_data train.tsv \
        --test_data test.tsv --threads 2 --batch_size 256 --epochs 1

Input (worker/input/criteo_reader.h): `label \\t I1..I13 \\t C1..C26`, plain
or gzip (told apart by the first bytes); a count becomes log(1 + x), 0 when
missing or negative; a category is keyed by its field, and a missing one has
an id of its own per field. psrt's tables have no vocabulary and no
collisions, so neither does this: every distinct (field, value) of the
training and test files gets its own row, numbered while the files are read
(a test id never seen in training keeps its initial row, as psrt's table
makes one on first lookup). The files are read whole into arrays before
training; reading is not timed.

The models, as ctr_models.h defines them (one table per psrt table, over all
fields, each an nn.EmbeddingBag(mode="sum", sparse=True) with one id per bag):
  dlrm:      x = bottom MLP(dense) (bottom_mlp, then embedding_dim, all ReLU);
             z = the strictly lower triangle of the Gram matrix of
             [x, row of C1, ..., row of C26], row-major ((1,0), (2,0), (2,1), ...);
             logit = top MLP(concat(x, z)) (top_mlp with ReLU, then 1 linear).
  wide_deep: logit = sum of the fields' rows of table "wide" (dim 1)
             + dense . wide/dense_weights + wide/bias
             + deep MLP(concat(dense, the fields' rows of table "deep"))
             (hidden_units with ReLU, then 1 linear).
Initial values: with --init_from (as scripts/bench_ctr.sh runs it), psrt's
very own: the dense variables of psrt's step-0 checkpoint, exported
(scripts/export_checkpoint.sh), and every table row as psrt's table makes it
(ps/embedding_table.cc's InitRow from the table's seed and the id,
re-computed here in numpy; --eval_initial prints the test AUC and logloss
before training, to compare with psrt's step-0 "final:" line). Without it,
drawn by torch from the same distributions as psrt's: layer weights
truncated normal (cut at 2 sigma)
whose actual standard deviation is sqrt(2 / fan_in) before a ReLU and
sqrt(1 / fan_in) otherwise (wide/dense_weights: sqrt(1 / 13)), biases 0;
table rows normal of stddev 1 / sqrt(dim) truncated at 2 stddev
(ps/embedding_table.h; its actual standard deviation is about 0.88 of that),
except the wide table's, which start at zero.

Training: batches in file order (psrt's reader's order; one worker reads
every line), the mean sigmoid cross-entropy, Adagrad on the dense variables
(--learning_rate) and on the rows (--sparse_learning_rate, lazy: only the
rows a batch touches change, as psrt's row-wise Adagrad).

samples_per_sec is measured as scripts/lib/step_log.sh reads psrt's worker:
the median of the rates of the intervals of --log_every_steps steps after
the first (whose first steps allocate); with fewer than two intervals, all
steps over their time. train_seconds is the whole training loop's time.
test_auc ranks the float32 click probabilities, ties counting half; test_logloss
clamps them to [1e-7, 1 - 1e-7] (common/binary_classification.h).

Needs torch and numpy (scripts/peer_venv.sh).
"""
import argparse
import array
import gzip
import io
import math
import json
import statistics
import struct
import sys
import time

import numpy as np

DENSE = 13
FIELDS = 26
# Appended to a category's hex digits, so that equal values of two fields
# stay apart (psrt's id is (field << 33) | value).
FIELD_TAGS = [":%d" % f for f in range(FIELDS)]


def open_text(path):
    with open(path, "rb") as f:
        magic = f.read(2)
    raw = gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")
    return io.TextIOWrapper(raw, encoding="latin-1", newline="\n")


def read_criteo(paths, ids):
    """Reads every line of `paths`, in order, into (dense [n, 13] float32,
    rows [n, 26] int64, labels [n] float32); a category's row number comes
    from `ids` (key: lowercase hex digits + field tag), new ones numbered in
    order of appearance."""
    labels = bytearray()
    counts = array.array("q")
    rows = array.array("q")
    setdefault = ids.setdefault
    for path in paths:
        with open_text(path) as f:
            for number, line in enumerate(f, 1):
                p = line.rstrip("\r\n").lower().split("\t")
                if len(p) != 1 + DENSE + FIELDS or (p[0] != "0" and p[0] != "1"):
                    sys.exit(f"torch_ctr: {path}:{number}: want label (0 or 1), I1..I13, "
                             f"C1..C26 tab-separated, got {len(p)} fields")
                labels.append(p[0] == "1")
                try:
                    counts.extend([int(x) if x else 0 for x in p[1:1 + DENSE]])
                except ValueError:
                    sys.exit(f"torch_ctr: {path}:{number}: a count is not an integer")
                # len(ids) is taken before setdefault inserts: a new key gets
                # the next row number.
                rows.extend([setdefault(v + t, len(ids))
                             for v, t in zip(p[1 + DENSE:], FIELD_TAGS)])
    n = len(labels)
    c = np.frombuffer(counts, dtype=np.int64).reshape(n, DENSE)
    dense = np.log1p(np.maximum(c, 0).astype(np.float32))
    return (dense, np.frombuffer(rows, dtype=np.int64).reshape(n, FIELDS).copy(),
            np.frombuffer(bytes(labels), dtype=np.uint8).astype(np.float32))


def roc_auc(scores, labels):
    """P(a random positive scores above a random negative), ties counting
    half, by average ranks; 0.5 when a class is absent. NaN ranks lowest."""
    s = np.asarray(scores, dtype=np.float64).copy()
    s[np.isnan(s)] = -np.inf
    y = np.asarray(labels) > 0.5
    n, pos = len(s), int(y.sum())
    neg = n - pos
    if pos == 0 or neg == 0:
        return 0.5
    order = np.argsort(s, kind="mergesort")
    ss = s[order]
    first = np.r_[True, ss[1:] != ss[:-1]]  # Starts of runs of equal scores.
    starts = np.flatnonzero(first)
    ends = np.r_[starts[1:], n]
    average_rank = (starts + ends + 1) / 2.0  # 1-based ranks start+1 .. end.
    ranks = average_rank[np.cumsum(first) - 1]
    return float((ranks[y[order]].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def log_loss(probabilities, labels):
    p = np.clip(np.asarray(probabilities, dtype=np.float64), 1e-7, 1 - 1e-7)
    y = np.asarray(labels) > 0.5
    return float(-np.mean(np.where(y, np.log(p), np.log1p(-p)))) if len(p) else 0.0


def units(text):
    return [int(u) for u in text.split(",") if u.strip()]


MASK64 = (1 << 64) - 1


def splitmix64(x):
    """common/splitmix.h's SplitMix64 on a numpy uint64 array (wrapping)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def psrt_ids(ids):
    """psrt's 64-bit id of each key of `ids` (worker/input/criteo_reader.h's
    CriteoId: field << 33 | the 8 hex digits' value, or 1 << 32 when
    missing), in row-number order."""
    out = np.zeros(len(ids), dtype=np.uint64)
    for key, row in ids.items():
        value, field = key.rsplit(":", 1)
        v = int(value, 16) if value else 1 << 32
        out[row] = (int(field) << 33) | v
    return out


def psrt_initial_rows(table_seed, ids, dim):
    """ps/embedding_table.cc's InitRow for every id: a normal of stddev
    1/sqrt(dim), redrawn beyond 2 stddev, from (table seed, id, column)."""
    with np.errstate(over="ignore"):
        base = splitmix64(np.uint64(table_seed) ^ splitmix64(ids))
        h = splitmix64(base[:, None] + np.arange(dim, dtype=np.uint64)[None, :])
        z = np.zeros(h.shape)
        todo = np.ones(h.shape, dtype=bool)
        while todo.any():
            h[todo] = splitmix64(h[todo])
            u1 = ((h[todo] >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53
            h[todo] = splitmix64(h[todo])
            u2 = ((h[todo] >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53
            draw = np.sqrt(-2 * np.log(u1)) * np.cos(2 * math.pi * u2)
            z[todo] = draw
            todo[todo] = np.abs(draw) > 2
    return (z * (1 / math.sqrt(dim))).astype(np.float32)


def read_safetensors(path):
    """The float32 tensors of a safetensors file, by name."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__" or t["dtype"] != "F32":
            continue
        b, e = t["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype=np.float32).reshape(t["shape"])
    return out


def load_psrt_init(model, args, ids):
    """Gives `model` psrt's initial values: the dense variables of the
    safetensors file --init_from (scripts/export_checkpoint.sh of psrt's
    step-0 checkpoint), and every table row as psrt's table makes it (table
    t's seed: SplitMix64(--seed + t), worker/worker_task.cc)."""
    import torch
    saved = read_safetensors(args.init_from)
    params = dict(model.named_parameters())
    loaded = set()
    with torch.no_grad():
        for name, value in saved.items():
            parts = name.split("/")
            if len(parts) == 3 and parts[1].startswith("layer"):  # mlp/layerI/weights|biases
                layer = f"{parts[0]}.layers.{parts[1][5:]}"
                target, value = ((layer + ".weight", value.T) if parts[2] == "weights"
                                 else (layer + ".bias", value))
            elif name in ("wide/dense_weights", "wide/bias"):
                target = "dense_weights" if name.endswith("weights") else "bias"
            else:
                continue
            if target not in params or tuple(params[target].shape) != value.shape:
                sys.exit(f"torch_ctr: --init_from {args.init_from}: {name} {value.shape} "
                         f"fits no parameter of the {args.model} model")
            params[target].copy_(torch.from_numpy(np.ascontiguousarray(value)))
            loaded.add(target)
        bags = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.EmbeddingBag)]
        missing = set(params) - loaded - {n + ".weight" for n, _ in bags}
        if missing:
            sys.exit(f"torch_ctr: --init_from {args.init_from} lacks {sorted(missing)}")
        keys = psrt_ids(ids)
        # The tables in psrt's order (models/ctr_models.cc): dlrm's
        # "embeddings"; wide_deep's "wide" (zeros) then "deep".
        order = ["embeddings"] if args.model == "dlrm" else ["wide", "deep"]
        for t, table in enumerate(order):
            bag = dict(bags)[table]
            if table == "wide":
                bag.weight.zero_()
                continue
            seed = int(splitmix64(np.array([(args.seed + t) & MASK64], dtype=np.uint64))[0])
            bag.weight.copy_(torch.from_numpy(psrt_initial_rows(seed, keys, bag.weight.shape[1])))


def build_model(args, num_rows):
    import torch
    import torch.nn as nn

    def truncated_normal_(t, stddev):  # TensorFlow's: cut at 2 stddev.
        nn.init.trunc_normal_(t, 0.0, stddev, -2 * stddev, 2 * stddev)

    # The standard deviation of a normal cut at 2 sigma, in sigmas
    # (models/initializers.h): psrt's layer stddevs are the actual ones.
    cut_normal_stddev = 0.87962566103423978

    class Mlp(nn.Module):
        """models/dense_mlp.h: y = x W + b per layer, ReLU after every layer
        but (unless relu_last) the last."""

        def __init__(self, fan_in, layer_units, relu_last):
            super().__init__()
            self.layers = nn.ModuleList()
            self.relus = []
            for i, out in enumerate(layer_units):
                layer = nn.Linear(fan_in, out)
                relu = relu_last or i + 1 < len(layer_units)
                actual = math.sqrt((2.0 if relu else 1.0) / fan_in)
                with torch.no_grad():
                    truncated_normal_(layer.weight, actual / cut_normal_stddev)
                    layer.bias.zero_()
                self.layers.append(layer)
                self.relus.append(relu)
                fan_in = out

        def forward(self, x):
            for layer, relu in zip(self.layers, self.relus):
                x = layer(x)
                if relu:
                    x = torch.relu(x)
            return x

    def table(dim, zero_rows=False):
        bag = nn.EmbeddingBag(num_rows, dim, mode="sum", sparse=True)
        with torch.no_grad():
            if zero_rows:  # psrt's zero_rows tables: a linear model's per-id weights.
                bag.weight.zero_()
            else:
                truncated_normal_(bag.weight, 1.0 / math.sqrt(dim))
        return bag

    dim = args.embedding_dim

    class Dlrm(nn.Module):
        def __init__(self):
            super().__init__()
            self.embeddings = table(dim)
            self.bottom_mlp = Mlp(DENSE, units(args.bottom_mlp) + [dim], relu_last=True)
            vectors = FIELDS + 1
            self.top_mlp = Mlp(dim + vectors * (vectors - 1) // 2, units(args.top_mlp) + [1],
                               relu_last=False)
            li, lj = torch.tril_indices(vectors, vectors, offset=-1)  # (1,0), (2,0), (2,1), ...
            self.register_buffer("li", li, persistent=False)
            self.register_buffer("lj", lj, persistent=False)

        def forward(self, dense, rows):
            batch = dense.shape[0]
            x = self.bottom_mlp(dense)
            e = self.embeddings(rows.reshape(-1, 1)).view(batch, FIELDS, dim)
            t = torch.cat([x.unsqueeze(1), e], dim=1)
            gram = torch.bmm(t, t.transpose(1, 2))
            z = gram[:, self.li, self.lj]
            return self.top_mlp(torch.cat([x, z], dim=1)).squeeze(1)

    class WideDeep(nn.Module):
        def __init__(self):
            super().__init__()
            self.wide = table(1, zero_rows=True)
            self.deep = table(dim)
            self.dense_weights = nn.Parameter(torch.empty(DENSE, 1))
            with torch.no_grad():
                truncated_normal_(self.dense_weights,
                                  math.sqrt(1.0 / DENSE) / cut_normal_stddev)
            self.bias = nn.Parameter(torch.zeros(1))
            self.deep_mlp = Mlp(DENSE + FIELDS * dim, units(args.hidden_units) + [1],
                                relu_last=False)

        def forward(self, dense, rows):
            batch = dense.shape[0]
            wide = self.wide(rows).squeeze(1) + (dense @ self.dense_weights).squeeze(1) + self.bias
            e = self.deep(rows.reshape(-1, 1)).view(batch, FIELDS * dim)
            return wide + self.deep_mlp(torch.cat([dense, e], dim=1)).squeeze(1)

    return Dlrm() if args.model == "dlrm" else WideDeep()


def predict(model, test, eval_batch_size):
    """The click probabilities of the test rows (float32)."""
    import torch
    model.eval()
    probabilities = []
    with torch.no_grad():
        dense_t, rows_t = torch.from_numpy(test[0]), torch.from_numpy(test[1])
        for lo in range(0, len(test[2]), eval_batch_size):
            hi = lo + eval_batch_size
            probabilities.append(torch.sigmoid(model(dense_t[lo:hi], rows_t[lo:hi])).numpy())
    model.train()
    return np.concatenate(probabilities).astype(np.float32)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["dlrm", "wide_deep"], required=True)
    parser.add_argument("--train_data", required=True, help="Criteo files, comma-separated")
    parser.add_argument("--test_data", required=True, help="Criteo files, comma-separated")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--embedding_dim", type=int, default=16)
    parser.add_argument("--bottom_mlp", default="64", help="DLRM's bottom MLP's hidden units")
    parser.add_argument("--top_mlp", default="64,32", help="DLRM's top MLP's hidden units")
    parser.add_argument("--hidden_units", default="256,128", help="Wide & Deep's deep MLP")
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=1,
                        help="passes over the training file (floor(rows / batch) steps each)")
    parser.add_argument("--steps", type=int, default=0, help="steps instead of --epochs")
    parser.add_argument("--learning_rate", type=float, default=0.05)
    parser.add_argument("--sparse_learning_rate", type=float, default=0.05)
    parser.add_argument("--log_every_steps", type=int, default=100,
                        help="steps per throughput interval")
    parser.add_argument("--eval_batch_size", type=int, default=16384)
    parser.add_argument("--seed", type=int, default=1,
                        help="torch's seed; with --init_from, psrt's --seed (its tables' seeds)")
    parser.add_argument("--init_from", default="",
                        help="start from psrt's initial values: the export of its step-0 "
                             "checkpoint (dense) and its tables' row initializer")
    parser.add_argument("--eval_initial", action="store_true",
                        help="print the test AUC and logloss before training too")
    parser.add_argument("--verbose", action="store_true", help="interval lines on stderr")
    args = parser.parse_args()
    if args.batch_size < 1 or args.log_every_steps < 1:
        sys.exit("torch_ctr: --batch_size and --log_every_steps must be positive")

    started = time.perf_counter()
    ids = {}
    train = read_criteo(args.train_data.split(","), ids)
    test = read_criteo(args.test_data.split(","), ids)
    n = len(train[2])
    steps = args.steps or args.epochs * (n // args.batch_size)
    if steps < 1:
        sys.exit(f"torch_ctr: {n} training rows make no step of batch {args.batch_size}")
    print(f"torch_ctr: read {n} train and {len(test[2])} test rows, {len(ids)} ids, "
          f"in {time.perf_counter() - started:.1f} s; {steps} steps", file=sys.stderr)

    import torch
    import torch.nn.functional as F
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = build_model(args, len(ids))
    if args.init_from:
        load_psrt_init(model, args, ids)
    if args.eval_initial:
        p = predict(model, test, args.eval_batch_size)
        print(f"torch_ctr: initial test_auc={roc_auc(p, test[2]):.4f} "
              f"test_logloss={log_loss(p, test[2]):.4f}")
    sparse = [m.weight for m in model.modules() if isinstance(m, torch.nn.EmbeddingBag)]
    sparse_ids = {id(p) for p in sparse}
    dense_params = [p for p in model.parameters() if id(p) not in sparse_ids]
    # psrt's Adagrad (ps/optimizer.h, kernels/optimizer_functors.h, TensorFlow's
    # ApplyAdagrad): accum starts at 0.1; accum += g^2; var -= lr * g / sqrt(accum),
    # with no epsilon. torch's is var -= lr * g / (sqrt(accum) + eps): eps=0 makes
    # it the same rule (accum >= 0.1, so no division by 0). Its sparse path
    # (coalesced gradient rows, only those rows' accumulators and values
    # change) is psrt's lazy row-wise update. Where they still differ: psrt
    # rounds its float updates in another order, and in sync mode with W workers
    # applies the average of W batches' gradients per step (dense and rows alike)
    # where this applies each batch's.
    dense_opt = torch.optim.Adagrad(dense_params, lr=args.learning_rate,
                                    initial_accumulator_value=0.1, eps=0.0)
    sparse_opt = torch.optim.Adagrad(sparse, lr=args.sparse_learning_rate,
                                     initial_accumulator_value=0.1, eps=0.0)

    dense_x, rows_x, labels_x = (torch.from_numpy(a) for a in train)
    batch = args.batch_size
    rates = []
    model.train()
    start = interval_start = time.perf_counter()
    interval_loss = 0.0
    for step in range(steps):
        lo = (step * batch) % n
        if lo + batch <= n:
            d, r, y = dense_x[lo:lo + batch], rows_x[lo:lo + batch], labels_x[lo:lo + batch]
        else:  # Past the end: on from the first line, as psrt's reader rewinds.
            idx = torch.arange(lo, lo + batch) % n
            d, r, y = dense_x[idx], rows_x[idx], labels_x[idx]
        loss = F.binary_cross_entropy_with_logits(model(d, r), y)
        dense_opt.zero_grad(set_to_none=True)
        sparse_opt.zero_grad(set_to_none=True)
        loss.backward()
        dense_opt.step()
        sparse_opt.step()
        if args.verbose:
            interval_loss += loss.item()
        if (step + 1) % args.log_every_steps == 0:
            now = time.perf_counter()
            rates.append(args.log_every_steps * batch / (now - interval_start))
            if args.verbose:
                print(f"torch_ctr: step {step + 1}, loss = "
                      f"{interval_loss / args.log_every_steps:.4f} ({rates[-1]:.1f} samples/sec)",
                      file=sys.stderr)
            interval_start, interval_loss = now, 0.0
    train_seconds = time.perf_counter() - start
    if len(rates) >= 2:
        samples_per_sec = statistics.median(rates[1:])
    else:
        samples_per_sec = steps * batch / train_seconds

    p = predict(model, test, args.eval_batch_size)
    print(f"torch_ctr: model={args.model} threads={args.threads} batch={batch} "
          f"samples_per_sec={samples_per_sec:.1f} test_auc={roc_auc(p, test[2]):.4f} "
          f"test_logloss={log_loss(p, test[2]):.4f} train_seconds={train_seconds:.2f} "
          f"torch={torch.__version__}")


if __name__ == "__main__":
    main()
