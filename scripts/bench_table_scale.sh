#!/usr/bin/env bash
# An embedding table of tens of millions of rows on 2 ps tasks (design.md,
# "Sparse embedding tables": 20 million rows of dimension 16 with Adagrad
# must fit this machine, train, checkpoint and restore). Writes Criteo-format
# lines whose 26 categories are uniformly random 32-bit values (nearly every
# id new: 26 rows a line), trains DLRM one epoch through 2 ps + 1 worker with
# a checkpoint at the end, then starts the job again: the ps tasks restore
# the table and training goes on. With --resume_ps M the job resumes with M
# ps tasks instead, each restoring its part of the checkpoint of the first
# job's count (resharding). Lines:
#   cpu: ...
#   table_scale: phase=trained rows=N last_status: rows=R table_mib=M bytes_per_row=X ps_memory=... train_s=S peak_rss_mib=A,B
#   table_scale: phase=saved checkpoint_bytes=B
#   table_scale: phase=restored rows=N restore_s_per_ps=S,S resumed_at=STEP final="final: ..." peak_rss_mib=A,B
# (peak_rss_mib: each ps process's peak resident memory, VmHWM, in that run).
#
#   scripts/bench_table_scale.sh [--rows 20000000] [--ps 2] [--resume_ps M] [--dir DIR]
# PSRT_BIN_DIR=DIR takes the binaries from DIR. Needs about 40 bytes of
# disk per row for the data and 200 for the checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
rows=20000000
ps=2
resume_ps=""
dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rows) rows="$2"; shift 2 ;;
    --ps) ps="$2"; shift 2 ;;
    --resume_ps) resume_ps="$2"; shift 2 ;;
    --dir) dir="$2"; shift 2 ;;
    *) echo "bench_table_scale: unknown argument $1" >&2; exit 2 ;;
  esac
done
bin="${PSRT_BIN_DIR:-build/bin}"
[ -n "${PSRT_BIN_DIR:-}" ] || scripts/setup.sh >/dev/null
dir="${dir:-$(mktemp -d /tmp/psrt_table_scale.XXXXXX)}"
mkdir -p "$dir"
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p') cpus=$(nproc)" \
  "avx512f=$(grep -q avx512f /proc/cpuinfo && echo yes || echo no)" \
  "mem_gib=$(awk '/MemTotal/ {printf "%.0f", $2 / 1048576}' /proc/meminfo)"
lines=$(((rows + 25) / 26))
batch=1024
steps=$((lines / batch))
if [ ! -s "$dir/train.tsv" ]; then
  python3 - "$dir/train.tsv" "$lines" <<'PY'
import random, sys
path, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(7)
with open(path, "w") as out:
    for _ in range(n):
        cats = "\t".join("%08x" % rng.getrandbits(32) for _ in range(26))
        counts = "\t".join(str(rng.randrange(10)) for _ in range(13))
        out.write("%d\t%s\t%s\n" % (rng.random() < 0.3, counts, cats))
PY
  head -2000 "$dir/train.tsv" > "$dir/test.tsv"
fi
spec="$dir/cluster.json"
scripts/make_cluster_spec.sh --ps "$ps" --workers 1 --out "$spec"
resume_spec="$spec"
if [ -n "$resume_ps" ] && [ "$resume_ps" != "$ps" ]; then
  resume_spec="$dir/cluster_resume.json"
  scripts/make_cluster_spec.sh --ps "$resume_ps" --workers 1 --out "$resume_spec"
fi
flags=(--sync_replicas --model=dlrm --data_format=criteo --train_data="$dir/train.tsv"
       --test_data="$dir/test.tsv" --embedding_dim=16 --bottom_mlp=32 --top_mlp=32
       --optimizer=adagrad --learning_rate=0.05 --batch_size=$batch --log_every_steps=100
       --save_checkpoint_secs=100000 --keep_checkpoints=1)

