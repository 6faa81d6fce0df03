#!/usr/bin/env bash
# What elastic workers (--max_workers) cost and how fast the chief takes a
# change: a synchronous job of 2 ps + 2 workers on 127.0.0.1 (LeNet by
# default; --mode allreduce: 2 workers in a ring, no ps), run with a fixed
# set and elastic, alternately, --runs times each, in one command; then an
# elastic run that a third worker joins (from a grown cluster spec) and
# worker 1 leaves (kill -9).
#   elastic: run=I elastic=0|1 steps_per_s=S
#   elastic_cost: mode=ps|allreduce model=M runs=N steps_per_s_fixed=A steps_per_s_elastic=B ratio=R
#   elastic_changes: mode=ps|allreduce model=M join_ms=J leave_ms=L lease_ms=E steps_per_s_before=B steps_per_s_3_workers=T final_step=N
# steps_per_s is the median of the chief's log intervals after the first.
# In ps mode join_ms is the time from the joiner's start to the chief's
# "join" line (the joiner loads its data and model, then calls the chief),
# leave_ms from the kill to the chief's "leave" line (the lease,
# --elastic_lease_secs, from the worker's last call, a quarter of a lease
# apart, plus up to a quarter of a lease until the chief looks). In
# allreduce mode both run to the chief's line of the ring that carries on
# with the new members (the joiner has the model then; the ring without the
# dead worker has regrouped), and the fixed set's ring moves its segments
# over the data plane where the elastic rings use gRPC. The steps/s are the
# chief's medians before the join and while 3 workers train.
#
#   scripts/bench_elastic.sh [--mode ps|allreduce] [--model lenet] [--steps 600] [--runs 3]
#                            [--threads 1]
set -euo pipefail
cd "$(dirname "$0")/.."
mode=ps model=lenet steps=600 runs=3 threads=1
while [ $# -gt 0 ]; do
  case "$1" in
    --mode) mode="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    *) echo "bench_elastic.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$mode" in
  ps) num_ps=2 ;;
  allreduce) num_ps=0 ;;
  *) echo "bench_elastic.sh: --mode must be ps or allreduce" >&2; exit 2 ;;
esac
scripts/setup.sh >/dev/null
work=$(mktemp -d /tmp/psrt_bench_elastic.XXXXXX)
trap 'rm -rf "$work"' EXIT
. scripts/lib/step_log.sh  # median, log_seconds, wait_for_chief_step
flags=(--model="$model" --sync_replicas --batch_size=100 --device=cpu --noshuffle
       --intra_op_threads="$threads" --train_steps="$steps" --progress=log
       --learning_rate=0.01 --save_checkpoint_secs=0)
elastic_flags=(--max_workers=3 --min_workers=2 --elastic_lease_secs=2)

# The median steps/s of the chief's "step N, loss" lines of $1 (stdin: the
# lines), intervals after the first.
steps_per_s() {
  grep -o '[0-9.]* sec/batch' | awk 'NR > 1 {print 1 / $1}' | median
}

for ((i = 1; i <= runs; i++)); do
  for elastic in 0 1; do
    dir="$work/run-$i-$elastic"
    scripts/make_cluster_spec.sh --ps "$num_ps" --workers 2 --out "$dir.json"
    extra=()
    [ "$elastic" = 1 ] && extra=("${elastic_flags[@]}")
    scripts/launch.sh --cluster_spec "$dir.json" --logdir "$dir" -- "${flags[@]}" \
      "${extra[@]}" --log_every_steps=$((steps / 6)) >/dev/null
    printf "elastic: run=%d elastic=%d steps_per_s=%.1f\n" "$i" "$elastic" \
      "$(grep ' step [0-9]*, loss' "$dir/worker-0.log" | steps_per_s)"
  done
