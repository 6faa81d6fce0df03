#!/usr/bin/env bash
# Training throughput of one psrt worker (with 1 ps task, on 127.0.0.1)
# beside PyTorch training the same model with the same batch, threads and
# data, measured in the same run (scripts/peers/torch_train.py). Per model:
#   train: model=M psrt_eps=X torch_eps=Y ratio=R
# psrt's examples/sec is the median of the worker's progress intervals (the
# first one, with start-up, excluded); it includes pushing gradients to and
# pulling parameters from the ps task every step, which PyTorch does not do.
#
#   scripts/bench_train.sh [--models "mlp lenet inception_mini"] [--threads 2]
#                          [--batch_size 100]
set -euo pipefail
cd "$(dirname "$0")/.."
models="mlp lenet inception_mini" threads=2 batch=100
while [ $# -gt 0 ]; do
  case "$1" in
    --models) models="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --batch_size) batch="$2"; shift 2 ;;
    *) echo "bench_train.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
scripts/setup.sh >/dev/null
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "bench_train: installing Debian's python3-torch (the peer)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q python3-torch
fi
work=$(mktemp -d /tmp/psrt_bench_train.XXXXXX)
trap 'rm -rf "$work"' EXIT
scripts/make_cluster_spec.sh --ps 1 --workers 1 --out "$work/cluster.json"
for model in $models; do
  case "$model" in
    mlp) steps=1500 ;;
    lenet) steps=300 ;;
    *) steps=150 ;;
  esac
  every=$((steps / 6))
  scripts/launch.sh --cluster_spec "$work/cluster.json" --logdir "$work/$model" -- \
    --model="$model" --batch_size="$batch" --intra_op_threads="$threads" \
    --train_steps="$steps" --log_every_steps="$every" --progress=log \
    --learning_rate=0.01 >/dev/null
  psrt_eps=$(grep -o '([0-9.]* examples/sec' "$work/$model/worker-0.log" | tr -d '(' |
             awk 'NR > 1 {print $1}' | sort -g |
             awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}')
  torch_eps=$(/usr/bin/python3 scripts/peers/torch_train.py --model "$model" \
                --batch_size "$batch" --threads "$threads" | sed 's/.*examples_per_sec=//')
  awk -v m="$model" -v p="$psrt_eps" -v t="$torch_eps" \
    'BEGIN {printf "train: model=%s psrt_eps=%.0f torch_eps=%.0f ratio=%.2f\n", m, p, t, p / t}'
done
