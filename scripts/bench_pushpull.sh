#!/usr/bin/env bash
# Push + pull bandwidth of psrt against the loopback TCP limit, measured in
# the same run. For each model size, ps count and stripe count it starts K
# psrt_ps processes of P stripes (--ps_stripes) on 127.0.0.1, runs
# bench/pushpull_bench against them (median of --runs runs), and prints
#   pushpull: model_mb=S shards=K stripes=P wire=W tensors=G transport=T device=cpu
#             mb_per_s=X tcp_mb_per_s=Y ratio_to_tcp=R minor_faults_per_round=F
# (wire: fp32, bf16 or fp16 (--wire_dtype), mb_per_s counting the model's float32
# bytes either way; tensors: grpc, or data_plane (--tensor_transport);
# transport: how the bench reaches the shards, loopback TCP (psrt_ps
# --local_data_plane=false) or their Unix sockets (psrt_ps --unix_socket for
# gRPC, the data plane's own by default); tcp_mb_per_s: one plain TCP socket pair on
# 127.0.0.1 moving the same bytes in the same run; faults: the client's, per
# push + pull round).
#
#   scripts/bench_pushpull.sh [--sizes "13 100"] [--shards "1 2"] [--runs 5]
#                             [--stripes "1 2 4"] [--transports "tcp unix"]
#                             [--wire_dtypes "fp32 bf16 fp16"]
#                             [--tensor_transports "grpc data_plane"]
set -euo pipefail
cd "$(dirname "$0")/.."
sizes="13 100" shard_counts="1 2" runs=5 transports="tcp unix" stripe_counts="1 2 4" wire_dtypes="fp32"
tensor_transports="grpc data_plane"
while [ $# -gt 0 ]; do
  case "$1" in
    --sizes) sizes="$2"; shift 2 ;;
    --shards) shard_counts="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --transports) transports="$2"; shift 2 ;;
    --stripes) stripe_counts="$2"; shift 2 ;;
    --wire_dtypes) wire_dtypes="$2"; shift 2 ;;
    --tensor_transports) tensor_transports="$2"; shift 2 ;;
    *) echo "bench_pushpull.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
scripts/setup.sh >/dev/null
bin=build/bin
work=$(mktemp -d /tmp/psrt_bench.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
for k in $shard_counts; do
  for s in $sizes; do
   for transport in $transports; do
   for p in $stripe_counts; do
   for wire in $wire_dtypes; do
   for tensors in $tensor_transports; do
    "$bin/psrtctl" make_spec --ps="$k" --workers=1 --out="$work/cluster.json"
    pids=()
    unix=$([ "$transport" = unix ] && echo true || echo false)
    for ((i = 0; i < k; i++)); do
      "$bin/psrt_ps" --cluster_spec="$work/cluster.json" --job_name=ps --task_index=$i \
        --ps_stripes="$p" --unix_socket="$unix" --local_data_plane="$unix" \
        --tensor_transport="$tensors" >"$work/ps-$i.log" 2>&1 &
      pids+=($!)
    done
    "$bin/pushpull_bench" --cluster_spec="$work/cluster.json" --model_mb="$s" \
      --runs="$runs" --ps_stripes="$p" --wire_dtype="$wire" --tensor_transport="$tensors" --unix_socket="$unix" \
      2>"$work/bench.log" | sed "s/ device=/ transport=$transport device=/" ||
      { cat "$work/bench.log" >&2; exit 1; }
    wait "${pids[@]}"
   done
   done
   done
   done
  done
done
