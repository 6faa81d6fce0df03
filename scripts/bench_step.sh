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
#                         [--transport tcp|unix] [--stripes 2] [--wire fp32|bf16|fp16]
#                         [--overlap true|false] [--placement contiguous]
#                         [--tensors auto|data_plane|grpc]
# (unix: the workers reach the ps over its Unix socket, --unix_socket;
# stripes: --ps_stripes of every task; wire, overlap and placement: the
# workers' --wire_dtype, --overlap_comm and --placement; tensors: every
# task's --tensor_transport, the data plane or gRPC).
set -euo pipefail
cd "$(dirname "$0")/.."
models="lenet" threads=1 steps=600 batch=100 transport=tcp stripes=2 wire=fp32
overlap=true placement=contiguous workers=2 tensors=auto
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
    *) echo "bench_step.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
scripts/setup.sh >/dev/null
work=$(mktemp -d /tmp/psrt_bench_step.XXXXXX)
trap 'rm -rf "$work"' EXIT
. scripts/lib/step_log.sh  # median, step_log_field, step_log_job_eps
case "$transport" in
  tcp) ps_flags="" unix=false ;;
  unix) ps_flags="--unix_socket" unix=true ;;
  *) echo "bench_step.sh: --transport must be tcp or unix" >&2; exit 2 ;;
esac
scripts/make_cluster_spec.sh --ps 1 --workers "$workers" --out "$work/cluster.json"
for model in $models; do
  every=$((steps / 6))
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
  awk -v m="$model" -v j="$job_eps" -v b="$bound_eps" -v w="$workers" 'BEGIN {
    printf "step_bound: model=%s job_eps=%.0f bound_eps=%.0f ratio=%.2f\n", m, j, w * b, j / (w * b)}'
done
