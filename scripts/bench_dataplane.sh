#!/usr/bin/env bash
# The data plane's own connections against UCX, one way, same sizes, in one
# run: bench/frame_bench (TCP on 127.0.0.1 and an abstract Unix socket)
# beside ucx_perftest's tag_bw over UCX's TCP and over its shared memory
# (UCX_TLS=posix,cma,self), alternating, each the median of its runs:
#   dataplane: size_mb=S psrt_tcp=A psrt_unix=B ucx_tcp=C ucx_shm=D (MB/s)
#
#   scripts/bench_dataplane.sh [--sizes "13 100"] [--runs 5]
#
# Installs Debian's ucx-utils (ucx_perftest) when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
sizes="13 100" runs=5
while [ $# -gt 0 ]; do
  case "$1" in
    --sizes) sizes="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    *) echo "bench_dataplane.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
scripts/setup.sh >/dev/null
if ! command -v ucx_perftest >/dev/null; then
  apt-get update -q >/dev/null && apt-get install -y -q ucx-utils >/dev/null
fi
bin=build/bin
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# ucx_perftest's tag_bw between a server and a client on 127.0.0.1; MB/s.
ucx() {  # TLS SIZE_BYTES
  local port=$((20000 + RANDOM % 20000)) out
  UCX_TLS="$1" ucx_perftest -p "$port" -t tag_bw -s "$2" -n 40 -w 5 >/dev/null 2>&1 &
  local server=$!
  sleep 0.5
  out="$(UCX_TLS="$1" ucx_perftest 127.0.0.1 -p "$port" -t tag_bw -s "$2" -n 40 -w 5 2>&1)"
  wait "$server" || true
  # The final line's overall bandwidth, which ucx_perftest counts in MiB/s:
  # as MB/s (10^6 bytes) like frame_bench.
  awk '/^Final:/ {printf "%.0f\n", $(NF-2) * 1.048576; exit}' <<<"$out"
}
for s in $sizes; do
  bytes=$((s * 1000000))
  a=() b=() c=() d=()
  for ((r = 0; r < runs; r++)); do
    a+=("$("$bin/frame_bench" --transport=tcp --mb="$s" --runs=1 --frames=40 | sed 's/.*mb_per_s=//')")
    c+=("$(ucx tcp "$bytes")")
    b+=("$("$bin/frame_bench" --transport=unix --mb="$s" --runs=1 --frames=40 | sed 's/.*mb_per_s=//')")
    d+=("$(ucx posix,cma,self "$bytes")")
  done
  echo "dataplane: size_mb=$s psrt_tcp=$(printf '%s\n' "${a[@]}" | median)" \
       "psrt_unix=$(printf '%s\n' "${b[@]}" | median)" \
       "ucx_tcp=$(printf '%s\n' "${c[@]}" | median)" \
       "ucx_shm=$(printf '%s\n' "${d[@]}" | median) (MB/s)"
done
