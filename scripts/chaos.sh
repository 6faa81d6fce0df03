#!/usr/bin/env bash
# Chaos soak: N synchronous training runs (2 ps + 2 workers on 127.0.0.1,
# launched with --restart_policy=ExitCode and checkpoints), each with one
# random task killed -9 at a random step. Every run must finish and end
# within 0.01 test accuracy of an undisturbed run of the same job (sync
# training resumes exactly, so the difference is normally 0). Prints a line
# per run and the tally:
#   chaos: run=I killed=TASK at_step=K exit=E accuracy=A diff=D ok|FAIL
#   chaos: runs=N passed=P failed=F reference_accuracy=A
# and exits 1 when a run failed (its logs are kept and named); a run whose
# victim could not be killed (it had exited) counts as failed too.
#
# --replicas: every shard has a backup copy (--ps_replicas=1 on every task)
# and the victim is a ps task; in every other run, once the restarted victim
# has rejoined and been filled (the survivor logs a fill of each of its 4
# primary copies), the other ps task is killed too. A run must also roll
# back no step (the chief never recovers from a checkpoint):
#   chaos: run=I killed=ps/0,ps/1 at_step=K exit=E accuracy=A diff=D rolled_back=0 ok|FAIL
#
# --elastic: the workers are elastic (--max_workers=3 --min_workers=1 on
# every worker, restart policy Never); at a random step a third worker joins
# from a grown cluster spec, and later worker 1 leaves, killed -9 or drained
# with psrtctl (in turn). A run must end at its last step with the joiner
# and the launcher exiting 0, the chief having logged both changes, and an
# accuracy within 0.05 of the undisturbed run's (the steps average other
# workers' gradients, so it is not exact):
#   chaos: run=I joined_at=J left=killed|drained at_step=K exit=E accuracy=A diff=D ok|FAIL
# --elastic --allreduce: the same with 2 workers in allreduce mode (no ps
# tasks), each change logged where the ring carries on with its new members.
#
#   scripts/chaos.sh [N] [--model mlp] [--steps 600 (2000 --elastic)]
#                    [--replicas|--elastic [--allreduce]]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=20 model=mlp steps="" replicas=0 elastic=0 num_ps=2
if [ $# -gt 0 ] && [[ "$1" != --* ]]; then runs="$1"; shift; fi
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --replicas) replicas=1; shift ;;
    --elastic) elastic=1; shift ;;
    --allreduce) num_ps=0; shift ;;
    *) echo "chaos.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ "$num_ps" = 0 ] && [ "$elastic" = 0 ]; then
  echo "chaos.sh: --allreduce goes with --elastic" >&2
  exit 2
fi
# Elastic runs are longer: a joiner takes a second or two to start.
[ -n "$steps" ] || steps=$([ "$elastic" = 1 ] && echo 2000 || echo 600)
scripts/setup.sh >/dev/null
work=$(mktemp -d /tmp/psrt_chaos.XXXXXX)
. scripts/lib/step_log.sh  # wait_for_chief_step
flags=(--model="$model" --sync_replicas --batch_size=100 --noshuffle --learning_rate=0.05
       --train_steps="$steps" --save_checkpoint_steps=25 --log_every_steps=5
       --progress=log --pull_timeout_secs=60)

# One job in $work/$1; prints its final accuracy ("" when there is none).
final_accuracy() {
  sed -n 's/^final: global_step=[0-9]* test_accuracy=\([0-9.]*\).*/\1/p' "$1/worker-0.log" | tail -1
}

scripts/make_cluster_spec.sh --ps "$num_ps" --workers 2 --out "$work/reference.json"
scripts/launch.sh --cluster_spec "$work/reference.json" --logdir "$work/reference" \
  --checkpoint_dir "$work/reference/ckpt" -- "${flags[@]}" >"$work/reference.out" 2>&1 ||
  { echo "chaos: the undisturbed run failed; see $work/reference.out" >&2; exit 1; }
reference=$(final_accuracy "$work/reference")