# The ps tasks' rows and memory while the job of cluster spec $1 runs: the
# last psrtctl answer, and each ps process's peak resident memory so far
# (VmHWM, in MiB).
watch_status() {
  local pid peaks spec="$1"
  while sleep 1; do
    "$bin/psrtctl" status --cluster_spec="$spec" > "$dir/status.tmp" 2>/dev/null &&
      grep -q "table" "$dir/status.tmp" && mv "$dir/status.tmp" "$dir/status.txt"
    peaks=""
    # (A ps may exit between pgrep and awk: neither failure ends the loop.)
    for pid in $(pgrep -f -- "psrt_ps .*--cluster_spec=$spec" || true); do
      peaks="$peaks $(awk '/VmHWM/ {printf "%.0f", $2 / 1024}' "/proc/$pid/status" 2>/dev/null || true)"
    done
    [ -z "${peaks// /}" ] || echo "$peaks" > "$dir/peaks.txt"
  done
}
peaks() { tr -s ' ' < "$dir/peaks.txt" | sed 's/^ //; s/ $//; s/ /,/g'; }
table_mib() { awk '/ table /{for(i=1;i<=NF;i++) if($i ~ /^memory=/){sub("memory=","",$i); sub("MiB","",$i); s+=$i}} END{printf "%.0f", s}' "$1" 2>/dev/null || echo 0; }
# The rows the newest checkpoint holds (its shards' T/ids tensors' shapes).
checkpoint_rows() {
  python3 - "$dir"/ckpt/*.safetensors <<'PY'
import json, re, struct, sys
step = lambda path: int(re.search(r"model\.ckpt-(\d+)\.", path).group(1))
newest = max(step(p) for p in sys.argv[1:])
rows = 0
for path in (p for p in sys.argv[1:] if step(p) == newest):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    rows += sum(t["shape"][0] for name, t in header.items() if name.endswith("/ids"))
print(rows)
PY
}

rm -rf "$dir/ckpt" "$dir/status.txt" "$dir/peaks.txt"
watch_status "$spec" & watcher=$!
start=$(date +%s.%N)
scripts/launch.sh --cluster_spec "$spec" --logdir "$dir/train" --checkpoint_dir "$dir/ckpt" -- \
  "${flags[@]}" --train_steps=$steps > "$dir/train.out" 2>&1
end=$(date +%s.%N)
kill $watcher 2>/dev/null || true
wait $watcher 2>/dev/null || true
touch "$dir/status.txt"
status_rows=$(awk '/ table /{for(i=1;i<=NF;i++) if($i ~ /^rows=/){sub("rows=","",$i); s+=$i}} END{print s+0}' "$dir/status.txt")
mib=$(table_mib "$dir/status.txt")
rss=$(grep -o "^ps/[0-9].*" "$dir/status.txt" | grep -o "rss=[0-9.]*[A-Za-z]*" | tr "\n" "," | sed "s/,$//" || true)
echo "table_scale: phase=trained rows=$(checkpoint_rows) (in the checkpoint)" \
  "last_status: rows=$status_rows table_mib=$mib" \
  "bytes_per_row=$(awk -v m="$mib" -v r="$status_rows" 'BEGIN{if(r>0) printf "%.1f", m*1048576/r}')" \
  "ps_memory=$rss train_s=$(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.1f", b-a}')" \
  "peak_rss_mib=$(peaks)"
save_line=$(grep -h "saved .*model.ckpt" "$dir"/train/ps-*.log | tail -2 | tr '\n' ' ')
echo "table_scale: phase=saved checkpoint_bytes=$(du -cb "$dir"/ckpt/*.safetensors | tail -1 | cut -f1) ($save_line)"

start=$(date +%s.%N)
rm -f "$dir/peaks.txt"
watch_status "$resume_spec" & watcher=$!
scripts/launch.sh --cluster_spec "$resume_spec" --logdir "$dir/resume" --checkpoint_dir "$dir/ckpt" -- \
  "${flags[@]}" --train_steps=$((steps + 100)) > "$dir/resume.out" 2>&1
kill $watcher 2>/dev/null || true
wait $watcher 2>/dev/null || true
restored=$(grep -h "restored checkpoint" "$dir"/resume/ps-*.log | grep -o "restored checkpoint [0-9]*" | sort -u | tr '\n' ' ')
# Seconds from a ps task's first log line to its last restored stripe (glog's times).
restore_s=$(for log in "$dir"/resume/ps-*.log; do
  { head -1 "$log"; grep "restored checkpoint" "$log" | tail -1; } | awk '{split($2, t, ":"); s = t[1] * 3600 + t[2] * 60 + t[3]; if (NR == 1) a = s; else printf "%.1f ", s - a}'
done)
resumed=$(grep -o "resuming at global step [0-9]*" "$dir/resume/worker-0.log" | grep -o "[0-9]*$" || true)
echo "table_scale: phase=restored ps=${resume_ps:-$ps} rows=$(checkpoint_rows) (in the resumed run's checkpoint)" \
  "restore_s_per_ps=${restore_s% } resumed_at=${resumed:-none} ($restored)" \
  "final=\"$(grep '^final:' "$dir/resume/worker-0.log")\"" "peak_rss_mib=$(peaks)"
