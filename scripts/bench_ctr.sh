#!/usr/bin/env bash
# CTR training (design.md, "Sparse embedding tables" and "Performance";
# docs/sparse.md): psrt's dlrm and wide_deep on 127.0.0.1 beside PyTorch
# training the same models (scripts/peers/torch_ctr.py) on the same
# Criteo-format files with the same threads, batch, optimizer and one pass
# over the training file, all in one run on one machine, PyTorch from
# psrt's very initial values (the dense variables of a step-0 psrt
# checkpoint, the rows as psrt's tables make them). Lines:
#   cpu: model="..." cpus=N avx2=yes|no avx512f=yes|no
#   ctr_data: train=FILE rows=N test=FILE rows=N planted_test_auc=A planted_test_logloss=L
#   ctr_run: model=M layout=L run=I samples_per_sec=X test_auc=A test_logloss=L ...
#   ctr: model=M layout=1ps1w|2ps2w|torch samples_per_sec=X test_auc=A test_logloss=L
#   ctr_init: model=M psrt_initial_auc=A torch_initial_auc=A psrt_initial_logloss=L torch_initial_logloss=L
#   ctr_ratio: model=M layout=1ps1w|2ps2w speed_vs_torch=R auc_minus_torch=D
#   ctr_balance: model=M layout=L run=I rows_per_ps=a,b rows_max_over_mean=X
#                mb_per_ps=c,d bytes_max_over_mean=Y   (layouts of 2 ps tasks)
# A ctr line holds the medians of its configuration's --runs runs (each
# measure on its own); a ratio line compares those medians with torch's.
# planted_test_auc is the best AUC any model can reach on the test rows
# (the AUC of the true click probabilities: worker/input/synthetic_criteo.h).
#
# Layouts: 1ps1w (1 ps task, 1 worker), 2ps2w (2 ps tasks, 2 workers, the
# rows hashed over both shards), both --sync_replicas (with one worker,
# the same sequence of updates as PyTorch's); 2ps2w_hybrid (--sync_replicas
# --sparse_async: dense synchronous, rows applied on arrival),
# 2ps2w_ring (the hybrid with --dense_allreduce: the dense part averaged by
# the workers' ring, the ps tasks holding the tables alone) and
# 2ps2w_async (asynchronous, each push a global step), every worker with
# --intra_op_threads=THREADS: 2ps2w's workers use twice PyTorch's threads.
# Each worker reads its share of the lines (every W-th), and
# --train_steps = epochs * rows / (batch * W) global steps (each averaging
# W batches), so that every layout sees each training line once per epoch,
# as PyTorch does with epochs * rows / batch steps of one batch.
#
# Throughput. psrt's worker logs, every --log_every_steps local steps,
# "(X examples/sec" = batch * the interval's steps / its seconds: that
# worker's own examples. A worker's rate is the median of its intervals
# after the first (the first holds the start-up: connecting, first pulls,
# the tables' first rows, allocations; scripts/lib/step_log.sh reads it
# alike); the job's is the sum over its workers (in sync mode they run in
# lockstep, so it is W x the chief's, as step_log_job_eps; the sum stays
# right when they do not). Not global_step * batch / the launcher's
# seconds: those include starting the processes, connecting and the final
# evaluation of the test file; that figure is printed as a cross-check
# (wall_samples_per_sec: the examples of every worker's "finished: L local
# steps" line over the launcher's seconds) and used when a log has fewer
# than two intervals. PyTorch's samples_per_sec is measured the same way
# (the median of its intervals after the first), with the files parsed
# into memory beforehand and not timed; psrt's workers parse theirs as
# they train (on input threads), which its figure includes.
#
#   scripts/bench_ctr.sh [--runs 3] [--threads 2] [--batch_size 256] [--epochs 1]
#                        [--rows 500000] [--test_rows 50000] [--data_dir DIR]
#                        [--learning_rate 0.05] [--sparse_learning_rate 0.05]
#                        [--embedding_dim 16] [--bottom_mlp 64] [--top_mlp 64,32]
#                        [--hidden_units 256,128] [--log_dir DIR] [--run_limit_secs 1800]
#   MODELS="dlrm" scripts/bench_ctr.sh      (default: dlrm wide_deep)
#   LAYOUTS="2ps2w 2ps2w_hybrid 2ps2w_ring 2ps2w_async" scripts/bench_ctr.sh
#                                           (default: 1ps1w 2ps2w torch)
#
# The data: build/bin/psrt_make_criteo writes train (seed 1) and test (seed
# 2) rows of one planted model (--model_seed 1) into --data_dir (default
# ~/.cache/psrt-bench/criteo), reused when present. The peer is current
# PyTorch from PyPI in a virtual environment outside the repository
# (scripts/peer_venv.sh). PSRT_BIN_DIR=DIR takes the binaries from DIR;
# otherwise scripts/setup.sh builds them first. A run that fails prints
# `ctr_run: ... FAILED: reason`, keeps the logs, and the script goes on; it
# exits 1 at the end if anything failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
. scripts/lib/step_log.sh  # median
models="${MODELS:-dlrm wide_deep}"
layouts="${LAYOUTS:-1ps1w 2ps2w torch}"
runs=3 threads=2 batch=256 epochs=1 rows=500000 test_rows=50000
data_dir="${XDG_CACHE_HOME:-$HOME/.cache}/psrt-bench/criteo"
lr=0.05 sparse_lr=0.05 dim=16 bottom_mlp=64 top_mlp=64,32 hidden_units=256,128
log_dir="" run_limit=1800
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --batch_size) batch="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --rows) rows="$2"; shift 2 ;;
    --test_rows) test_rows="$2"; shift 2 ;;
    --data_dir) data_dir="$2"; shift 2 ;;
    --learning_rate) lr="$2"; shift 2 ;;
    --sparse_learning_rate) sparse_lr="$2"; shift 2 ;;
    --embedding_dim) dim="$2"; shift 2 ;;
    --bottom_mlp) bottom_mlp="$2"; shift 2 ;;
    --top_mlp) top_mlp="$2"; shift 2 ;;
    --hidden_units) hidden_units="$2"; shift 2 ;;
    --log_dir) log_dir="$2"; shift 2 ;;
    --run_limit_secs) run_limit="$2"; shift 2 ;;
    *) echo "bench_ctr.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
