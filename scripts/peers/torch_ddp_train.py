#!/usr/bin/env python3
"""PyTorch DistributedDataParallel peer of psrt's allreduce mode
(scripts/bench_allreduce.sh): --workers processes on 127.0.0.1, gloo
backend, each training the model of scripts/peers/torch_train.py on its own
Fashion-MNIST batches with plain SGD and --threads threads; DDP averages the
gradients (bucketed allreduce, overlapped with the backward pass). Prints
    ddp: model=M workers=W batch=B threads=T examples_per_sec=X
where X counts every worker's examples (the job's throughput), the median of
--runs timed runs of --steps steps after --warmup steps.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_train import MODELS, read_images, read_labels  # noqa: E402


def run(rank, args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                            rank=rank, world_size=args.workers)
    per_worker = (args.warmup + args.steps) * args.batch_size
    total = per_worker * args.workers
    images = torch.from_numpy(read_images(f"{args.data_dir}/train-images-idx3-ubyte.gz", total))
    labels = torch.from_numpy(read_labels(f"{args.data_dir}/train-labels-idx1-ubyte.gz", total))
    images, labels = images[rank::args.workers], labels[rank::args.workers]
    batches = [(images[i:i + args.batch_size], labels[i:i + args.batch_size])
               for i in range(0, per_worker, args.batch_size)]
    model = torch.nn.parallel.DistributedDataParallel(MODELS[args.model]())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(x, y):
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    rates = []
    for _ in range(args.runs):
        for x, y in batches[:args.warmup]:
            step(x, y)
        dist.barrier()
        start = time.perf_counter()
        for x, y in batches[args.warmup:]:
            step(x, y)
        dist.barrier()
        rates.append(args.steps * args.batch_size * args.workers / (time.perf_counter() - start))
    if rank == 0:
        print(f"ddp: model={args.model} workers={args.workers} batch={args.batch_size} "
              f"threads={args.threads} examples_per_sec={statistics.median(rates):.1f}",
              flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["mlp", "lenet", "inception_mini"], default="lenet")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--port", type=int, default=29660)
    parser.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    args = parser.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(run, args=(args,), nprocs=args.workers)


if __name__ == "__main__":
    main()