passed=0 failed=0
tasks=(ps/0 ps/1 worker/0 worker/1)
ps_flags="" replica_flags=()
if [ "$replicas" = 1 ]; then
  tasks=(ps/0 ps/1) ps_flags="--ps_replicas=1" replica_flags=(--ps_replicas=1)
fi

# The pid the launcher's output $1 gives task $2 (its latest start).
pid_of() {
  sed -n "s|^launch: \(re\)\{0,1\}started $2 .*(\(restart [0-9]* of at most [0-9]*, \)\{0,1\}pid \([0-9]*\).*|\3|p" "$1" | tail -1
}
if [ "$elastic" = 1 ]; then
  elastic_flags=(--max_workers=3 --min_workers=1 --elastic_lease_secs=2)
  # Where the chief logs that each change took effect.
  joined_line='worker replica(s) 2 join at global step'
  left_line='worker replica(s) 1 leave at global step'
  if [ "$num_ps" = 0 ]; then
    joined_line='(worker replicas 0, 1, 2) carries on at global step'
    left_line='(worker replicas 0, 2) carries on at global step'
  fi
  for ((i = 1; i <= runs; i++)); do
    dir="$work/run-$i"
    mkdir -p "$dir"
    scripts/make_cluster_spec.sh --ps "$num_ps" --workers 3 --out "$dir/grown.json"
    sed '/"worker"/ s/, "[^"]*"\]/]/' "$dir/grown.json" >"$dir/cluster.json"
    scripts/launch.sh --cluster_spec "$dir/cluster.json" --logdir "$dir" \
      --checkpoint_dir "$dir/ckpt" -- "${flags[@]}" "${elastic_flags[@]}" >"$dir/launch.out" 2>&1 &
    launcher=$!
    joined_at=$((10 + RANDOM % (steps / 3)))
    at=$((joined_at + 20 + RANDOM % (steps / 3)))
    left=killed
    [ $((i % 2)) = 0 ] && left=drained
    joiner=""
    if wait_for_chief_step "$launcher" "$dir/worker-0.log" "$joined_at"; then
      build/bin/psrt_worker --cluster_spec="$dir/grown.json" --job_name=worker --task_index=2 \
        "${flags[@]}" "${elastic_flags[@]}" >"$dir/worker-2.log" 2>&1 &
      joiner=$!
    fi
    # The leave comes after the join (a joiner takes a second or two to start).
    while kill -0 "$launcher" 2>/dev/null &&
          ! grep -q 'worker replica(s) 2 join' "$dir/worker-0.log" 2>/dev/null; do
      sleep 0.05
    done
    wait_for_chief_step "$launcher" "$dir/worker-0.log" "$at" || left=missed
    if [ "$left" = missed ]; then
      :
    elif [ "$left" = killed ]; then
      pid=$(pid_of "$dir/launch.out" worker/1 || true)
      { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; } || left=missed
    else
      address=$(build/bin/psrtctl tasks --cluster_spec="$dir/cluster.json" |
                awk '$1 == "worker" && $2 == 1 {print $3}' || true)
      build/bin/psrtctl drain --address="$address" >>"$dir/launch.out" 2>&1 || left=missed
    fi
    code=0 joiner_code=0
    wait "$launcher" || code=$?
    if [ -n "$joiner" ]; then wait "$joiner" || joiner_code=$?; else joiner_code=1; fi
    accuracy=$(final_accuracy "$dir" || true)
    final_step=$(sed -n 's/^final: global_step=\([0-9]*\).*/\1/p' "$dir/worker-0.log" | tail -1)
    verdict=FAIL diff=""
    if [ "$left" != missed ] && [ "$code" -eq 0 ] && [ "$joiner_code" -eq 0 ] &&
       [ -n "$accuracy" ] && [ "$final_step" = "$steps" ] &&
       grep -qF "$joined_line" "$dir/worker-0.log" &&
       grep -qF "$left_line" "$dir/worker-0.log"; then
      diff=$(awk -v a="$accuracy" -v b="$reference" 'BEGIN {d = a - b; if (d < 0) d = -d; printf "%.4f", d}')
      if awk -v d="$diff" 'BEGIN {exit !(d <= 0.05)}'; then verdict=ok; fi
    fi
    if [ "$verdict" = ok ]; then passed=$((passed + 1)); rm -rf "$dir"; else failed=$((failed + 1)); fi
    echo "chaos: run=$i joined_at=$joined_at left=$left at_step=$at exit=$code" \
         "accuracy=${accuracy:-none} diff=${diff:-none} $verdict$([ "$verdict" = FAIL ] && echo " (logs: $dir)")"
  done
  echo "chaos: runs=$runs passed=$passed failed=$failed reference_accuracy=$reference"
  if [ "$failed" -eq 0 ]; then rm -rf "$work"; exit 0; fi
  exit 1
