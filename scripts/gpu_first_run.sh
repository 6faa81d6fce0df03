#!/usr/bin/env bash
# The one command to run on a GPU machine: proves the whole CUDA path in
# stages, each with a time limit, the whole well inside 10 minutes, and says
# for each what it saw, including that no GPU was seen (where there is none
# it still runs to the end). Made for the device tool, from the repository
# root, with the bundle of scripts/gpu_bundle.sh carried:
#
#   scripts/gpu_bundle.sh && (device) run scripts/gpu_first_run.sh, carry .gpu_bundle.tar.gz
#   scripts/gpu_bundle.sh --train && (device) run scripts/gpu_first_run.sh --train, carry .gpu_train.tar.gz
# (the packed bundle is unpacked beside it first; an unpacked .gpu_bundle
# folder is used as it is)
#
# Stages (the default, with .gpu_bundle):
#   env        the GPUs (nvidia-smi), the machine's CUDA 13 cudart and cuBLAS
#              and cuDNN 9 (ldconfig -p, else a search of the usual places
#              and of Python's nvidia-* wheels, e.g. nvidia/cudnn/lib), their
#              folders put on LD_LIBRARY_PATH, psrtctl devices. No cuDNN is
#              said on the env line but fails nothing (psrt's convolutions
#              then fall back to im2col).
#   tests      the GPU tests with PSRT_REQUIRE_GPU=1 (a skip is a failure)
#   train      psrt_worker --device=gpu end to end: 1 ps + 2 workers, LeNet,
#              sync, synthetic data, through scripts/launch.sh; its final: line
#   bench      scripts/bench_gpu.sh: resnet50 (224x224, batch 64),
#              inception_v3 (299x299, batch 32) and lenet (batch 100), tf32
#              and fp32, psrt's convolutions as measured fastest per layer
#              (auto), through cuDNN alone and through im2col alone, beside
#              PyTorch on the GPU (gpu_train: lines); resnet50 also as tf32
#              jobs on 127.0.0.1 (gpu_job: lines): 1 ps + 1 worker with 2
#              and 8 stripes, and with 8 and 16 stripes placed prioritized,
#              2 ps, 2 workers sharing the GPU, and allreduce; push + pull
#   sanitizer  compute-sanitizer memcheck on the CUDA op, cuDNN and model tests
#              (--no_sanitizer: not run, said as SKIPPED)
# env, tests (100 s a binary) and train (100 s) come first; the bench
# stage's limit (300 s, 420 s with --no_sanitizer) and each sanitizer
# test's (100 s) are cut to what is left of --budget (default 540 s), so
# that the whole stays inside the device tool's 10 minutes; one with too
# little left is not started and fails, saying so.
# With --train (.gpu_train: the two task binaries and Fashion-MNIST): env,
# then train: LeNet on GPU workers through a real ps (1 ps + 2 workers,
# sync, the tuned recipe) to its test accuracy.
#
# Writes under $OUT (the device tool's folder; else --out DIR, default
# /tmp/gpu_first_run): summary.txt (a line per stage, and bench_gpu.sh's
# gpu_train:, gpu_job: and pushpull: lines), and env.txt, tests.txt,
# train.txt, bench.txt, sanitizer.txt with each stage's output.
# Exit status: 0 when every stage passed (or was SKIPPED), 1 otherwise.
#
#   scripts/gpu_first_run.sh [--train] [--no_sanitizer] [--budget 540] [--out DIR]
# PYTHON (default python3): the Python of PyTorch, also asked where its
# nvidia-* wheels are. The bench stage's --conv, --job_models and
# --job_layouts can be narrowed or widened by BENCH_CONVS (default "auto
# cudnn im2col"), JOB_MODELS (default resnet50) and JOB_LAYOUTS (default
# "1ps1w 1ps1w_s8 1ps1w_s8_p 1ps1w_s16_p 2ps1w_s8_p 1ps2w_s8_p ar2w").
set -uo pipefail
cd "$(dirname "$0")/.."
mode=first out="${OUT:-/tmp/gpu_first_run}" sanitize=1 budget=540
python="${PYTHON:-python3}"
while [ $# -gt 0 ]; do
  case "$1" in
    --train) mode=train; shift ;;
    --no_sanitizer) sanitize=0; shift ;;
    --budget) budget="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "gpu_first_run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
