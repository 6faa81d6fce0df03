#!/usr/bin/env bash
# Training throughput of one psrt worker (with 1 ps task, on 127.0.0.1)
# beside a peer training the same model with the same batch, threads and
# data, measured in the same run. Per model:
#   train: model=M psrt_eps=X torch_eps=Y ratio=R
#   train: keras_file=F psrt_eps=X keras_eps=Y ratio=R
# psrt's examples/sec is the median of the worker's progress intervals (the
# first one, with start-up, excluded); it includes pushing gradients to and
# pulling parameters from the ps task every step, which the peers do not do.
#
# Built-in models (--models) run beside PyTorch (scripts/peers/torch_train.py),
# current PyTorch from PyPI with torchvision, installed once into a virtual
# environment outside the repository (scripts/peer_venv.sh).
# mlp, lenet and inception_mini train on Fashion-MNIST; inception_v3 on
# synthetic 299x299x3 images (psrt's --synthetic_data, the peer's
# --synthetic) at batch 32, as tf_cnn_benchmarks times it, torchvision's
# inception_v3 (aux_logits=False) against psrt's, both with 10 classes;
# resnet50 likewise on 224x224x3 (torchvision's resnet50 against psrt's).
#
# Keras files (--model_files, and --keras_apps: keras.applications' files
# written at --keras_size x --keras_size x 3 with 10 classes) run beside
# Keras's own model.fit of the same file on tensorflow-cpu from PyPI
# (scripts/peers/keras_train.py, scripts/keras_venv.sh): both on one reused
# batch of random images (psrt's --synthetic_data), plain SGD, --threads
# threads (TensorFlow's intra- and inter-op pools both), the batch given.
#
#   scripts/bench_train.sh [--models "mlp lenet inception_mini inception_v3 resnet50"]
#                          [--keras_apps "ResNet50 MobileNetV2"] [--keras_size 64]
#                          [--model_files "a.json b.json"]
#                          [--threads 2] [--batch_size 100]
# With --keras_apps or --model_files and no --models, only the Keras files
# run; their batch is 32 unless --batch_size says otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
models=unset threads=2 batch="" keras_apps="" keras_size=64 model_files=""
while [ $# -gt 0 ]; do
  case "$1" in
    --models) models="$2"; shift 2 ;;
    --keras_apps) keras_apps="$2"; shift 2 ;;
    --keras_size) keras_size="$2"; shift 2 ;;
    --model_files) model_files="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --batch_size) batch="$2"; shift 2 ;;
    *) echo "bench_train.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ "$models" = unset ]; then
  if [ -n "$keras_apps$model_files" ]; then models=""; else models="mlp lenet inception_mini"; fi
fi
for f in $model_files; do
  [ -f "$f" ] || { echo "bench_train.sh: --model_files: no file $f" >&2; exit 2; }
done
scripts/setup.sh >/dev/null
if [ -n "$models" ]; then . scripts/peer_venv.sh; fi
if [ -n "$keras_apps$model_files" ]; then . scripts/keras_venv.sh; fi
work=$(mktemp -d /tmp/psrt_bench_train.XXXXXX)
trap 'rm -rf "$work"' EXIT
scripts/make_cluster_spec.sh --ps 1 --workers 1 --out "$work/cluster.json"
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
# psrt's median examples/sec of a run: train RUN_NAME STEPS WORKER_FLAGS...
psrt_train() {
  local name=$1 steps=$2
  shift 2
  scripts/launch.sh --cluster_spec "$work/cluster.json" --logdir "$work/$name" -- \
    --intra_op_threads="$threads" --train_steps="$steps" --log_every_steps=$((steps / 6)) \
    --progress=log --learning_rate=0.01 "$@" >/dev/null
  grep -o '([0-9.]* examples/sec' "$work/$name/worker-0.log" | tr -d '(' |
    awk 'NR > 1 {print $1}' | median
}
for model in $models; do
  model_batch=${batch:-100} psrt_data="" peer_data=""
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
  psrt_eps=$(psrt_train "$model" "$steps" --model="$model" --batch_size="$model_batch" $psrt_data)
  torch_eps=$("$venv/bin/python" scripts/peers/torch_train.py --model "$model" \
                --batch_size "$model_batch" --threads "$threads" $peer_data |
              sed 's/.*examples_per_sec=//')
  awk -v m="$model" -v p="$psrt_eps" -v t="$torch_eps" \
    'BEGIN {printf "train: model=%s psrt_eps=%.1f torch_eps=%.1f ratio=%.2f\n", m, p, t, p / t}'
done
files=$model_files
for app in $keras_apps; do
  file="$work/${app}_${keras_size}.json"
  "$keras_venv/bin/python" scripts/peers/keras_train.py --write_app "$app" \
    --image_size "$keras_size" --classes 10 --out "$file"
  files="$files $file"
done
for file in $files; do
  name=$(basename "$file" .json)
  psrt_eps=$(psrt_train "$name" 36 --model_file="$file" --synthetic_data \
               --batch_size="${batch:-32}")
  keras_eps=$("$keras_venv/bin/python" scripts/peers/keras_train.py --model_file "$file" \
                --batch_size "${batch:-32}" --threads "$threads" --steps 6 --runs 3 |
              sed 's/.*examples_per_sec=//')
  awk -v m="$name" -v p="$psrt_eps" -v t="$keras_eps" \
    'BEGIN {printf "train: keras_file=%s psrt_eps=%.1f keras_eps=%.1f ratio=%.2f\n", m, p, t, p / t}'
done