for v in runs threads batch epochs rows test_rows dim run_limit; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "bench_ctr.sh: $v=${!v}: want a positive integer" >&2; exit 2; }
done
for m in $models; do
  case "$m" in dlrm|wide_deep) ;; *) echo "bench_ctr.sh: unknown model $m" >&2; exit 2 ;; esac
done
for l in $layouts; do
  case "$l" in 1ps1w|2ps2w|2ps2w_hybrid|2ps2w_ring|2ps2w_async|torch) ;;
    *) echo "bench_ctr.sh: unknown layout $l" >&2; exit 2 ;;
  esac
done

cpu_model="$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)"
cpu_flags=" $(lscpu 2>/dev/null | sed -n 's/^Flags: *//p') "
[ "$cpu_flags" != "  " ] || cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has_flag() { [[ "$cpu_flags" == *" $1 "* ]] && echo yes || echo no; }
echo "cpu: model=\"${cpu_model:-unknown}\" cpus=$(nproc) avx2=$(has_flag avx2) avx512f=$(has_flag avx512f)"

if [ -z "${PSRT_BIN_DIR:-}" ]; then
  scripts/setup.sh >/dev/null || { echo "bench_ctr.sh: scripts/setup.sh failed" >&2; exit 1; }
fi
bin="${PSRT_BIN_DIR:-build/bin}"
bin=$(cd "$bin" && pwd) || { echo "bench_ctr.sh: no folder $bin" >&2; exit 1; }
export PSRT_BIN_DIR="$bin"  # For launch.sh and make_cluster_spec.sh.
. scripts/peer_venv.sh  # $venv

if [ -n "$log_dir" ]; then
  work="$log_dir"
  mkdir -p "$work"
else
  work=$(mktemp -d /tmp/psrt_bench_ctr.XXXXXX)
fi
failed=0
# The logs stay when asked for (--log_dir) or when something failed.
trap '[ -n "$log_dir" ] || [ "$failed" -ne 0 ] || rm -rf "$work"' EXIT

