#!/usr/bin/env bash
# GPU training throughput of psrt beside PyTorch training the same model on
# the same GPU, in the same run, on synthetic data, with like-for-like math
# (both fp32, then both tf32). Per model, math and psrt convolution path:
#   gpu_train: model=M batch=B gpu_math=fp32|tf32 conv=cudnn|im2col psrt_eps=X torch_eps=Y ratio=R
# then per model (--job_models), in the first --math given and the first
# --conv that step_bench ran (cudnn fails where libcudnn.so.9 does not
# load), a real job on 127.0.0.1 (psrt_ps and psrt_worker --device=gpu
# --synthetic_data --sync_replicas through scripts/launch.sh) in each of
# --job_layouts, each PpsWw[_sN][_bf16][_p] (P ps tasks and W workers, the
# workers sharing the one GPU; _sN: every task with --ps_stripes=N, the
# model in P x N contiguous shards, so that pushes and pulls overlap the
# passes at a finer grain than the default 2; _bf16: the workers'
# --wire_dtype=bf16, half the bytes on the wire; _p: the workers'
# --placement=prioritized, the first layers' shards smallest, psrt's
# default; without _p the workers' --placement=contiguous, runs of equal
# bytes, so that a layout names what it named before prioritized became
# the default) or arWw (W workers sharing the GPU in
# --mode=allreduce, no ps: gradients from the device through page-locked
# memory into the ring). Default: 1ps1w 2ps1w 1ps2w 1ps1w_s8 ar2w.
#   gpu_job: model=M batch=B gpu_math=X conv=C layout=L job_eps=J single_eps=S ratio=R compute_ms=T push_ms=P pull_ms=Q exposed_comm_ms=E
# J is the examples/sec of all the job's workers together, S step_bench's
# for the same model, math and conv measured above (no ps: the
# single-process rate), R = J / S. With one GPU, 2 workers share it, so
# 1ps2w is compared with 1x S too (not 2x: bench_step.sh's step_bound:
# compares CPU workers, each with its own cores, with W x). The times are
# the chief's per step (scripts/lib/step_log.sh: medians of its log
# intervals after the first): compute, push, pull and the exposed
# communication (push + pull - waiting for the other worker and the update).
# And one line for push + pull through a ps task on 127.0.0.1 with the GPU
# copies included (gradients from the device before each push, parameters to
# it after each pull, through page-locked tensors):
#   pushpull: model_mb=13 shards=1 ... tensors=grpc|data_plane device=gpu mb_per_s=X tcp_mb_per_s=Y ...
# A measurement that fails prints `gpu_train: model=M gpu_math=X conv=C
# FAILED: reason` (or `gpu_job: model=M layout=L FAILED: reason`,
# `pushpull: FAILED: reason`), keeps its whole log, and the script goes on;
# it exits 1 at the end if anything failed.
#
# psrt's figure is step_bench --device=gpu: a GPU worker's step (parameters
# copied to the GPU, forward, backward, gradients copied back; the update
# runs on the ps). PyTorch's (scripts/peers/torch_train.py --device cuda
# --synthetic) is forward, backward and an SGD step with the parameters
# resident on the GPU. Both are medians of --runs timed runs. PyTorch runs
# its convolutions through cuDNN; psrt through the faster of cuDNN and its
# own im2col + cuBLAS per layer (--gpu_conv=auto), through cuDNN alone
# (cudnn) or im2col alone (im2col), as --conv says (PyTorch runs once per
# model and math, its figure beside each conv).
# Models: lenet (28x28x1, batch 100), inception_mini (28x28x1, batch 100),
# resnet50 (224x224x3, 1000 classes, batch 64), inception_v3 (299x299x3,
# 1000 classes, batch 32). A job trains 300 steps of lenet or
# inception_mini, 40 of resnet50, 30 of inception_v3; its log
# (LOG_DIR/job-M-L.log, the tasks' logs in LOG_DIR/job-M-L/) ends with its
# elapsed seconds.
#
#   scripts/bench_gpu.sh [--models "lenet inception_mini resnet50 inception_v3"]
#                        [--math "fp32 tf32"] [--conv "auto cudnn im2col"] [--runs 5]
#                        [--jobs | --no_jobs] [--job_models "MODELS"]
#                        [--job_layouts "1ps1w 2ps1w 1ps2w 1ps1w_s8 ar2w"] [--log_dir DIR]
#                        [--job_timelines DIR]
# (--conv: default auto, psrt's own default; each is passed on as --gpu_conv;
# --jobs, the default: jobs for the models of --job_models, default all of
# --models; --no_jobs: none. --job_timelines DIR: each job's chief writes
# its --timeline, each ps shard's push and pull on a lane of its own, to
# DIR/timeline-M-L.json.)
#
# PSRT_BIN_DIR=DIR takes the binaries from DIR (a GPU machine that has none
# of the build's Debian packages: scripts/gpu_bundle.sh); otherwise
# scripts/setup.sh builds them first. PYTHON (default python3) must import
# torch with CUDA (and torchvision for resnet50 and inception_v3).
# PEER_LD_LIBRARY_PATH, when set, is PyTorch's LD_LIBRARY_PATH instead of
# psrt's: PyTorch refuses a cuDNN older than its own ("cuDNN version
# incompatibility"), and the folder psrt's cuDNN came from may hold one.
# For testing the script where there is no GPU: BENCH_GPU_DEVICE=cpu runs
# step_bench and the jobs' workers with --device=cpu (1 thread each, no
# --gpu_conv, conv=- in the lines); PyTorch and pushpull still ask for the
# GPU and fail.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/step_log.sh  # step_log_field, step_log_job_eps
models="lenet inception_mini resnet50 inception_v3" maths="fp32 tf32" convs="auto"
runs=5 log_dir="" job_timelines="" run_jobs=1 job_models="" job_layouts="1ps1w 2ps1w 1ps2w 1ps1w_s8 ar2w"
while [ $# -gt 0 ]; do
  case "$1" in
    --models) models="$2"; shift 2 ;;
    --math) maths="$2"; shift 2 ;;
    --conv) convs="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --jobs) run_jobs=1; shift ;;
    --no_jobs) run_jobs=0; shift ;;
    --job_models) job_models="$2"; shift 2 ;;
    --job_layouts) job_layouts="$2"; shift 2 ;;
    --log_dir) log_dir="$2"; shift 2 ;;
    --job_timelines) job_timelines="$2"; shift 2 ;;
    *) echo "bench_gpu.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$job_models" ] || job_models="$models"
