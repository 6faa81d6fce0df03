#!/usr/bin/env bash
# Where a synchronous training step's time goes, 1 ps + 2 workers (or
# --workers W) on 127.0.0.1, beside the compute bound of the same workers
# measured in the same run (build/bin/step_bench: forward and backward alone, no ps):
#   step: model=M compute_ms=C exposed_comm_ms=E wait_ms=W
#   step_bound: model=M job_eps=X bound_eps=Y ratio=R
# compute, exposed communication (push + pull - waiting) and waiting (for
# the other worker and the update: the pulls' waited_us) are per step, the
# median of the chief's log intervals after the first. job_eps is the
# examples/sec of all workers together; bound_eps is W times step_bench's
# examples/sec with each worker's threads.
#
#   scripts/bench_step.sh [--models "lenet"] [--threads 1] [--steps 600] [--workers 2]
#                         [--transport local|tcp|unix] [--stripes 2] [--wire fp32|bf16|fp16]
#                         [--overlap true|false] [--placement prioritized]
#                         [--tensors auto|data_plane|grpc] [--peer tf] [--runs 1]
# --peer tf: the same job on TensorFlow's own parameter servers in the same
# run (scripts/peers/tf_ps_train.py: 1 ps + W workers, SyncReplicasOptimizer,
# the same LeNet, batch, threads and steps; LeNet only), run after psrt's,
# beside TensorFlow's own compute bound (W times one TensorFlow process
# alone, tf_ps_train.py --local):
#   step_peer: model=lenet workers=W psrt_eps=X tf_ps_eps=Y ratio=R tf_bound_eps=Z tf_ratio_to_bound=Q
# --runs N: everything N times, psrt and its peer alternating; then the
# medians of the runs' ratios:
#   step_median: model=M runs=N bound_ratio=R [tf_ps_ratio=Q]
# (transport: local, psrt's defaults: pushes and pulls over the ps's Unix
# socket, gRPC over loopback TCP; tcp: everything over loopback TCP (psrt_ps
# --local_data_plane=false); unix: gRPC over a Unix socket too (--unix_socket);
# stripes: --ps_stripes of every task; wire, overlap and placement: the
# workers' --wire_dtype, --overlap_comm and --placement; tensors: every
# task's --tensor_transport, the data plane or gRPC).
set -euo pipefail
cd "$(dirname "$0")/.."
models="lenet" threads=1 steps=600 batch=100 transport=local stripes=2 wire=fp32
overlap=true placement=prioritized workers=2 tensors=auto peer="" runs=1
while [ $# -gt 0 ]; do
  case "$1" in
    --models) models="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --transport) transport="$2"; shift 2 ;;
    --stripes) stripes="$2"; shift 2 ;;
    --wire) wire="$2"; shift 2 ;;
    --overlap) overlap="$2"; shift 2 ;;
    --workers) workers="$2"; shift 2 ;;
    --placement) placement="$2"; shift 2 ;;
    --tensors) tensors="$2"; shift 2 ;;
    --peer) peer="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    *) echo "bench_step.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$peer" in
  "") ;;
  tf) [ "$models" = lenet ] || { echo "bench_step.sh: --peer tf runs LeNet only" >&2; exit 2; }
      . scripts/keras_venv.sh ;;  # $keras_venv: tensorflow-cpu
  *) echo "bench_step.sh: --peer must be tf" >&2; exit 2 ;;
esac
scripts/setup.sh >/dev/null
work=$(mktemp -d /tmp/psrt_bench_step.XXXXXX)
trap 'rm -rf "$work"' EXIT
. scripts/lib/step_log.sh  # median, step_log_field, step_log_job_eps
case "$transport" in
  local) ps_flags="" unix=false ;;
  tcp) ps_flags="--local_data_plane=false" unix=false ;;
  unix) ps_flags="--unix_socket" unix=true ;;
  *) echo "bench_step.sh: --transport must be local, tcp or unix" >&2; exit 2 ;;