# make_data SEED ROWS: the file of ROWS rows of the planted model with row
# seed SEED, written once into data_dir; its generator line beside it (.info).
make_data() {
  local f="$data_dir/criteo-model1-seed$1-rows$2.tsv"
  if [ ! -s "$f" ] || [ ! -s "$f.info" ]; then
    mkdir -p "$data_dir"
    "$bin/psrt_make_criteo" --out="$f.partial" --rows="$2" --seed="$1" --model_seed=1 \
      >"$f.info.partial" || { echo "bench_ctr.sh: psrt_make_criteo failed" >&2; exit 1; }
    mv "$f.partial" "$f" && mv "$f.info.partial" "$f.info"
  fi
  echo "$f"
}
# info_field FILE NAME: NAME's value in FILE's generator line.
info_field() { grep -o "$2=[^ ]*" "$1.info" | head -1 | cut -d= -f2; }
train=$(make_data 1 "$rows") || exit 1
test=$(make_data 2 "$test_rows") || exit 1
echo "ctr_data: train=$train rows=$(info_field "$train" rows) test=$test" \
  "rows=$(info_field "$test" rows) planted_test_auc=$(info_field "$test" planted_auc)" \
  "planted_test_logloss=$(info_field "$test" planted_logloss)"

scripts/make_cluster_spec.sh --ps 1 --workers 1 --out "$work/1ps1w.json" || exit 1
scripts/make_cluster_spec.sh --ps 2 --workers 2 --out "$work/2ps2w.json" || exit 1

# Each successful run appends "MODEL LAYOUT SAMPLES_PER_SEC AUC LOGLOSS".
results="$work/results"
: >"$results"
# fail MODEL LAYOUT RUN REASON...
fail() {
  echo "ctr_run: model=$1 layout=$2 run=$3 FAILED: ${*:4}"
  failed=1
}
field() { grep -o "$1=[^ ]*" | tail -1 | cut -d= -f2; }

# model_flags MODEL: the flags psrt's worker and the peer share, as
# --flag=value.
model_flags() {
  local flags=(--model="$1" --embedding_dim="$dim" --batch_size="$batch"
               --learning_rate="$lr" --sparse_learning_rate="$sparse_lr")
  if [ "$1" = dlrm ]; then
    flags+=(--bottom_mlp="$bottom_mlp" --top_mlp="$top_mlp")
  else
    flags+=(--hidden_units="$hidden_units")
  fi
  printf '%s\n' "${flags[@]}"
}

