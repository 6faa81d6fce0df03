#!/usr/bin/env bash
# GPU training throughput of psrt beside PyTorch training the same model on
# the same GPU, in the same run, on synthetic data, with like-for-like math
# (both fp32, then both tf32). Per model and math:
#   gpu_train: model=M batch=B gpu_math=fp32|tf32 psrt_eps=X torch_eps=Y ratio=R
# and one line for push + pull through a ps task on 127.0.0.1 with the GPU
# copies included (gradients from the device before each push, parameters to
# it after each pull, through page-locked tensors):
#   pushpull: model_mb=13 shards=1 ... tensors=grpc|data_plane device=gpu mb_per_s=X tcp_mb_per_s=Y ...
# A measurement that fails prints `gpu_train: model=M gpu_math=X FAILED:
# reason` (or `pushpull: FAILED: reason`), keeps its whole log, and the
# script goes on; it exits 1 at the end if anything failed.
#
# psrt's figure is step_bench --device=gpu: a GPU worker's step (parameters
# copied to the GPU, forward, backward, gradients copied back; the update
# runs on the ps). PyTorch's (scripts/peers/torch_train.py --device cuda
# --synthetic) is forward, backward and an SGD step with the parameters
# resident on the GPU. Both are medians of --runs timed runs. PyTorch runs
# its convolutions through cuDNN, psrt through im2col and cuBLAS.
# Models: lenet (28x28x1, batch 100), inception_mini (28x28x1, batch 100),
# inception_v3 (299x299x3, 1000 classes, batch 32).
#
#   scripts/bench_gpu.sh [--models "lenet inception_mini inception_v3"]
#                        [--math "fp32 tf32"] [--runs 5] [--log_dir DIR]
#
# PSRT_BIN_DIR=DIR takes the binaries from DIR (a GPU machine that has none
# of the build's Debian packages: scripts/gpu_bundle.sh); otherwise
# scripts/setup.sh builds them first. PYTHON (default python3) must import
# torch with CUDA (and torchvision for inception_v3).
set -uo pipefail
cd "$(dirname "$0")/.."
models="lenet inception_mini inception_v3" maths="fp32 tf32" runs=5 log_dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --models) models="$2"; shift 2 ;;
    --math) maths="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --log_dir) log_dir="$2"; shift 2 ;;
    *) echo "bench_gpu.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "${PSRT_BIN_DIR:-}" ]; then
  scripts/setup.sh >/dev/null || { echo "bench_gpu: scripts/setup.sh failed" >&2; exit 1; }
fi
bin="${PSRT_BIN_DIR:-build/bin}"
python="${PYTHON:-python3}"
work=$(mktemp -d /tmp/psrt_bench_gpu.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
[ -n "$log_dir" ] || log_dir="$work"
mkdir -p "$log_dir"
failed=0

# Why a log's program failed, for a FAILED line: its first glog error or
# fatal line, else its last non-empty line.
reason() {
  { grep -m 1 -E '^[EF][0-9]{8} ' "$1" || grep -v '^[[:space:]]*$' "$1" | tail -n 1; } |
    cut -c1-300
}

for model in $models; do
  case "$model" in
    inception_v3) shape=(299 3 1000) batch=32 steps=10 ;;
    *) shape=(28 1 10) batch=100 steps=50 ;;
  esac
  for math in $maths; do
    tag="$model-$math"
    psrt_eps=$("$bin/step_bench" --device=gpu --gpu_math="$math" --model="$model" \
                 --batch_size="$batch" --input_size="${shape[0]}" \
                 --input_channels="${shape[1]}" --num_classes="${shape[2]}" \
                 --steps="$steps" --runs="$runs" 2>"$log_dir/step_bench-$tag.log" |
               sed -n 's/.*wall_eps=\([0-9.]*\).*/\1/p')
    if [ -z "$psrt_eps" ]; then
      echo "gpu_train: model=$model gpu_math=$math FAILED: psrt: $(reason "$log_dir/step_bench-$tag.log")"
      failed=1
      continue
    fi
    torch_eps=$("$python" scripts/peers/torch_train.py --model "$model" --device cuda \
                  --synthetic --gpu_math "$math" --image_size "${shape[0]}" \
                  --channels "${shape[1]}" --classes "${shape[2]}" \
                  --batch_size "$batch" --steps "$steps" --runs "$runs" \
                  2>"$log_dir/torch-$tag.log" | sed -n 's/.*examples_per_sec=//p')
    if [ -z "$torch_eps" ]; then
      echo "gpu_train: model=$model gpu_math=$math psrt_eps=$psrt_eps FAILED: torch: $(reason "$log_dir/torch-$tag.log")"
      failed=1
      continue
    fi
    awk -v m="$model" -v b="$batch" -v g="$math" -v p="$psrt_eps" -v t="$torch_eps" 'BEGIN {
      printf "gpu_train: model=%s batch=%d gpu_math=%s psrt_eps=%.0f torch_eps=%.0f ratio=%.2f\n",
             m, b, g, p, t, p / t}'
  done
done

if "$bin/psrtctl" make_spec --ps=1 --workers=1 --out="$work/cluster.json" \
     >"$log_dir/make_spec.log" 2>&1; then
  # The page-locked tensors inside gRPC messages, then over the data plane.
  for tensors in grpc data_plane; do
    "$bin/psrt_ps" --cluster_spec="$work/cluster.json" --job_name=ps --task_index=0 \
      >"$log_dir/ps-0-$tensors.log" 2>&1 &
    ps_pid=$!
    # On success the bench shuts the ps down; on failure it may not have.
    if ! "$bin/pushpull_bench" --cluster_spec="$work/cluster.json" --model_mb=13 \
           --device=gpu --runs="$runs" --tensor_transport="$tensors" \
           2>"$log_dir/pushpull_bench-$tensors.log"; then
      echo "pushpull: tensors=$tensors FAILED: $(reason "$log_dir/pushpull_bench-$tensors.log")"
      failed=1
      kill "$ps_pid" 2>/dev/null
    fi
    wait "$ps_pid" 2>/dev/null
  done
else
  echo "pushpull: FAILED: $(reason "$log_dir/make_spec.log")"
  failed=1
fi
exit "$failed"
