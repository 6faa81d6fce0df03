#!/usr/bin/env bash
# Ring allreduce bandwidth of psrt's workers (bench/allreduce_bench.cc, one
# process per worker on 127.0.0.1) beside PyTorch's torch.distributed gloo
# backend with the same number of processes and bytes
# (scripts/peers/torch_allreduce.py), measured in the same run, alternating
# --repeats times; per size, the medians:
#   allreduce: mb=S workers=W psrt_busbw=X gloo_busbw=Y ratio=R
# (bus bandwidth in MB/s: each worker's bytes sent, 2 (W - 1) / W of the
# buffer, over the time of one allreduce; each run is already the median of
# --runs runs of 10 allreduces).
#
#   scripts/bench_allreduce.sh [--workers "2 3"] [--sizes "1 13 100"]
#                              [--repeats 3] [--runs 5]
set -euo pipefail
cd "$(dirname "$0")/.."
workers="2" sizes="1 13 100" repeats=3 runs=5
while [ $# -gt 0 ]; do
  case "$1" in
    --workers) workers="$2"; shift 2 ;;
    --sizes) sizes="$2"; shift 2 ;;
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
    pids=()
    for ((r = 0; r < w; r++)); do
      build/bin/allreduce_bench --rank=$r --workers="$w" --sizes_mb="$csv" --runs="$runs" \
        >"$work/psrt-$r.out" 2>"$work/psrt-$r.log" &
      pids+=($!)
    done
    for pid in "${pids[@]}"; do
      wait "$pid" || { cat "$work"/psrt-*.log >&2; exit 1; }
    done
    cat "$work/psrt-0.out" >>"$work/psrt.out"
    "$venv/bin/python" scripts/peers/torch_allreduce.py --workers "$w" --sizes_mb "$csv" \
      --runs "$runs" >>"$work/gloo.out"
  done
  for s in $sizes; do
    field() { grep " mb=$s workers=$w " "$1" | sed 's/.*busbw_mb_per_s=\([0-9.]*\).*/\1/' | median; }
    psrt=$(field "$work/psrt.out") gloo=$(field "$work/gloo.out")
    awk -v s="$s" -v w="$w" -v p="$psrt" -v g="$gloo" 'BEGIN {
      printf "allreduce: mb=%s workers=%s psrt_busbw=%.0f gloo_busbw=%.0f ratio=%.2f\n", s, w, p, g, p / g}'
  done
  rm -f "$work/psrt.out" "$work/gloo.out"
done
