#!/usr/bin/env python3
"""PyTorch peer of psrt's training benchmark (scripts/bench_train.sh).

Trains the same model as psrt (mlp, lenet or inception_mini, with the same
layers, shapes and batch norm settings) on the same Fashion-MNIST training
images, with plain SGD, the same batch size and the same number of threads,
and prints one line:
    torch: model=M batch=B threads=T examples_per_sec=X
Examples/sec is the median of --runs timed runs of --steps steps each, after
warm-up steps. Only the training step is timed (forward, backward, update),
with batches prepared beforehand, as psrt's worker reads batches from memory.

    /usr/bin/python3 scripts/peers/torch_train.py --model lenet --threads 2
    python3 scripts/peers/torch_train.py --model inception_v3 --device cuda \
        --synthetic --image_size 299 --channels 3 --classes 1000 --batch_size 32
With --synthetic the batches are random tensors made on the device (no data
files); with --device cuda every timed run ends with torch.cuda.synchronize().
inception_v3 is torchvision's (aux_logits=False), the model psrt's
inception_v3 counts its parameters against; resnet50 is torchvision's too.
Needs torch and numpy (torchvision for inception_v3).
"""
import argparse
import gzip
import statistics
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def read_images(path, limit):
    with gzip.open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[4:8], "big")
    rows, cols = int.from_bytes(data[8:12], "big"), int.from_bytes(data[12:16], "big")
    n = min(n, limit)
    pixels = np.frombuffer(data, np.uint8, n * rows * cols, 16)
    return (pixels.astype(np.float32) / 255.0).reshape(n, 1, rows, cols)


def read_labels(path, limit):
    with gzip.open(path, "rb") as f:
        data = f.read()
    n = min(int.from_bytes(data[4:8], "big"), limit)
    return np.frombuffer(data, np.uint8, n, 8).astype(np.int64)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden1 = nn.Linear(784, 512)
        self.softmax_linear = nn.Linear(512, 10)

    def forward(self, x):
        return self.softmax_linear(F.relu(self.hidden1(x.flatten(1))))


class LeNet(nn.Module):
    """conv 5x5x32 SAME + ReLU + max pool 2 -> conv 5x5x64 SAME + ReLU +
    max pool 2 -> fc 512 + ReLU -> fc 10 (TensorFlow's MNIST network)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc1 = nn.Linear(7 * 7 * 64, 512)
        self.fc2 = nn.Linear(512, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class ConvBn(nn.Module):
    """conv (SAME, no bias) + batch norm (beta and gamma, eps 1e-3,
    momentum 0.9 as psrt's 'decay') + ReLU."""

    def __init__(self, cin, cout, k):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, padding=k // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=1e-3, momentum=0.1)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class InceptionModule(nn.Module):
    def __init__(self, cin, b1, b3r, b3, b5r, b5, pool):
        super().__init__()
        self.b0 = ConvBn(cin, b1, 1)
        self.b1 = nn.Sequential(ConvBn(cin, b3r, 1), ConvBn(b3r, b3, 3))
        self.b2 = nn.Sequential(ConvBn(cin, b5r, 1), ConvBn(b5r, b5, 5))
        self.b3 = ConvBn(cin, pool, 1)
        self.out_channels = b1 + b3 + b5 + pool

    def forward(self, x):
        pooled = F.max_pool2d(x, 3, 1, padding=1)
        return torch.cat([self.b0(x), self.b1(x), self.b2(x), self.b3(pooled)], 1)


class InceptionMini(nn.Module):
    """psrt's inception_mini (models/inception_mini.cc), layer for layer."""

    def __init__(self):
        super().__init__()
        self.stem = ConvBn(1, 32, 3)
        self.mixed_2a = InceptionModule(32, 16, 16, 24, 8, 8, 16)
        self.mixed_2b = InceptionModule(64, 32, 24, 32, 8, 16, 16)
        self.mixed_3a = InceptionModule(96, 48, 32, 48, 12, 16, 16)
        self.logits = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(self.stem(x), 3, 2, padding=1)
        x = self.mixed_2b(self.mixed_2a(x))
        x = F.max_pool2d(x, 3, 2, padding=1)
        x = self.mixed_3a(x)
        return self.logits(x.mean((2, 3)))


def InceptionV3(num_classes=1000):
    import torchvision  # Only this model needs it.
    return torchvision.models.inception_v3(weights=None, aux_logits=False,
                                           init_weights=False,
                                           num_classes=num_classes)


def Resnet50(num_classes=1000):
    import torchvision
    return torchvision.models.resnet50(weights=None, num_classes=num_classes)


# The torchvision models, built with a class count.
TORCHVISION = {"inception_v3", "resnet50"}
MODELS = {"mlp": Mlp, "lenet": LeNet, "inception_mini": InceptionMini,
          "inception_v3": InceptionV3, "resnet50": Resnet50}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=sorted(MODELS), required=True)
    parser.add_argument("--batch_size", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--synthetic", action="store_true",
                        help="random batches on the device instead of Fashion-MNIST")
    parser.add_argument("--image_size", type=int, default=28)
    parser.add_argument("--channels", type=int, default=1)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--gpu_math", choices=["fp32", "tf32"], default="tf32",
                        help="tf32: PyTorch's default for convolutions (cuDNN) "
                             "and TF32 matmuls too; fp32: neither, IEEE single "
                             "precision as psrt's --gpu_math=fp32")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tf32 = args.gpu_math == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(1)
    device = torch.device(args.device)
    total = (args.warmup + args.steps) * args.batch_size
    if args.synthetic:
        images = torch.rand(total, args.channels, args.image_size, args.image_size,
                            device=device)
        labels = torch.randint(0, args.classes, (total,), device=device)
    else:
        images = torch.from_numpy(read_images(f"{args.data_dir}/train-images-idx3-ubyte.gz",
                                              total)).to(device)
        labels = torch.from_numpy(read_labels(f"{args.data_dir}/train-labels-idx1-ubyte.gz",
                                              total)).to(device)
    batches = [(images[i:i + args.batch_size], labels[i:i + args.batch_size])
               for i in range(0, len(images), args.batch_size)]
    model = (MODELS[args.model](args.classes) if args.model in TORCHVISION
             else MODELS[args.model]()).to(device)
    model.train()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(x, y):
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    rates = []
    for _ in range(args.runs):
        for x, y in batches[:args.warmup]:
            step(x, y)
        sync()
        start = time.perf_counter()
        for x, y in batches[args.warmup:]:
            step(x, y)
        sync()
        rates.append(args.steps * args.batch_size / (time.perf_counter() - start))
    print(f"torch: model={args.model} batch={args.batch_size} threads={args.threads} "
          f"device={args.device} gpu_math={args.gpu_math} torch={torch.__version__} "
          f"cudnn={torch.backends.cudnn.version()} "
          f"examples_per_sec={statistics.median(rates):.1f}")


if __name__ == "__main__":
    main()
