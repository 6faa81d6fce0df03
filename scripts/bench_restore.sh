#!/usr/bin/env bash
# The memory a ps task needs to restore a checkpoint: trains an MLP
# (784-HIDDEN-10, momentum, so the file holds the values and one slot) for 2
# steps with 1 ps task, then starts that task alone on the checkpoint and
# reads its peak resident memory (VmHWM) once it has restored:
#   restore: file_mb=F peak_rss_mb=P ratio=R
# R is the peak over the file's size; the shard's own state (values and
# slot) is about 1x of it.
#
#   scripts/bench_restore.sh [--hidden 32768]
set -euo pipefail
cd "$(dirname "$0")/.."
hidden=32768
while [ $# -gt 0 ]; do
  case "$1" in
    --hidden) hidden="$2"; shift 2 ;;
    *) echo "bench_restore.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
scripts/setup.sh >/dev/null
work=$(mktemp -d /tmp/psrt_bench_restore.XXXXXX)
ps_pid=""
trap '[ -n "$ps_pid" ] && kill "$ps_pid" 2>/dev/null; rm -rf "$work"' EXIT
mkdir -p "$work/ckpt"
scripts/make_cluster_spec.sh --ps 1 --workers 1 --out "$work/cluster.json" >/dev/null
scripts/launch.sh --cluster_spec "$work/cluster.json" --logdir "$work/logs" \
  --ps_flags "--ps_stripes=1 --checkpoint_dir=$work/ckpt" -- --ps_stripes=1 --model=mlp \
  --hidden_units="$hidden" --train_steps=2 --optimizer=momentum --progress=log >/dev/null
file=$(ls "$work"/ckpt/model.ckpt-2.*.safetensors)
build/bin/psrt_ps --cluster_spec="$work/cluster.json" --job_name=ps --task_index=0 \
  --ps_stripes=1 --checkpoint_dir="$work/ckpt" >"$work/ps.log" 2>&1 &
ps_pid=$!
for _ in $(seq 1 300); do
  grep -q "restored checkpoint 2" "$work/ps.log" && break
  sleep 0.2
done
grep -q "restored checkpoint 2" "$work/ps.log" || { cat "$work/ps.log" >&2; exit 1; }
peak_kb=$(awk '/VmHWM/ {print $2}' "/proc/$ps_pid/status")
awk -v f="$(stat -c %s "$file")" -v p="$peak_kb" 'BEGIN {
  printf "restore: file_mb=%.0f peak_rss_mb=%.0f ratio=%.2f\n", f / 1e6, p * 1024 / 1e6, p * 1024 / f}'