[ -z "$job_timelines" ] || mkdir -p "$job_timelines"
if [ -z "${PSRT_BIN_DIR:-}" ]; then
  scripts/setup.sh >/dev/null || { echo "bench_gpu: scripts/setup.sh failed" >&2; exit 1; }
fi
bin="${PSRT_BIN_DIR:-build/bin}"
bin=$(cd "$bin" && pwd) || { echo "bench_gpu: no folder $bin" >&2; exit 1; }
python="${PYTHON:-python3}"
device="${BENCH_GPU_DEVICE:-gpu}"
# The device's own flags: the convolution path is a GPU choice (conv_args
# CONV sets conv_flag); on the CPU (testing) every process gets one thread.
conv_args() { conv_flag=(); [ "$device" = gpu ] && conv_flag=(--gpu_conv="$1"); }
bench_threads=() worker_threads=()
if [ "$device" != gpu ]; then
  bench_threads=(--threads=1) worker_threads=(--intra_op_threads=1)
fi
work=$(mktemp -d /tmp/psrt_bench_gpu.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
[ -n "$log_dir" ] || log_dir="$work"
mkdir -p "$log_dir"
failed=0
read -r job_math _ <<<"$maths"

# Why a log's program failed, for a FAILED line: its first glog error or
# fatal line, else its last non-empty line, else that it wrote nothing.
reason() {
  local why
  why=$({ grep -m 1 -E '^[EF][0-9]{8} ' "$1" || grep -v '^[[:space:]]*$' "$1" | tail -n 1; } |
          cut -c1-300)
  echo "${why:-no output in $(basename "$1")}"
}

# run_job LAYOUT: one job of $model on 127.0.0.1, one gpu_job: line.
# Needs model, batch, shape, job_steps, job_every, job_limit, single_eps.
run_job() {
  local layout=$1 nps nworkers ps_flags="" task_flags=()
  if [[ "$layout" =~ ^([0-9]+)ps([0-9]+)w(_s([0-9]+))?(_bf16)?(_p)?$ ]]; then
    nps=${BASH_REMATCH[1]} nworkers=${BASH_REMATCH[2]}
    if [ -n "${BASH_REMATCH[4]}" ]; then
      ps_flags="--ps_stripes=${BASH_REMATCH[4]}" task_flags=(--ps_stripes="${BASH_REMATCH[4]}")
    fi
    [ -z "${BASH_REMATCH[5]}" ] || task_flags+=(--wire_dtype=bf16)
    if [ -n "${BASH_REMATCH[6]}" ]; then
      task_flags+=(--placement=prioritized)
    else
      task_flags+=(--placement=contiguous)
    fi
  elif [[ "$layout" =~ ^ar([0-9]+)w$ ]]; then
    nps=0 nworkers=${BASH_REMATCH[1]} task_flags=(--mode=allreduce)
  else
    echo "gpu_job: model=$model layout=$layout FAILED: not PpsWw[_sN][_bf16][_p] or arWw"
    failed=1
    return
  fi
  local head="gpu_job: model=$model layout=$layout"
  local dir="$log_dir/job-$model-$layout" log="$log_dir/job-$model-$layout.log"
  rm -rf "$dir" && mkdir -p "$dir"
  if ! "$bin/psrtctl" make_spec --ps="$nps" --workers="$nworkers" \
         --out="$dir/cluster.json" >"$log" 2>&1; then
    echo "$head FAILED: make_spec: $(reason "$log")"
    failed=1
    return
  fi
  local start=$SECONDS rc
  [ -z "$job_timelines" ] || task_flags+=(--timeline="$job_timelines/timeline-$model-$layout.json")
  conv_args "$job_conv"
  PSRT_BIN_DIR="$bin" timeout "$job_limit" scripts/launch.sh \
    --cluster_spec "$dir/cluster.json" --logdir "$dir" --ps_flags "$ps_flags" -- \
    --model="$model" --device="$device" --gpu_math="$job_math" "${conv_flag[@]}" \
    "${task_flags[@]}" \
    "${worker_threads[@]}" --synthetic_data --sync_replicas --batch_size="$batch" \
    --input_height="${shape[0]}" --input_width="${shape[0]}" \
    --input_channels="${shape[1]}" --num_classes="${shape[2]}" \
    --train_steps="$job_steps" --log_every_steps="$job_every" --progress=log \
    --learning_rate=0.001 >>"$log" 2>&1
  rc=$?
  echo "job: model=$model layout=$layout launch.sh exit $rc after $((SECONDS - start)) s" >>"$log"
  local chief="$dir/worker-0.log"
  if [ $rc -ne 0 ]; then
    local why
    why=$(cat "$dir"/worker-*.log "$dir"/ps-*.log 2>/dev/null | grep -m 1 -E '^[EF][0-9]{8} ' | cut -c1-240)
    [ $rc -eq 124 ] && why="timed out after ${job_limit}s; $why"
    echo "$head FAILED: launch.sh exit $rc: ${why:-see $log}"
    failed=1
    return
  fi
  local job_eps
  job_eps=$(step_log_job_eps "$chief" "$nworkers")
  if [ -z "$job_eps" ]; then
    echo "$head FAILED: no step intervals after the first in the chief's log"
    failed=1
    return
  fi
  awk -v m="$model" -v b="$batch" -v g="$job_math" -v c="$conv_shown" -v l="$layout" \
      -v j="$job_eps" -v s="$single_eps" -v cm="$(step_log_field "$chief" compute_ms)" \
      -v pu="$(step_log_field "$chief" push_ms)" -v pl="$(step_log_field "$chief" pull_ms)" \
      -v e="$(step_log_field "$chief" exposed_comm_ms)" 'BEGIN {
    printf "gpu_job: model=%s batch=%d gpu_math=%s conv=%s layout=%s job_eps=%.0f single_eps=%.0f ratio=%.2f compute_ms=%.2f push_ms=%.2f pull_ms=%.2f exposed_comm_ms=%.2f\n",
           m, b, g, c, l, j, s, j / s, cm, pu, pl, e}'
}

