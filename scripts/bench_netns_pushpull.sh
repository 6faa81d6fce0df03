#!/usr/bin/env bash
# Push + pull over a link of a given speed: a ps in one network namespace,
# bench/pushpull_bench in another, joined by a veth pair shaped with tc tbf
# both ways (a two-host link on one machine), for tensors over gRPC and
# over the data plane, alternating:
#   netns_pushpull: link_gbit=L model_mb=S tensors=T mb_per_s=X link_mb_per_s=Y ratio=R
# (mb_per_s counts the model's fp32 bytes both ways, median of --runs runs;
# ratio: of the link's rate, which a push then a pull, one after the other,
# can at most reach).
#
#   sudo scripts/bench_netns_pushpull.sh [--gbits "2 10 25"] [--sizes "13"] [--runs 3]
#
# Needs root (ip netns, tc). Every namespace goes on exit; no traffic leaves
# them.
set -euo pipefail
cd "$(dirname "$0")/.."
gbits="2 10 25" sizes="13" runs=3 stripes=2
while [ $# -gt 0 ]; do
  case "$1" in
    --gbits) gbits="$2"; shift 2 ;;
    --sizes) sizes="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    *) echo "bench_netns_pushpull.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ "$(id -u)" -ne 0 ]; then
  echo "bench_netns_pushpull.sh: needs root (network namespaces)" >&2
  exit 2
fi
scripts/setup.sh >/dev/null
bin="$PWD/build/bin"
tag="psrtbench$$"
work="$(mktemp -d /tmp/psrt_netns_bench.XXXXXX)"
ps_pid=""
cleanup() {
  [ -n "$ps_pid" ] && kill "$ps_pid" 2>/dev/null && wait "$ps_pid" 2>/dev/null
  ip netns del "$tag-ps" 2>/dev/null || true
  ip netns del "$tag-w" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add "$tag-ps"
ip netns add "$tag-w"
ip link add eth0 netns "$tag-ps" type veth peer name eth0 netns "$tag-w"
for ns in ps w; do
  ip -n "$tag-$ns" link set dev lo up
done
ip -n "$tag-ps" addr add 10.201.0.1/24 dev eth0
ip -n "$tag-w" addr add 10.201.0.2/24 dev eth0
ip -n "$tag-ps" link set dev eth0 up
ip -n "$tag-w" link set dev eth0 up
echo '{"ps": ["10.201.0.1:2222"], "worker": ["10.201.0.2:2222"]}' >"$work/cluster.json"

for gbit in $gbits; do
  # tbf at the link's rate each way; a burst of 1 ms of it.
  for ns in ps w; do
    ip netns exec "$tag-$ns" tc qdisc replace dev eth0 root tbf rate "${gbit}gbit" \
      burst "$((gbit * 125000))" latency 20ms
  done
  for size in $sizes; do
    for tensors in grpc data_plane; do
      ip netns exec "$tag-ps" "$bin/psrt_ps" --cluster_spec="$work/cluster.json" --job_name=ps \
        --task_index=0 --ps_stripes="$stripes" --tensor_transport="$tensors" \
        >"$work/ps.log" 2>&1 &
      ps_pid=$!
      line="$(ip netns exec "$tag-w" "$bin/pushpull_bench" --cluster_spec="$work/cluster.json" \
        --model_mb="$size" --runs="$runs" --ps_stripes="$stripes" \
        --tensor_transport="$tensors" 2>"$work/bench.log")" ||
        { cat "$work/bench.log" "$work/ps.log" >&2; exit 1; }
      wait "$ps_pid" || true
      ps_pid=""
      x="$(grep -o ' mb_per_s=[0-9]*' <<<"$line" | cut -d= -f2)"
      link=$((gbit * 125))
      echo "netns_pushpull: link_gbit=$gbit model_mb=$size tensors=$tensors mb_per_s=$x" \
           "link_mb_per_s=$link ratio=$(awk -v x="$x" -v l="$link" 'BEGIN {printf "%.2f", x / l}')"
    done
  done
done