# run_psrt MODEL LAYOUT RUN
run_psrt() {
  local model="$1" layout="$2" run="$3" workers spec mode
  case "$layout" in
    1ps1w) workers=1 spec=1ps1w mode=(--sync_replicas) ;;
    2ps2w) workers=2 spec=2ps2w mode=(--sync_replicas) ;;
    2ps2w_hybrid) workers=2 spec=2ps2w mode=(--sync_replicas --sparse_async) ;;
    2ps2w_ring) workers=2 spec=2ps2w mode=(--sync_replicas --sparse_async --dense_allreduce) ;;
    2ps2w_async) workers=2 spec=2ps2w mode=() ;;
  esac
  # A global step averages W batches in sync mode and is one batch in async.
  local steps=$((epochs * rows / (batch * workers)))
  [ "${#mode[@]}" -gt 0 ] || steps=$((epochs * rows / batch))
  local every=$((steps / 10 > 0 ? steps / 10 : 1))
  local dir="$work/$model-$layout-$run"
  local flags
  mapfile -t flags < <(model_flags "$model")
  local start end code
  start=$(date +%s.%N)
  timeout "$run_limit" scripts/launch.sh --cluster_spec "$work/$spec.json" --logdir "$dir" -- \
    "${flags[@]}" --data_format=criteo --train_data="$train" --test_data="$test" \
    --optimizer=adagrad --sparse_optimizer=adagrad "${mode[@]}" \
    --intra_op_threads="$threads" --train_steps="$steps" --log_every_steps="$every" \
    --progress=log >"$dir.out" 2>&1
  code=$?
  end=$(date +%s.%N)
  if [ "$code" -ne 0 ]; then
    fail "$model" "$layout" "$run" "launch.sh exited $code; worker 0's log ends:" \
      "$(grep -v '^ *$' "$dir/worker-0.log" 2>/dev/null | tail -1) (logs in $dir, $dir.out)"
    return
  fi
  local final
  final=$(grep '^final:' "$dir/worker-0.log" | tail -1)
  local auc logloss
  auc=$(field test_auc <<<"$final") logloss=$(field test_logloss <<<"$final")
  if [ -z "$auc" ] || [ -z "$logloss" ]; then
    fail "$model" "$layout" "$run" "no 'final: ... test_auc=A test_logloss=L' in $dir/worker-0.log"
    return
  fi
  # Every worker's median interval rate (after the first), summed; the
  # examples every worker trained on, for the wall-clock figure.
  local sps=0 examples=0 w log rate local_steps
  for ((w = 0; w < workers; w++)); do
    log="$dir/worker-$w.log"
    rate=$(grep -o '([0-9.]* examples/sec' "$log" | tr -d '(' | awk 'NR > 1 {print $1}' | median)
    local_steps=$(grep -o 'finished: [0-9]* local steps' "$log" | tail -1 | awk '{print $2}')
    examples=$((examples + ${local_steps:-0} * batch))
    if [ -z "$rate" ]; then sps=""; fi
    [ -z "$sps" ] || sps=$(awk -v a="$sps" -v b="$rate" 'BEGIN {print a + b}')
  done
  local wall_sps
  wall_sps=$(awk -v e="$examples" -v s="$start" -v t="$end" 'BEGIN {printf "%.1f", e / (t - s)}')
  [ -n "$sps" ] || sps="$wall_sps"  # Too few intervals for a median.
  if [ "$examples" -eq 0 ]; then
    fail "$model" "$layout" "$run" "no worker logged 'finished: L local steps' (logs in $dir)"
    return
  fi
  sps=$(awk -v x="$sps" 'BEGIN {printf "%.1f", x}')
  echo "ctr_run: model=$model layout=$layout run=$run samples_per_sec=$sps test_auc=$auc" \
    "test_logloss=$logloss wall_samples_per_sec=$wall_sps examples=$examples" \
    "global_step=$(field global_step <<<"$final")"
  echo "$model $layout $sps $auc $logloss" >>"$results"
  # Balance over the ps tasks: each one's last line holds what it held and
  # moved (rows of every table; gradient bytes in, parameter bytes out).
  if [ "$spec" != 1ps1w ]; then
    cat "$dir"/ps-*.log | grep -o 'table_rows=[0-9]* pushed_bytes=[0-9]* pulled_bytes=[0-9]*' |
      tr '=' ' ' | awk -v m="$model" -v l="$layout" -v r="$run" '
        { rows[NR] = $2; bytes[NR] = $4 + $6; sr += $2; sb += $4 + $6 }
        END {
          if (NR == 0 || sr == 0 || sb == 0) exit
          for (i = 1; i <= NR; i++) { if (rows[i] > mr) mr = rows[i]; if (bytes[i] > mb) mb = bytes[i]
            rl = rl (i > 1 ? "," : "") rows[i]; bl = bl (i > 1 ? "," : "") sprintf("%.0f", bytes[i] / 1e6) }
          printf "ctr_balance: model=%s layout=%s run=%s rows_per_ps=%s rows_max_over_mean=%.3f " \
                 "mb_per_ps=%s bytes_max_over_mean=%.3f\n", m, l, r, rl, mr / (sr / NR), bl, mb / (sb / NR)
        }'
  fi
}

# psrt_initial MODEL: psrt's initial dense values of MODEL (its step-0
# checkpoint, exported) into $work/MODEL-init.safetensors, for PyTorch to
# start from (torch_ctr.py --init_from, which makes the rows as psrt's
# tables do); psrt's step-0 evaluation into $work/MODEL-init.final.
psrt_initial() {
  local model="$1" flags
  mapfile -t flags < <(model_flags "$model")
  rm -rf "$work/$model-init"
  timeout "$run_limit" scripts/launch.sh --cluster_spec "$work/1ps1w.json" \
    --logdir "$work/$model-init/logs" --checkpoint_dir "$work/$model-init/ckpt" -- \
    "${flags[@]}" --data_format=criteo --train_data="$train" --test_data="$test" \
    --optimizer=adagrad --sparse_optimizer=adagrad --sync_replicas --train_steps=0 \
    >"$work/$model-init.out" 2>&1 &&
    scripts/export_checkpoint.sh --checkpoint_dir="$work/$model-init/ckpt" \
      --out="$work/$model-init.safetensors" >>"$work/$model-init.out" 2>&1 &&
    grep '^final:' "$work/$model-init/logs/worker-0.log" >"$work/$model-init.final"
}

