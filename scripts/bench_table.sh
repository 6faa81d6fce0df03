#!/usr/bin/env bash
# A ps shard's sparse pull and push rows/s (bench/table_bench.cc) beside a
# plain gather of the same rows from an array and memcpy's bandwidth, for a
# uniform and a Zipf-like (s = 1.05, click logs' shape) draw of ids:
#   cpu: model="..." cpus=N avx512f=yes|no
#   table_bench: rows=N dim=D optimizer=O zipf=Z batch=B lookup_rows_per_sec=X
#     apply_rows_per_sec=Y gather_rows_per_sec=G lookup_vs_gather=R ...
#
#   scripts/bench_table.sh [--rows 1000000,10000000] [--dim 16] [--optimizer adagrad] [--runs 5]
#
# PSRT_BIN_DIR=DIR takes the binary from DIR. Needs about 3.5x the table's
# payload in memory (the table, the peer's array of the same bytes and its
# memcpy target; 10M rows of dimension 16 with Adagrad: about 5 GB).
set -euo pipefail
cd "$(dirname "$0")/.."
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rows|--dim|--optimizer|--runs|--batch) args+=("$1=$2"); shift 2 ;;
    *) echo "bench_table.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "${PSRT_BIN_DIR:-}" ] || scripts/setup.sh >/dev/null
bin="${PSRT_BIN_DIR:-build/bin}"
echo "cpu: model=\"$(lscpu | sed -n 's/^Model name: *//p' | head -1)\" cpus=$(nproc)" \
  "avx512f=$(grep -q avx512f /proc/cpuinfo && echo yes || echo no)"
for zipf in 0 1.05; do
  "$bin/table_bench" "${args[@]}" --zipf="$zipf"
done