done | tee "$work/lines"
fixed=$(grep 'elastic=0' "$work/lines" | sed 's/.*steps_per_s=//' | median)
elastic=$(grep 'elastic=1' "$work/lines" | sed 's/.*steps_per_s=//' | median)
awk -v o="$mode" -v m="$model" -v n="$runs" -v a="$fixed" -v b="$elastic" 'BEGIN {
  printf "elastic_cost: mode=%s model=%s runs=%d steps_per_s_fixed=%.1f steps_per_s_elastic=%.1f ratio=%.3f\n",
         o, m, n, a, b, b / a}'

# The changes: worker 2 joins at a quarter of the run, worker 1 is killed
# at two thirds.
dir="$work/changes"
mkdir -p "$dir"
scripts/make_cluster_spec.sh --ps "$num_ps" --workers 3 --out "$dir/grown.json"
sed '/"worker"/ s/, "[^"]*"\]/]/' "$dir/grown.json" >"$dir/cluster.json"
scripts/launch.sh --cluster_spec "$dir/cluster.json" --logdir "$dir" -- "${flags[@]}" \
  "${elastic_flags[@]}" --log_every_steps=10 >"$dir/launch.out" 2>&1 &
launcher=$!
wait_for_chief_step "$launcher" "$dir/worker-0.log" $((steps / 4)) || true
joiner_started=$(date +%s.%N)
build/bin/psrt_worker --cluster_spec="$dir/grown.json" --job_name=worker --task_index=2 \
  "${flags[@]}" "${elastic_flags[@]}" --log_every_steps=10 >"$dir/worker-2.log" 2>&1 &
joiner=$!
wait_for_chief_step "$launcher" "$dir/worker-0.log" $((steps * 2 / 3)) || true
pid=$(sed -n 's|^launch: started worker/1 on .* (pid \([0-9]*\),.*|\1|p' "$dir/launch.out" | tail -1)
killed_at=$(date +%s.%N)
kill -9 "$pid"
code=0
wait "$launcher" || code=$?
wait "$joiner" || code=$?
if [ "$mode" = ps ]; then
  joined=$(grep -m1 'worker replica(s) 2 join' "$dir/worker-0.log" || true)
  left=$(grep -m1 'worker replica(s) 1 leave' "$dir/worker-0.log" || true)
else  # The rings that carry on with the joiner, and without the dead worker.
  joined=$(grep -m1 '(worker replicas 0, 1, 2) carries on' "$dir/worker-0.log" || true)
  left=$(grep -m1 '(worker replicas 0, 2) carries on' "$dir/worker-0.log" || true)
fi
if [ "$code" != 0 ] || [ -z "$joined" ] || [ -z "$left" ] ||
   ! grep -q "^final: global_step=$steps" "$dir/worker-0.log"; then
  echo "bench_elastic.sh: the run with changes did not go as planned; see $dir" >&2
  trap - EXIT
  exit 1
fi
join_step=$(echo "$joined" | sed -n 's/.* at global step \([0-9]*\).*/\1/p')
leave_step=$(echo "$left" | sed -n 's/.* at global step \([0-9]*\).*/\1/p')
step_lines() {  # The chief's step lines with steps in [$1, $2).
  awk -v a="$1" -v b="$2" 'match($0, / step [0-9]+, loss/) {
    s = substr($0, RSTART + 6) + 0; if (s >= a && s < b) print}' "$dir/worker-0.log"
}
awk -v o="$mode" -v m="$model" -v j0="$joiner_started" -v j="$(log_seconds "$joined")" -v k="$killed_at" \
    -v l="$(log_seconds "$left")" -v b="$(step_lines 0 "$join_step" | steps_per_s)" \
    -v t="$(step_lines $((join_step + 10)) "$leave_step" | steps_per_s)" -v n="$steps" 'BEGIN {
  printf "elastic_changes: mode=%s model=%s join_ms=%.0f leave_ms=%.0f lease_ms=2000 steps_per_s_before=%.1f steps_per_s_3_workers=%.1f final_step=%d\n",
         o, m, (j - j0) * 1000, (l - k) * 1000, b, t, n}'