bundle=$PWD/.gpu_bundle
[ "$mode" = train ] && bundle=$PWD/.gpu_train
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
work=$(mktemp -d /tmp/gpu_first_run.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
start=$(date +%s)
failed=0
no_gpu_note=""

# stage NAME RESULT DETAIL: one summary line, also printed.
stage() {
  local line
  line=$(printf 'stage %-9s %-7s %s%s (%ds)' "$1" "$2" "$3" "$no_gpu_note" $(($(date +%s) - start)))
  echo "$line" | tee -a "$summary"
  [ "$2" = OK ] || [ "$2" = SKIPPED ] || failed=1
}

# limit SECONDS: a time limit of SECONDS, or what is left of the budget
# (less 10 s for the summary), whichever is less.
limit() {
  local left=$((budget - 10 - ($(date +%s) - start)))
  echo $((left < $1 ? left : $1))
}

# ---- env ----
{
  echo "== date: $(date -u)"
  echo "== nvidia-smi"
  nvidia-smi -L 2>&1 || echo "nvidia-smi: not found or failed"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
  echo "== host CPU"
  lscpu 2>&1 | grep -E '^(Model name|CPU\(s\)|Flags)' | cut -c1-200
} >"$out/env.txt"
if [ ! -x "$bundle/bin/psrtctl" ] && [ -f "$bundle.tar.gz" ]; then
  mkdir -p "$bundle" && tar -C "$bundle" -xzf "$bundle.tar.gz"
fi
if [ ! -x "$bundle/bin/psrtctl" ]; then
  stage env FAILED "no bundle at $bundle: run scripts/gpu_bundle.sh$([ "$mode" = train ] && echo ' --train') and carry it"
  exit 1
fi
# find_lib LIB: where LIB is, ldconfig first, then the usual places (the
# toolkit, and Python's nvidia-* wheels wherever that Python keeps them:
# nvidia/cudnn/lib, nvidia/cu13/lib, ...); nothing when not found.
py_nvidia=$("$python" -c 'import nvidia; print("\n".join(nvidia.__path__))' 2>/dev/null)
echo "== $python's nvidia-* wheels: ${py_nvidia:-none}" >>"$out/env.txt"
find_lib() {
  local path
  path=$(ldconfig -p 2>/dev/null | awk -v l="$1" '$1 == l {print $NF; exit}')
  if [ -z "$path" ]; then
    # shellcheck disable=SC2086  # py_nvidia: one folder a line.
    path=$(find /usr/local /usr/lib /opt /root $py_nvidia -maxdepth 9 -name "$1*" \
             -not -path '*/proc/*' 2>/dev/null | head -n 1)
  fi
  echo "$path"
}
# add_dir VAR PATH: PATH's folder appended to the :-list VAR, once.
add_dir() {
  local dir
  dir=$(dirname "$2")
  case ":${!1}:" in *":$dir:"*) ;; *) printf -v "$1" '%s' "${!1:+${!1}:}$dir" ;; esac
}
# CUDA 13's cudart and cuBLAS.
cuda_dirs=""
for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
  path=$(find_lib "$lib")
  echo "== $lib: ${path:-not found}" >>"$out/env.txt"
  [ -z "$path" ] || add_dir cuda_dirs "$path"
done
# cuDNN 9: psrt's --gpu_conv=cudnn; without it psrt's convolutions fall back
# to im2col, so its absence is said but fails nothing.
cudnn=$(find_lib libcudnn.so.9)
echo "== libcudnn.so.9: ${cudnn:-not found}" >>"$out/env.txt"
lib_dirs=$cuda_dirs
if [ -n "$cudnn" ]; then
  add_dir lib_dirs "$cudnn"
  cudnn_note="; cuDNN 9 in $(dirname "$cudnn")"
else
  cudnn_note="; cuDNN 9 not found (psrt's convolutions fall back to im2col)"
fi
# PyTorch (the bench's peer) keeps the environment's own: it carries its
# own cuDNN and refuses an older one found first.
export PEER_LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
if [ -n "$lib_dirs" ]; then  # An empty entry would mean the current folder.
  export LD_LIBRARY_PATH="${lib_dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