fi

for ((i = 1; i <= runs; i++)); do
  dir="$work/run-$i"
  mkdir -p "$dir"
  scripts/make_cluster_spec.sh --ps 2 --workers 2 --out "$dir/cluster.json"
  scripts/launch.sh --cluster_spec "$dir/cluster.json" --logdir "$dir" --ps_flags "$ps_flags" \
    --checkpoint_dir "$dir/ckpt" --restart_policy=ExitCode -- "${flags[@]}" \
    "${replica_flags[@]}" >"$dir/launch.out" 2>&1 &
  launcher=$!
  victim=${tasks[RANDOM % ${#tasks[@]}]}
  # A step between the first checkpoint and the last quarter of the run.
  at=$((25 + RANDOM % (steps * 3 / 4 - 25)))
  wait_for_chief_step "$launcher" "$dir/worker-0.log" "$at" || true
  pid=$(pid_of "$dir/launch.out" "$victim" || true)
  killed=missed
  if [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; then killed=$victim; fi
  if [ "$replicas" = 1 ] && [ "$killed" != missed ] && [ $((i % 2)) = 0 ]; then
    # The other ps, once the victim is back as the backup of all 4 shards:
    # the survivor filled 2 copies at the start and 4 since.
    other=ps/$((1 - ${victim#ps/}))
    while kill -0 "$launcher" 2>/dev/null &&
          [ "$(grep -c 'filled at version' "$dir/${other/\//-}.log" 2>/dev/null)" -lt 6 ]; do
      sleep 0.05
    done
    pid=$(pid_of "$dir/launch.out" "$other" || true)
    if [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; then killed="$killed,$other"; else killed=missed; fi
  fi
  code=0
  wait "$launcher" || code=$?
  rolled_back=$(sed -n 's/.*(\([0-9]*\) steps rolled back).*/\1/p' "$dir/worker-0.log" |
                awk '{s += $1} END {print s + 0}')
  accuracy=$(final_accuracy "$dir" || true)
  verdict=FAIL diff=""
  if [ "$killed" != missed ] && [ "$code" -eq 0 ] && [ -n "$accuracy" ]; then
    diff=$(awk -v a="$accuracy" -v b="$reference" 'BEGIN {d = a - b; if (d < 0) d = -d; printf "%.4f", d}')
    if awk -v d="$diff" 'BEGIN {exit !(d <= 0.01)}'; then verdict=ok; fi
    [ "$replicas" = 1 ] && [ "$rolled_back" != 0 ] && verdict=FAIL
  fi
  if [ "$verdict" = ok ]; then
    passed=$((passed + 1))
    rm -rf "$dir"
  else
    failed=$((failed + 1))
  fi
  note=""
  [ "$verdict" = FAIL ] && note=" (logs: $dir)"
  echo "chaos: run=$i killed=$killed at_step=$at exit=$code accuracy=${accuracy:-none}" \
       "diff=${diff:-none}$([ "$replicas" = 1 ] && echo " rolled_back=$rolled_back") $verdict$note"
done
echo "chaos: runs=$runs passed=$passed failed=$failed reference_accuracy=$reference"
if [ "$failed" -eq 0 ]; then rm -rf "$work"; exit 0; fi
exit 1