esac
scripts/make_cluster_spec.sh --ps 1 --workers "$workers" --out "$work/cluster.json"
for model in $models; do
  bound_ratios="" peer_ratios=""
  for run in $(seq "$runs"); do
    every=$((steps / 6))
    rm -rf "${work:?}/$model"
    scripts/launch.sh --cluster_spec "$work/cluster.json" --logdir "$work/$model" \
      --ps_flags "$ps_flags --ps_stripes=$stripes --tensor_transport=$tensors" -- \
      --unix_socket="$unix" --tensor_transport="$tensors" \
      --ps_stripes="$stripes" --wire_dtype="$wire" --overlap_comm="$overlap" \
      --placement="$placement" \
      --model="$model" --sync_replicas --batch_size="$batch" --device=cpu \
      --intra_op_threads="$threads" --train_steps="$steps" --log_every_steps="$every" \
      --progress=log --learning_rate=0.01 >/dev/null
    log="$work/$model/worker-0.log"
    printf "step: model=%s workers=%s transport=%s tensors=%s stripes=%s wire=%s overlap=%s placement=%s compute_ms=%.2f exposed_comm_ms=%.2f wait_ms=%.2f\n" \
      "$model" "$workers" "$transport" "$tensors" "$stripes" "$wire" "$overlap" "$placement" \
      "$(step_log_field "$log" compute_ms)" "$(step_log_field "$log" exposed_comm_ms)" \
      "$(step_log_field "$log" wait_ms)"
    job_eps=$(step_log_job_eps "$log" "$workers")
    bound_eps=$(build/bin/step_bench --model="$model" --threads="$threads" \
                  --batch_size="$batch" 2>/dev/null | sed -n 's/.*wall_eps=\([0-9.]*\).*/\1/p')
    line=$(awk -v m="$model" -v j="$job_eps" -v b="$bound_eps" -v w="$workers" 'BEGIN {
      printf "step_bound: model=%s job_eps=%.0f bound_eps=%.0f ratio=%.2f", m, j, w * b, j / (w * b)}')
    echo "$line"
    bound_ratios+="${line##*ratio=} "
    if [ "$peer" = tf ]; then
      peer_line=$("$keras_venv/bin/python" scripts/peers/tf_ps_train.py --workers "$workers" \
                    --steps "$steps" --batch_size "$batch" --threads "$threads" 2>/dev/null |
                  grep '^tf_ps:') || {
        echo "bench_step.sh: the TensorFlow peer printed no tf_ps: line (run" \
             "scripts/peers/tf_ps_train.py --verbose by hand to see why)" >&2
        exit 1
      }
      tf_eps=$(echo "$peer_line" | sed -n 's/.*job_eps=\([0-9.]*\).*/\1/p')
      tf_version=$(echo "$peer_line" | sed -n 's/.* tf=\([^ ]*\).*/\1/p')
      tf_local=$("$keras_venv/bin/python" scripts/peers/tf_ps_train.py --local --steps 200 \
                   --batch_size "$batch" --threads "$threads" 2>/dev/null |
                 sed -n 's/^tf_local:.*examples_per_sec=\([0-9.]*\).*/\1/p')
      line=$(awk -v m="$model" -v j="$job_eps" -v t="$tf_eps" -v w="$workers" -v v="$tf_version" \
                 -v b="$tf_local" 'BEGIN {
        printf "step_peer: model=%s workers=%s psrt_eps=%.0f tf_ps_eps=%.0f ratio=%.2f tf_bound_eps=%.0f tf_ratio_to_bound=%.2f tf=%s",
               m, w, j, t, j / t, w * b, t / (w * b), v}')
      echo "$line"
      peer_ratios+="$(echo "$line" | sed -n 's/.* ratio=\([0-9.]*\).*/\1/p') "
    fi
  done
  printf "step_median: model=%s runs=%s bound_ratio=%s" "$model" "$runs" \
    "$(echo "$bound_ratios" | tr ' ' '\n' | median)"
  [ -z "$peer_ratios" ] || printf " tf_ps_ratio=%s" "$(echo "$peer_ratios" | tr ' ' '\n' | median)"
  echo
done
