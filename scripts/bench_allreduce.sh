#!/usr/bin/env bash
# Allreduce mode against PyTorch, in the same run, alternating --repeats
# times; medians:
#  1. Ring allreduce bandwidth of psrt's workers (bench/allreduce_bench.cc,
#     one process per worker on 127.0.0.1) beside torch.distributed's gloo
#     backend with the same number of processes and bytes
#     (scripts/peers/torch_allreduce.py), per size and psrt transport
#     (the segments inside gRPC messages or over the data plane, each over
#     loopback TCP or the workers' Unix sockets: grpc-tcp, grpc-unix,
#     socket-tcp, socket-unix; gloo uses TCP):
#       allreduce: mb=S workers=W transport=T psrt_busbw=X gloo_busbw=Y ratio=R
#     (bus bandwidth in MB/s: each worker's bytes sent, 2 (W - 1) / W of the
#     buffer, over the time of one allreduce; each run is already the median
#     of --runs runs of 10 allreduces).
#  2. Training: an allreduce-mode psrt job of 2 workers (scripts/launch.sh,
#     1 thread each, batch 100 each, over the last of --transports) beside
#     PyTorch DDP (gloo) training the same model the same way
#     (scripts/peers/torch_ddp_train.py):
#       train_allreduce: model=M workers=2 transport=T psrt_eps=X ddp_eps=Y ratio=R
#     (examples/sec of the whole job; psrt's from the chief's progress
#     intervals, the first one, with start-up, left out).
#
#   scripts/bench_allreduce.sh [--workers "2 3"] [--sizes "1 13 100"]
#                              [--transports "grpc-tcp socket-tcp socket-unix"]
#                              [--train_models "lenet"]
#                              [--repeats 3] [--runs 5]
set -euo pipefail
cd "$(dirname "$0")/.."
workers="2" sizes="1 13 100" transports="grpc-tcp grpc-unix socket-tcp socket-unix"
train_models="lenet" repeats=3 runs=5
while [ $# -gt 0 ]; do
  case "$1" in
    --workers) workers="$2"; shift 2 ;;
    --sizes) sizes="$2"; shift 2 ;;
    --train_models) train_models="$2"; shift 2 ;;
    --transports) transports="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    *) echo "bench_allreduce.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
scripts/setup.sh >/dev/null
. scripts/peer_venv.sh
work=$(mktemp -d /tmp/psrt_bench_allreduce.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
csv=$(echo $sizes | tr ' ' ',')
for w in $workers; do
  for ((i = 0; i < repeats; i++)); do
    for t in $transports; do
      pids=()
      for ((r = 0; r < w; r++)); do
        build/bin/allreduce_bench --rank=$r --workers="$w" --sizes_mb="$csv" --runs="$runs" \
          --unix_socket="$(case "$t" in *-unix) echo true ;; *) echo false ;; esac)" \
          --data_plane="$(case "$t" in socket-*) echo true ;; *) echo false ;; esac)" \
          >"$work/psrt-$r.out" 2>"$work/psrt-$r.log" &
        pids+=($!)
      done
      for pid in "${pids[@]}"; do
        wait "$pid" || { cat "$work"/psrt-*.log >&2; exit 1; }
      done
      cat "$work/psrt-0.out" >>"$work/psrt.out"
    done
    "$venv/bin/python" scripts/peers/torch_allreduce.py --workers "$w" --sizes_mb "$csv" \
      --runs "$runs" >>"$work/gloo.out"
  done
  for t in $transports; do
    for s in $sizes; do
      busbw() { grep " mb=$s workers=$w " | sed 's/.*busbw_mb_per_s=\([0-9.]*\).*/\1/' | median; }
      psrt=$(grep "transport=$t " "$work/psrt.out" | busbw) gloo=$(busbw <"$work/gloo.out")
      awk -v s="$s" -v w="$w" -v t="$t" -v p="$psrt" -v g="$gloo" 'BEGIN {
        printf "allreduce: mb=%s workers=%s transport=%s psrt_busbw=%.0f gloo_busbw=%.0f ratio=%.2f\n", s, w, t, p, g, p / g}'
    done
  done
  rm -f "$work/psrt.out" "$work/gloo.out"
done
scripts/make_cluster_spec.sh --ps 0 --workers 2 --out "$work/ring.json"
transport=${transports##* }
for model in $train_models; do
  for ((i = 0; i < repeats; i++)); do
    scripts/launch.sh --cluster_spec "$work/ring.json" --logdir "$work/$model-$i" -- \
      --model="$model" --batch_size=100 --intra_op_threads=1 --sync_replicas \
      --train_steps=300 --log_every_steps=50 --progress=log --learning_rate=0.01 \
      --unix_socket="$(case "$transport" in *-unix) echo true ;; *) echo false ;; esac)" \
      --local_data_plane="$(case "$transport" in *-unix) echo true ;; *) echo false ;; esac)" \
      --tensor_transport="$(case "$transport" in socket-*) echo socket ;; *) echo grpc ;; esac)" \
      >/dev/null
    grep -o '([0-9.]* examples/sec' "$work/$model-$i/worker-0.log" | tr -d '(' |
      awk 'NR > 1 {print $1 * 2}' | median >>"$work/psrt-$model.out"
    "$venv/bin/python" scripts/peers/torch_ddp_train.py --model "$model" --workers 2 \
      --threads 1 --batch_size 100 | sed 's/.*examples_per_sec=//' >>"$work/ddp-$model.out"
  done
  psrt=$(median <"$work/psrt-$model.out") ddp=$(median <"$work/ddp-$model.out")
  awk -v m="$model" -v t="$transport" -v p="$psrt" -v d="$ddp" 'BEGIN {
    printf "train_allreduce: model=%s workers=2 transport=%s psrt_eps=%.1f ddp_eps=%.1f ratio=%.2f\n", m, t, p, d, p / d}'
done
