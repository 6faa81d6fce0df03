"""Allreduce bandwidth of PyTorch's torch.distributed gloo backend: the peer
of bench/allreduce_bench.cc, run by scripts/bench_allreduce.sh.

Spawns --workers processes on 127.0.0.1; for each size they time --rounds
all_reduce(SUM) calls on a float32 tensor of that many MB, --runs times, and
rank 0 prints the median like allreduce_bench:
  gloo: mb=S workers=W busbw_mb_per_s=X algbw_mb_per_s=Y
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, args):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                            rank=rank, world_size=args.workers)
    for mb in args.sizes_mb.split(","):
        mb = float(mb)
        data = torch.ones(int(mb * 1e6 / 4), dtype=torch.float32)
        dist.all_reduce(data)  # Warm-up, and a barrier.
        seconds = []
        for _ in range(args.runs):
            start = time.perf_counter()
            for _ in range(args.rounds):
                dist.all_reduce(data)
            seconds.append((time.perf_counter() - start) / args.rounds)
        if rank == 0:
            algbw = data.numel() * 4 / statistics.median(seconds) / 1e6
            busbw = algbw * 2 * (args.workers - 1) / args.workers
            print(f"gloo: mb={mb:g} workers={args.workers} busbw_mb_per_s={busbw:.0f} "
                  f"algbw_mb_per_s={algbw:.0f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--port", type=int, default=29650)
    parser.add_argument("--sizes_mb", default="1,13,100")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(run, args=(args,), nprocs=args.workers)


if __name__ == "__main__":
    main()