# run_torch MODEL RUN: from psrt's initial values.
run_torch() {
  local model="$1" run="$2"
  local steps=$((epochs * rows / batch))
  local every=$((steps / 10 > 0 ? steps / 10 : 1))
  local out="$work/$model-torch-$run.out" flags line
  if [ ! -s "$work/$model-init.safetensors" ] && ! psrt_initial "$model"; then
    fail "$model" torch "$run" "psrt's initial values: see $work/$model-init.out"
    return
  fi
  mapfile -t flags < <(model_flags "$model")
  # argparse takes --flag=value as the shell passes it.
  timeout "$run_limit" "$venv/bin/python" scripts/peers/torch_ctr.py "${flags[@]}" \
    --train_data="$train" --test_data="$test" --threads="$threads" --steps="$steps" \
    --log_every_steps="$every" --init_from="$work/$model-init.safetensors" \
    --eval_initial >"$out" 2>&1
  local code=$?
  line=$(grep '^torch_ctr: model=' "$out" | tail -1)
  if [ "$code" -ne 0 ] || [ -z "$line" ]; then
    fail "$model" torch "$run" "torch_ctr.py exited $code (output in $out)"
    return
  fi
  # The same start on both sides: the test set's AUC and logloss before
  # training, psrt's and PyTorch's.
  if [ "$run" -eq 1 ]; then
    local initial
    initial=$(grep '^torch_ctr: initial' "$out" | tail -1)
    echo "ctr_init: model=$model psrt_initial_auc=$(field test_auc <"$work/$model-init.final")" \
      "torch_initial_auc=$(field test_auc <<<"$initial")" \
      "psrt_initial_logloss=$(field test_logloss <"$work/$model-init.final")" \
      "torch_initial_logloss=$(field test_logloss <<<"$initial")"
  fi
  local sps auc logloss
  sps=$(field samples_per_sec <<<"$line") auc=$(field test_auc <<<"$line")
  logloss=$(field test_logloss <<<"$line")
  echo "ctr_run: model=$model layout=torch run=$run samples_per_sec=$sps test_auc=$auc" \
    "test_logloss=$logloss train_seconds=$(field train_seconds <<<"$line")" \
    "torch=$(field torch <<<"$line")"
  echo "$model torch $sps $auc $logloss" >>"$results"
}

# column MODEL LAYOUT N: the median of column N of the configuration's runs.
column() { awk -v m="$1" -v l="$2" -v c="$3" '$1 == m && $2 == l {print $c}' "$results" | median; }

for model in $models; do
  for layout in $layouts; do
    for ((run = 1; run <= runs; run++)); do
      if [ "$layout" = torch ]; then
        run_torch "$model" "$run"
      else
        run_psrt "$model" "$layout" "$run"
      fi
    done
    sps=$(column "$model" "$layout" 3)
    if [ -z "$sps" ]; then
      echo "ctr: model=$model layout=$layout FAILED: no run succeeded"
      continue
    fi
    printf 'ctr: model=%s layout=%s samples_per_sec=%.1f test_auc=%.4f test_logloss=%.4f\n' \
      "$model" "$layout" "$sps" "$(column "$model" "$layout" 4)" "$(column "$model" "$layout" 5)"
  done
  torch_sps=$(column "$model" torch 3) torch_auc=$(column "$model" torch 4)
  for layout in $layouts; do
    [ "$layout" != torch ] || continue
    sps=$(column "$model" "$layout" 3) auc=$(column "$model" "$layout" 4)
    if [ -z "$sps" ] || [ -z "$torch_sps" ]; then continue; fi
    awk -v m="$model" -v l="$layout" -v s="$sps" -v ts="$torch_sps" -v a="$auc" -v ta="$torch_auc" \
      'BEGIN {printf "ctr_ratio: model=%s layout=%s speed_vs_torch=%.2f auc_minus_torch=%+.4f\n",
              m, l, s / ts, a - ta}'
  done
done
[ "$failed" -eq 0 ] || echo "bench_ctr.sh: some runs failed; logs in $work" >&2
exit "$failed"
