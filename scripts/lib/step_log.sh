# shellcheck shell=bash
# Reading a psrt_worker's log (the chief's, with --progress=log): the lines
# it writes every --log_every_steps,
#   step N, loss = L (X examples/sec; S sec/batch)
#   step N timing: compute_ms=C exposed_comm_ms=E wait_ms=W (per step; push_ms=P pull_ms=Q input_ms=I)
# each about the interval since the previous. The first interval holds the
# start-up (first pulls, allocations, on a GPU the first kernels' set-up),
# so both readers skip it and take the median of the rest.
# Sourced by the benchmarks (scripts/bench_*.sh) and scripts/chaos.sh.

# median: the median of the numbers on stdin, one a line; nothing when
# there are none.
median() {
  sort -g | awk 'NF {v[++n] = $1}
    END {if (n) print (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2}'
}

# step_log_field LOG NAME: the median per-step NAME (compute_ms,
# exposed_comm_ms, wait_ms, push_ms, pull_ms or input_ms) of LOG's timing
# lines after the first.
step_log_field() {
  grep -o ' timing: .*' "$1" | awk 'NR > 1' | grep -oE "[ (]$2=[0-9.]+" |
    cut -d= -f2 | median
}

# step_log_job_eps LOG WORKERS: the examples/sec of WORKERS synchronous
# workers together, the median over LOG's intervals after the first. The
# workers run in lockstep: the job's rate is WORKERS times the chief's.
step_log_job_eps() {
  grep -o '([0-9.]* examples/sec' "$1" | tr -d '(' |
    awk -v w="$2" 'NR > 1 {print $1 * w}' | median
}

# log_seconds LINE: seconds since the epoch of a glog line's time (today's
# date).
log_seconds() {
  date -d "$(date +%F) $(echo "$1" | sed -n 's/^[IWE][0-9]\{8\} \([0-9:.]*\) .*/\1/p')" +%s.%N
}

# wait_for_chief_step PID LOG STEP: waits while process PID (a launcher)
# runs until LOG (the chief's) has logged "step N, loss" with N >= STEP;
# 1 when PID ended first.
wait_for_chief_step() {
  local step
  while kill -0 "$1" 2>/dev/null; do
    step=$(sed -n 's/.* step \([0-9]*\), loss.*/\1/p' "$2" 2>/dev/null | tail -1 || true)
    [ "${step:-0}" -ge "$3" ] && return 0
    sleep 0.02
  done
  return 1
}
