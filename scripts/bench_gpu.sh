#!/usr/bin/env bash
# GPU training throughput of psrt beside PyTorch training the same model on
# the same GPU, in the same run, on synthetic data. Per model:
#   gpu_train: model=M batch=B psrt_eps=X torch_eps=Y ratio=R
# and one line for push + pull through a ps task on 127.0.0.1 with the GPU
# copies included (gradients from the device before each push, parameters to
# it after each pull, through page-locked tensors):
#   pushpull: model_mb=13 shards=1 device=gpu mb_per_s=X tcp_mb_per_s=Y ...
#
# psrt's figure is build/bin/step_bench --device=gpu: a GPU worker's step
# (parameters copied to the GPU, forward, backward, gradients copied back;
# the update runs on the ps). PyTorch's (scripts/peers/torch_train.py
# --device cuda --synthetic) is forward, backward and an SGD step with the
# parameters resident on the GPU. Both are medians of --runs timed runs.
# Models: lenet (28x28x1, batch 100), inception_mini (28x28x1, batch 100),
# inception_v3 (299x299x3, 1000 classes, batch 32).
#
#   scripts/bench_gpu.sh [--models "lenet inception_mini inception_v3"] [--runs 5]
#
# PSRT_BIN_DIR=DIR takes the binaries from DIR (a GPU machine that has none
# of the build's Debian packages: carry the binaries and their libraries);
# otherwise scripts/setup.sh builds them first. PYTHON (default python3)
# must import torch with CUDA (and torchvision for inception_v3).
set -euo pipefail
cd "$(dirname "$0")/.."
models="lenet inception_mini inception_v3" runs=5
while [ $# -gt 0 ]; do
  case "$1" in
    --models) models="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    *) echo "bench_gpu.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "${PSRT_BIN_DIR:-}" ]; then
  scripts/setup.sh >/dev/null
fi
bin="${PSRT_BIN_DIR:-build/bin}"
python="${PYTHON:-python3}"
"$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || {
  echo "bench_gpu: $python has no torch with a visible CUDA GPU (the peer)" >&2
  exit 1
}

for model in $models; do
  case "$model" in
    inception_v3) shape=(299 3 1000) batch=32 steps=10 ;;
    *) shape=(28 1 10) batch=100 steps=50 ;;
  esac
  psrt_eps=$("$bin/step_bench" --device=gpu --model="$model" --batch_size="$batch" \
               --input_size="${shape[0]}" --input_channels="${shape[1]}" \
               --num_classes="${shape[2]}" --steps="$steps" --runs="$runs" 2>/dev/null |
             sed -n 's/.*wall_eps=\([0-9.]*\).*/\1/p')
  torch_eps=$("$python" scripts/peers/torch_train.py --model "$model" --device cuda \
                --synthetic --image_size "${shape[0]}" --channels "${shape[1]}" \
                --classes "${shape[2]}" --batch_size "$batch" --steps "$steps" \
                --runs "$runs" | sed 's/.*examples_per_sec=//')
  awk -v m="$model" -v b="$batch" -v p="$psrt_eps" -v t="$torch_eps" 'BEGIN {
    printf "gpu_train: model=%s batch=%d psrt_eps=%.0f torch_eps=%.0f ratio=%.2f\n",
           m, b, p, t, p / t}'
done

work=$(mktemp -d /tmp/psrt_bench_gpu.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
"$bin/psrtctl" make_spec --ps=1 --workers=1 --out="$work/cluster.json"
"$bin/psrt_ps" --cluster_spec="$work/cluster.json" --job_name=ps --task_index=0 \
  >"$work/ps-0.log" 2>&1 &
"$bin/pushpull_bench" --cluster_spec="$work/cluster.json" --model_mb=13 --device=gpu \
  --runs="$runs" 2>"$work/bench.log" || { cat "$work/bench.log" >&2; exit 1; }
wait
