#!/usr/bin/env bash
# The one command to run on a GPU machine: proves the whole CUDA path in
# stages, each with a time limit, the whole well inside 10 minutes, and says
# for each what it saw, including that no GPU was seen (where there is none
# it still runs to the end). Made for the device tool, from the repository
# root, with the bundle of scripts/gpu_bundle.sh carried:
#
#   scripts/gpu_bundle.sh && (device) run scripts/gpu_first_run.sh, carry .gpu_bundle
#   scripts/gpu_bundle.sh --train && (device) run scripts/gpu_first_run.sh --train, carry .gpu_train
#
# Stages (the default, with .gpu_bundle):
#   env        the GPUs (nvidia-smi), the machine's CUDA 13 cudart and cuBLAS
#              (ldconfig -p, else a search), psrtctl devices
#   tests      the GPU tests with PSRT_REQUIRE_GPU=1 (a skip is a failure)
#   train      psrt_worker --device=gpu end to end: 1 ps + 2 workers, LeNet,
#              sync, synthetic data, through scripts/launch.sh; its final: line
#   bench      scripts/bench_gpu.sh: lenet (batch 100) and inception_v3
#              (299x299, batch 32), fp32 and tf32, beside PyTorch on the GPU
#   sanitizer  compute-sanitizer memcheck on the CUDA op and model tests
# With --train (.gpu_train: the two task binaries and Fashion-MNIST): env,
# then train: LeNet on GPU workers through a real ps (1 ps + 2 workers,
# sync, the tuned recipe) to its test accuracy.
#
# Writes under $OUT (the device tool's folder; else --out DIR, default
# /tmp/gpu_first_run): summary.txt (a line per stage), and env.txt,
# tests.txt, train.txt, bench.txt, sanitizer.txt with each stage's output.
# Exit status: 0 when every stage passed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=first out="${OUT:-/tmp/gpu_first_run}"
while [ $# -gt 0 ]; do
  case "$1" in
    --train) mode=train; shift ;;
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
  [ "$2" = OK ] || failed=1
}

# ---- env ----
{
  echo "== date: $(date -u)"
  echo "== nvidia-smi"
  nvidia-smi -L 2>&1 || echo "nvidia-smi: not found or failed"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
} >"$out/env.txt"
if [ ! -x "$bundle/bin/psrtctl" ]; then
  stage env FAILED "no bundle at $bundle: run scripts/gpu_bundle.sh$([ "$mode" = train ] && echo ' --train') and carry it"
  exit 1
fi
# CUDA 13's cudart and cuBLAS: ldconfig first, then the usual places
# (the toolkit, Python's nvidia-* wheels).
cuda_dirs=""
for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
  path=$(ldconfig -p 2>/dev/null | awk -v l="$lib" '$1 == l {print $NF; exit}')
  if [ -z "$path" ]; then
    path=$(find /usr/local /usr/lib /opt /root -maxdepth 9 -name "$lib*" \
             -not -path '*/proc/*' 2>/dev/null | head -n 1)
  fi
  echo "== $lib: ${path:-not found}" >>"$out/env.txt"
  if [ -n "$path" ]; then
    dir=$(dirname "$path")
    case ":$cuda_dirs:" in *":$dir:"*) ;; *) cuda_dirs="${cuda_dirs:+$cuda_dirs:}$dir" ;; esac
  fi
done
export LD_LIBRARY_PATH="${cuda_dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
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
  stage env OK "$(echo "$devices" | grep '^devices:' | head -n 1)"
else
  stage env FAILED "$(echo "$devices" | tail -n 1) (CUDA 13 libraries: ${cuda_dirs:-none found})"
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
for t in device_test ops_cuda_test layers_cuda_test gpu_model_test towers_test; do
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
PSRT_BIN_DIR="$bundle/bin" timeout 200 scripts/bench_gpu.sh --models "lenet inception_v3" \
  --math "fp32 tf32" --runs 3 --log_dir "$work/bench" >"$work/bench.out" 2>&1
rc=$?
{ cat "$work/bench.out"; for f in "$work"/bench/*.log; do
    [ -f "$f" ] && { echo "== $(basename "$f") (last 20 lines)"; tail -n 20 "$f"; }
  done; } >"$out/bench.txt"
grep -E '^(gpu_train|pushpull):' "$work/bench.out" | sed 's/^/  /' | tee -a "$summary"
if [ $rc -eq 0 ]; then
  stage bench OK "$(grep -c '^gpu_train:' "$work/bench.out") gpu_train lines"
else
  stage bench FAILED "exit $rc$([ $rc -eq 124 ] && echo ' (timed out)'): $(grep -c FAILED "$work/bench.out") FAILED lines"
fi

# ---- sanitizer ----
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)
if [ -z "$sanitizer" ]; then
  stage sanitizer FAILED "compute-sanitizer not found"
else
  errors=0
  for t in ops_cuda_test layers_cuda_test gpu_model_test; do
    echo "== memcheck $t" >>"$out/sanitizer.txt"
    PSRT_REQUIRE_GPU=1 timeout 100 "$sanitizer" --tool memcheck --error-exitcode 99 \
      "$bundle/bin/$t" >"$work/san-$t.log" 2>&1
    rc=$?
    grep -E 'ERROR SUMMARY|FAILED|Invalid|========= ' "$work/san-$t.log" | head -n 60 >>"$out/sanitizer.txt"
    [ $rc -eq 0 ] || { errors=$((errors + 1)); echo "$t: exit $rc" >>"$work/san_failed"; }
  done
  if [ $errors -eq 0 ]; then
    stage sanitizer OK "memcheck clean on ops_cuda_test, layers_cuda_test, gpu_model_test"
  else
    stage sanitizer FAILED "$(tr '\n' ';' <"$work/san_failed")"
  fi
fi
exit $failed
