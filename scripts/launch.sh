#!/usr/bin/env bash
# Starts every task of a cluster spec that lives on this host and supervises
# them.
#
#   scripts/launch.sh --cluster_spec FILE [--logdir DIR] [--ps_flags "FLAGS"]
#                     [--checkpoint_dir DIR] [--all_hosts] -- WORKER_FLAGS...
#
# ps tasks run build/bin/psrt_ps with --ps_flags; worker, chief and
# evaluator tasks run build/bin/psrt_worker with WORKER_FLAGS. Every task gets
# --cluster_spec=FILE --job_name=JOB --task_index=I, exactly what you would
# type to start it by hand on its own machine. --checkpoint_dir DIR is short
# for --ps_flags "--checkpoint_dir=DIR": the shards save there and restore
# from there when started again. One log file per task:
# DIR/JOB-I.log (DIR defaults to a new /tmp/psrt_logs.XXXXXX). The chief's
# log is echoed here as it runs.
#
# A task "lives on this host" when its host is 127.0.0.1, localhost, ::1, this
# machine's name or one of its addresses; --all_hosts starts every task here.
# Exit status: 0 when every task exited 0. When a task fails, the launcher
# names it, shows the end of its log, stops the other tasks and exits 1.
# Ctrl-C stops every task. A malformed spec is refused before anything starts.
set -uo pipefail
if [ "${BASH_VERSINFO[0]}" -lt 5 ] || { [ "${BASH_VERSINFO[0]}" -eq 5 ] && [ "${BASH_VERSINFO[1]}" -lt 1 ]; }; then
  echo "launch: needs bash 5.1 or newer (wait -n -p), this is $BASH_VERSION" >&2
  exit 2
fi
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${PSRT_BIN_DIR:-$root/build/bin}"

usage() { sed -n '2,20p' "$0" >&2; exit 2; }
spec="" logdir="" ps_flags="" all_hosts=0
worker_flags=()
while [ $# -gt 0 ]; do
  case "$1" in
    --cluster_spec) spec="${2:-}"; shift 2 ;;
    --cluster_spec=*) spec="${1#*=}"; shift ;;
    --logdir) logdir="${2:-}"; shift 2 ;;
    --logdir=*) logdir="${1#*=}"; shift ;;
    --ps_flags) ps_flags="${2:-}"; shift 2 ;;
    --ps_flags=*) ps_flags="${1#*=}"; shift ;;
    --checkpoint_dir) ps_flags="$ps_flags --checkpoint_dir=${2:-}"; shift 2 ;;
    --checkpoint_dir=*) ps_flags="$ps_flags --checkpoint_dir=${1#*=}"; shift ;;
    --all_hosts) all_hosts=1; shift ;;
    --) shift; worker_flags=("$@"); break ;;
    -h|--help) usage ;;
    *) echo "launch: unknown argument $1 (worker flags go after --)" >&2; exit 2 ;;
  esac
done
[ -n "$spec" ] || { echo "launch: --cluster_spec FILE is required" >&2; usage; }
for b in psrt_ps psrt_worker psrtctl; do
  [ -x "$bin/$b" ] || { echo "launch: $bin/$b not found: run scripts/setup.sh" >&2; exit 2; }
done
spec="$(cd "$(dirname "$spec")" 2>/dev/null && pwd)/$(basename "$spec")"
tasks="$("$bin/psrtctl" tasks --cluster_spec="$spec")" || exit 2

logdir="${logdir:-$(mktemp -d /tmp/psrt_logs.XXXXXX)}"
mkdir -p "$logdir"
local_hosts=" 127.0.0.1 localhost ::1 $(hostname 2>/dev/null) $(hostname -f 2>/dev/null) $(hostname -I 2>/dev/null) "

declare -A task_of  # pid -> "job/index"
chief_log=""
chief_job=worker
grep -q '^chief ' <<<"$tasks" && chief_job=chief

# SIGTERM to every task still running; SIGKILL to those alive 10 s later.
stop_all() {
  local pids=("${!task_of[@]}")
  if [ ${#pids[@]} -gt 0 ]; then
    kill "${pids[@]}" 2>/dev/null
    for _ in $(seq 100); do
      kill -0 "${pids[@]}" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "${pids[@]}" 2>/dev/null
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
  fi
  [ -n "${tail_pid:-}" ] && kill "$tail_pid" 2>/dev/null
}
trap 'echo "launch: interrupted: stopping every task" >&2; stop_all; exit 130' INT
trap 'echo "launch: terminated: stopping every task" >&2; stop_all; exit 143' TERM HUP

while read -r job index address; do
  host="${address%:*}"; host="${host#[}"; host="${host%]}"
  if [ $all_hosts -eq 0 ] && [[ "$local_hosts" != *" $host "* ]]; then
    continue
  fi
  log="$logdir/$job-$index.log"
  common=(--cluster_spec="$spec" --job_name="$job" --task_index="$index")
  if [ "$job" = ps ]; then
    # shellcheck disable=SC2086  # --ps_flags is a list of flags.
    "$bin/psrt_ps" "${common[@]}" $ps_flags >"$log" 2>&1 &
  elif [ "$job" = worker ] || [ "$job" = chief ] || [ "$job" = evaluator ]; then
    "$bin/psrt_worker" "${common[@]}" "${worker_flags[@]}" >"$log" 2>&1 &
  else
    echo "launch: skipping $job/$index: psrt has no $job binary yet" >&2
    continue
  fi
  task_of[$!]="$job/$index"
  echo "launch: started $job/$index on $address (pid $!, log $log)"
  [ "$job/$index" = "$chief_job/0" ] && chief_log="$log"
done <<<"$tasks"

if [ ${#task_of[@]} -eq 0 ]; then
  echo "launch: no task of $spec lives on this host (use --all_hosts?)" >&2
  exit 2
fi
if [ -n "$chief_log" ]; then
  tail -n +1 -F "$chief_log" 2>/dev/null &
  tail_pid=$!
fi

while [ ${#task_of[@]} -gt 0 ]; do
  finished=""
  wait -n -p finished "${!task_of[@]}"
  code=$?
  if [ -z "$finished" ]; then
    echo "launch: lost track of the tasks (wait returned $code); stopping them" >&2
    stop_all
    exit 1
  fi
  task="${task_of[$finished]}"
  unset "task_of[$finished]"
  if [ $code -ne 0 ]; then
    sleep 0.2
    echo "launch: task $task failed with exit code $code; its log ($logdir/${task/\//-}.log) ends:" >&2
    tail -n 15 "$logdir/${task/\//-}.log" | sed 's/^/    /' >&2
    echo "launch: stopping the other tasks" >&2
    stop_all
    exit 1
  fi
  echo "launch: task $task finished"
done
sleep 0.2
[ -n "${tail_pid:-}" ] && kill "$tail_pid" 2>/dev/null
echo "launch: all tasks finished; logs in $logdir"
exit 0