for model in $models; do
  case "$model" in
    inception_v3) shape=(299 3 1000) batch=32 steps=10 job_steps=30 job_every=5 job_limit=150 ;;
    resnet50) shape=(224 3 1000) batch=64 steps=10 job_steps=40 job_every=5 job_limit=150 ;;
    *) shape=(28 1 10) batch=100 steps=50 job_steps=300 job_every=50 job_limit=90 ;;
  esac
  single_eps="" job_conv=""
  for math in $maths; do
    tag="$model-$math"
    torch_line=$(LD_LIBRARY_PATH="${PEER_LD_LIBRARY_PATH-${LD_LIBRARY_PATH:-}}" \
                 "$python" scripts/peers/torch_train.py --model "$model" --device cuda \
                   --synthetic --gpu_math "$math" --image_size "${shape[0]}" \
                   --channels "${shape[1]}" --classes "${shape[2]}" \
                   --batch_size "$batch" --steps "$steps" --runs "$runs" \
                   2>"$log_dir/torch-$tag.log")
    torch_eps=$(sed -n 's/.*examples_per_sec=//p' <<<"$torch_line")
    # The peer's versions, once: what the ratios were measured against.
    if [ -z "${peer_said:-}" ] && [ -n "$torch_eps" ]; then
      echo "peer: $(grep -o 'torch=[^ ]* cudnn=[^ ]*' <<<"$torch_line")"
      peer_said=1
    fi
    for conv in $convs; do
      conv_shown=$conv
      [ "$device" = gpu ] || conv_shown=-
      conv_args "$conv"
      psrt_eps=$("$bin/step_bench" --device="$device" --gpu_math="$math" "${conv_flag[@]}" \
                   "${bench_threads[@]}" --model="$model" \
                   --batch_size="$batch" --input_size="${shape[0]}" \
                   --input_channels="${shape[1]}" --num_classes="${shape[2]}" \
                   --steps="$steps" --runs="$runs" 2>"$log_dir/step_bench-$tag-$conv.log" |
                 sed -n 's/.*wall_eps=\([0-9.]*\).*/\1/p')
      if [ -z "$psrt_eps" ]; then
        echo "gpu_train: model=$model gpu_math=$math conv=$conv_shown FAILED: psrt: $(reason "$log_dir/step_bench-$tag-$conv.log")"
        failed=1
        continue
      fi
      if [ "$math" = "$job_math" ] && [ -z "$single_eps" ]; then
        single_eps=$psrt_eps job_conv=$conv
      fi
      if [ -z "$torch_eps" ]; then
        echo "gpu_train: model=$model gpu_math=$math conv=$conv_shown psrt_eps=$psrt_eps FAILED: torch: $(reason "$log_dir/torch-$tag.log")"
        failed=1
        continue
      fi
      awk -v m="$model" -v b="$batch" -v g="$math" -v c="$conv_shown" -v p="$psrt_eps" -v t="$torch_eps" 'BEGIN {
        printf "gpu_train: model=%s batch=%d gpu_math=%s conv=%s psrt_eps=%.0f torch_eps=%.0f ratio=%.2f\n",
               m, b, g, c, p, t, p / t}'
    done
  done
  if [ "$run_jobs" = 0 ] || [[ " $job_models " != *" $model "* ]]; then continue; fi
  conv_shown=$job_conv
  [ "$device" = gpu ] || conv_shown=-
  for layout in $job_layouts; do
    if [ -z "$single_eps" ]; then
      echo "gpu_job: model=$model layout=$layout FAILED: no single-process rate (step_bench failed in gpu_math=$job_math for every conv)"
      failed=1
      continue
    fi
    run_job "$layout"
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