echo "== LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >>"$out/env.txt"
devices=$("$bundle/bin/psrtctl" devices 2>&1)
devices_rc=$?
echo "== psrtctl devices (exit $devices_rc)" >>"$out/env.txt"
echo "$devices" >>"$out/env.txt"
driver_gpus=$(echo "$devices" | sed -n 's/.*driver_gpus=\([0-9]*\).*/\1/p')
if [ "${driver_gpus:-0}" -eq 0 ]; then
  no_gpu_note=" [no GPU seen: the driver reports ${driver_gpus:-no count}]"
fi
if [ $devices_rc -eq 0 ] && [ -n "$cuda_dirs" ]; then
  stage env OK "$(echo "$devices" | grep '^devices:' | head -n 1)$cudnn_note"
else
  stage env FAILED "$(echo "$devices" | tail -n 1) (CUDA 13 libraries: ${cuda_dirs:-none found})$cudnn_note"
fi

# ---- train: a cluster on 127.0.0.1, GPU workers ----
# train_job SECONDS WORKER_FLAGS...: runs 1 ps + 2 workers under launch.sh;
# the chief's final: line, or why not.
train_job() {
  local limit=$1
  shift
  local logdir="$work/train"
  mkdir -p "$logdir"
  "$bundle/bin/psrtctl" make_spec --ps=1 --workers=2 --out="$logdir/cluster.json" \
    >>"$out/train.txt" 2>&1
  PSRT_BIN_DIR="$bundle/bin" timeout "$limit" scripts/launch.sh \
    --cluster_spec "$logdir/cluster.json" --logdir "$logdir" -- \
    --model=lenet --device=gpu --sync_replicas --batch_size=100 "$@" \
    >>"$out/train.txt" 2>&1
  local rc=$?
  for f in "$logdir"/*.log; do
    { echo "== $(basename "$f") (last 40 lines)"; tail -n 40 "$f"; } >>"$out/train.txt"
  done
  local final
  final=$(grep -h '^final:' "$logdir/worker-0.log" 2>/dev/null | tail -n 1)
  if [ $rc -eq 0 ] && [ -n "$final" ]; then
    stage train OK "$final"
  else
    local why
    why=$(grep -hE '^[EF][0-9]{8} ' "$logdir"/worker-*.log 2>/dev/null | tail -n 1 | cut -c1-240)
    [ $rc -eq 124 ] && why="timed out after ${limit}s; $why"
    stage train FAILED "launch.sh exit $rc: ${why:-see train.txt}"
  fi
}

if [ "$mode" = train ]; then
  # The tuned LeNet recipe (scripts/run_mnist_recipe.sh --tuned) on IDX data.
  train_job 420 --data_dir="$bundle/data" --optimizer=momentum --momentum=0.9 \
    --learning_rate=0.01 --train_steps=1500 --learning_rate_decay=exponential \
    --decay_rate=0.99 --decay_epochs=1 --staircase --weight_decay=1e-4 \
    --moving_average_decay=0.99 --eval_moving_average --log_every_steps=250
  exit $failed
fi

# ---- tests: a skip is a failure ----
tests_ok=0 tests_failed=0
for t in device_test ops_cuda_test layers_cuda_test cudnn_conv_test gpu_model_test towers_test; do
  echo "== $t" >>"$out/tests.txt"
  PSRT_REQUIRE_GPU=1 timeout 100 "$bundle/bin/$t" >"$work/$t.log" 2>&1
  rc=$?
  cat "$work/$t.log" >>"$out/tests.txt"
  if [ $rc -eq 0 ] && ! grep -q '\[  SKIPPED \]' "$work/$t.log"; then
    tests_ok=$((tests_ok + 1))
  else
    tests_failed=$((tests_failed + 1))
    echo "$t: exit $rc, $(grep -cE '^\[  FAILED  \] .* \([0-9]+ ms\)$' "$work/$t.log") failed, $(grep -cE '^\[  SKIPPED \] .* \([0-9]+ ms\)$' "$work/$t.log") skipped; first: $(grep -m 1 -A 2 -E 'Failure$' "$work/$t.log" | tail -n 1 | cut -c1-160)" >>"$work/tests_failed"
  fi
done
if [ $tests_failed -eq 0 ]; then
  stage tests OK "$tests_ok test binaries passed, none skipped"
else
  stage tests FAILED "$tests_failed of $((tests_ok + tests_failed)) binaries failed: $(head -c 300 "$work/tests_failed" | tr '\n' ';')"
fi

train_job 100 --synthetic_data --train_steps=300 --log_every_steps=100

# ---- bench ----
# 18 step_bench runs (3 models, 2 maths, 3 convs), 6 of PyTorch, 7 resnet50
# jobs and push + pull: 203 s on an H200 (2026-11-27, --no_sanitizer); with
# the sanitizer's share taken, the 300 s limit still holds them.
bench_limit=$(limit $((sanitize ? 300 : 420)))
if [ "$bench_limit" -lt 60 ]; then
  stage bench FAILED "not run: ${bench_limit}s left of the ${budget}s budget"
else
  PSRT_BIN_DIR="$bundle/bin" PYTHON="$python" timeout "$bench_limit" scripts/bench_gpu.sh \
    --models "resnet50 inception_v3 lenet" --math "tf32 fp32" --conv "${BENCH_CONVS:-auto cudnn im2col}" \
    --job_models "${JOB_MODELS:-resnet50}" --runs 3 --log_dir "$work/bench" \
    --job_layouts "${JOB_LAYOUTS:-1ps1w 1ps1w_s8 1ps1w_s8_p 1ps1w_s16_p 2ps1w_s8_p 1ps2w_s8_p ar2w}" \
    2>&1 | tee "$work/bench.out" \
    >"$out/bench.txt"  # Line by line: what a cut-off run measured still comes back.
  rc=$?
  for f in "$work"/bench/*.log; do
    [ -f "$f" ] && { echo "== $(basename "$f") (last 20 lines)"; tail -n 20 "$f"; }
  done >>"$out/bench.txt"
  grep -E '^(peer|gpu_train|gpu_job|pushpull):' "$work/bench.out" | sed 's/^/  /' | tee -a "$summary"
  if [ $rc -eq 0 ]; then
    stage bench OK "$(grep -c '^gpu_train:' "$work/bench.out") gpu_train lines, $(grep -c '^gpu_job:' "$work/bench.out") gpu_job lines"
  else
    stage bench FAILED "exit $rc$([ $rc -eq 124 ] && echo " (timed out after ${bench_limit}s)"): $(grep -c FAILED "$work/bench.out") FAILED lines"
  fi
fi

# ---- sanitizer ----
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)
if [ $sanitize -eq 0 ]; then
  stage sanitizer SKIPPED "--no_sanitizer"
elif [ -z "$sanitizer" ]; then
  stage sanitizer FAILED "compute-sanitizer not found"
else
  errors=0
  for t in ops_cuda_test layers_cuda_test cudnn_conv_test gpu_model_test; do
    echo "== memcheck $t" >>"$out/sanitizer.txt"
    san_limit=$(limit 100)
    if [ "$san_limit" -lt 20 ]; then
      errors=$((errors + 1))
      echo "$t: not run, ${san_limit}s left of the ${budget}s budget" | tee -a "$out/sanitizer.txt" >>"$work/san_failed"
      continue
    fi
    PSRT_REQUIRE_GPU=1 timeout "$san_limit" "$sanitizer" --tool memcheck --error-exitcode 99 \
      "$bundle/bin/$t" >"$work/san-$t.log" 2>&1
    rc=$?
    # memcheck's findings, and what a failed test said (gtest's Failure
    # lines and the few after them).
    grep -E -A 4 'ERROR SUMMARY|FAILED|Invalid|========= |Failure$' "$work/san-$t.log" |
      head -n 120 >>"$out/sanitizer.txt"
    [ $rc -eq 0 ] || { errors=$((errors + 1)); echo "$t: exit $rc$([ $rc -eq 124 ] && echo " (timed out after ${san_limit}s)")" >>"$work/san_failed"; }
  done
  if [ $errors -eq 0 ]; then
    stage sanitizer OK "memcheck clean on ops_cuda_test, layers_cuda_test, cudnn_conv_test, gpu_model_test"
  else
    stage sanitizer FAILED "$(tr '\n' ';' <"$work/san_failed")"
  fi
fi
exit $failed
