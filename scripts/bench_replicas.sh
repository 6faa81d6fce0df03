#!/usr/bin/env bash
# What replicated shards (--ps_replicas=1) cost and what a failover takes:
# a synchronous job of 2 ps + 2 workers on 127.0.0.1 (LeNet by default),
# run without and with replicas, alternately, --runs times each, in one
# command; then a replicated run whose ps/0 is killed -9 mid-run.
#   replicas: run=I replicas=0|1 job_eps=X steps_per_s=S pushpull_mb_s=M
#   replicas_cost: model=M runs=N steps_per_s_without=A steps_per_s_with=B ratio=R
#   replicas_failover: model=M killed=ps/0 at_step=K takeover_ms=T1..T2 next_step_ms=N rolled_back=0
# job_eps and steps_per_s are the medians of the chief's log intervals after
# the first; pushpull_mb_s is the bytes the ps tasks served (pushes and
# pulls, not the copies to the backups) over the run's training time. The
# failover run logs every step: takeover_ms is the time from the kill to the
# first and the last backup copy's "takes over" line (ps/0's 2 shards),
# next_step_ms to the chief's first step logged after the last of them;
# rolled_back is 0 when the chief never went back to a checkpoint.
#
#   scripts/bench_replicas.sh [--model lenet] [--steps 600] [--runs 3] [--threads 1]
set -euo pipefail
cd "$(dirname "$0")/.."
model=lenet steps=600 runs=3 threads=1
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    *) echo "bench_replicas.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
scripts/setup.sh >/dev/null
work=$(mktemp -d /tmp/psrt_bench_replicas.XXXXXX)
trap 'rm -rf "$work"' EXIT
. scripts/lib/step_log.sh  # median, step_log_job_eps, log_seconds, wait_for_chief_step
flags=(--model="$model" --sync_replicas --batch_size=100 --device=cpu --noshuffle
       --intra_op_threads="$threads" --train_steps="$steps" --progress=log
       --learning_rate=0.01)

for ((i = 1; i <= runs; i++)); do
  for replicas in 0 1; do
    dir="$work/run-$i-$replicas"
    scripts/make_cluster_spec.sh --ps 2 --workers 2 --out "$dir.json"
    scripts/launch.sh --cluster_spec "$dir.json" --logdir "$dir" \
      --ps_flags "--ps_replicas=$replicas" -- --ps_replicas="$replicas" "${flags[@]}" \
      --log_every_steps=$((steps / 6)) >/dev/null
    log="$dir/worker-0.log"
    job_eps=$(step_log_job_eps "$log" 2)
    first=$(grep -m1 ' step [0-9]*, loss' "$log")
    last=$(grep ' step [0-9]*, loss' "$log" | tail -1)
    bytes=$(cat "$dir"/ps-*.log | sed -n 's/.* pushed_bytes=\([0-9]*\) pulled_bytes=\([0-9]*\).*/\1 \2/p' |
            awk '{s += $1 + $2} END {print s + 0}')
    awk -v i="$i" -v r="$replicas" -v e="$job_eps" -v b="$bytes" -v m="$steps" \
        -v t0="$(log_seconds "$first")" -v t1="$(log_seconds "$last")" 'BEGIN {
      printf "replicas: run=%d replicas=%d job_eps=%.0f steps_per_s=%.1f pushpull_mb_s=%.1f\n",
             i, r, e, e / 200, b / 1e6 / (t1 - t0) * (m - m / 6) / m}'
  done
done | tee "$work/lines"
awk -v m="$model" -v n="$runs" '
  /^replicas:/ {split($3, r, "="); split($5, s, "="); v[r[2]] = v[r[2]] " " s[2]}
  END {printf "%s|%s\n", v[0], v[1]}' "$work/lines" > "$work/both"
without=$(cut -d'|' -f1 "$work/both" | tr ' ' '\n' | median)
with=$(cut -d'|' -f2 "$work/both" | tr ' ' '\n' | median)
awk -v m="$model" -v n="$runs" -v a="$without" -v b="$with" 'BEGIN {
  printf "replicas_cost: model=%s runs=%d steps_per_s_without=%.1f steps_per_s_with=%.1f ratio=%.3f\n",
         m, n, a, b, b / a}'

# The failover: ps/0 killed -9 once the chief has logged a third of the run.
dir="$work/failover"
scripts/make_cluster_spec.sh --ps 2 --workers 2 --out "$dir.json"
scripts/launch.sh --cluster_spec "$dir.json" --logdir "$dir" --ps_flags "--ps_replicas=1" -- \
  --ps_replicas=1 "${flags[@]}" --log_every_steps=1 >"$dir.out" 2>&1 &
launcher=$!
at=$((steps / 3))
wait_for_chief_step "$launcher" "$dir/worker-0.log" "$at" || true
pid=$(sed -n 's|^launch: started ps/0 on .* (pid \([0-9]*\),.*|\1|p' "$dir.out" | tail -1)
killed_at=$(date +%s.%N)
kill -9 "$pid"
wait "$launcher" || true  # ps/0's exit 137 is the launcher's exit code.
first_takeover=$(grep -m1 'takes over as the primary' "$dir/ps-1.log")
takeover=$(grep 'takes over as the primary' "$dir/ps-1.log" | tail -1)
after=$(awk -v k="$(log_seconds "$takeover")" -v d="$(date +%F)" '
  / step [0-9]*, loss/ {
    split($2, t, ":"); cmd = "date -d \"" d " " $2 "\" +%s.%N"; cmd | getline s; close(cmd)
    if (s > k) {print; exit}
  }' "$dir/worker-0.log")
rolled_back=$(sed -n 's/.*(\([0-9]*\) steps rolled back).*/\1/p' "$dir/worker-0.log" |
              awk '{s += $1} END {print s + 0}')
grep -q '^final: global_step='"$steps" "$dir/worker-0.log" ||
  { echo "bench_replicas.sh: the failover run did not finish; see $dir" >&2; trap - EXIT; exit 1; }
awk -v m="$model" -v at="$at" -v k="$killed_at" -v t0="$(log_seconds "$first_takeover")" \
    -v t="$(log_seconds "$takeover")" -v n="$(log_seconds "$after")" -v r="$rolled_back" 'BEGIN {
  printf "replicas_failover: model=%s killed=ps/0 at_step=%d takeover_ms=%.0f..%.0f next_step_ms=%.0f rolled_back=%s\n",
         m, at, (t0 - k) * 1000, (t - k) * 1000, (n - k) * 1000, r}'
