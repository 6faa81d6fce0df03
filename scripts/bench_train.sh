#!/usr/bin/env bash
# Training throughput of one psrt worker (with 1 ps task, on 127.0.0.1)
# beside PyTorch training the same model with the same batch, threads and
# data, measured in the same run (scripts/peers/torch_train.py). Per model:
#   train: model=M psrt_eps=X torch_eps=Y ratio=R
# psrt's examples/sec is the median of the worker's progress intervals (the
# first one, with start-up, excluded); it includes pushing gradients to and
# pulling parameters from the ps task every step, which PyTorch does not do.
#
# The peer is current PyTorch from PyPI (with torchvision), installed once
# into a virtual environment outside the repository (scripts/peer_venv.sh).
#
# mlp, lenet and inception_mini train on Fashion-MNIST; inception_v3 on
# synthetic 299x299x3 images (psrt's --synthetic_data, the peer's
# --synthetic) at batch 32, as tf_cnn_benchmarks times it, torchvision's
# inception_v3 (aux_logits=False) against psrt's, both with 10 classes;
# resnet50 likewise on 224x224x3 (torchvision's resnet50 against psrt's).
#
#   scripts/bench_train.sh [--models "mlp lenet inception_mini inception_v3 resnet50"]
#                          [--threads 2] [--batch_size 100]
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
. scripts/peer_venv.sh
work=$(mktemp -d /tmp/psrt_bench_train.XXXXXX)
trap 'rm -rf "$work"' EXIT
scripts/make_cluster_spec.sh --ps 1 --workers 1 --out "$work/cluster.json"
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
for model in $models; do
  model_batch=$batch psrt_data="" peer_data=""
  case "$model" in
    mlp) steps=1500 ;;
    lenet) steps=300 ;;
    inception_v3)
      steps=24 model_batch=32
      psrt_data="--synthetic_data --input_height=299 --input_width=299 --input_channels=3"
      peer_data="--synthetic --image_size 299 --channels 3 --steps 6 --warmup 2"
      ;;
    resnet50)
      steps=12 model_batch=32
      psrt_data="--synthetic_data --input_height=224 --input_width=224 --input_channels=3"
      peer_data="--synthetic --image_size 224 --channels 3 --steps 4 --warmup 1"
      ;;
    *) steps=150 ;;
  esac
  every=$((steps / 6))
  scripts/launch.sh --cluster_spec "$work/cluster.json" --logdir "$work/$model" -- \
    --model="$model" --batch_size="$model_batch" --intra_op_threads="$threads" \
    --train_steps="$steps" --log_every_steps="$every" --progress=log \
    --learning_rate=0.01 $psrt_data >/dev/null
  psrt_eps=$(grep -o '([0-9.]* examples/sec' "$work/$model/worker-0.log" | tr -d '(' |
             awk 'NR > 1 {print $1}' | median)
  torch_eps=$("$venv/bin/python" scripts/peers/torch_train.py --model "$model" \
                --batch_size "$model_batch" --threads "$threads" $peer_data |
              sed 's/.*examples_per_sec=//')
  awk -v m="$model" -v p="$psrt_eps" -v t="$torch_eps" \
    'BEGIN {printf "train: model=%s psrt_eps=%.1f torch_eps=%.1f ratio=%.2f\n", m, p, t, p / t}'
done
