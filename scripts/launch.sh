#!/usr/bin/env bash
# Starts every task of a cluster spec that lives on this host and supervises
# them.
#
#   scripts/launch.sh --cluster_spec FILE [--logdir DIR] [--ps_flags "FLAGS"]
#       [--checkpoint_dir DIR] [--all_hosts] [--restart_policy=POLICY]
#       [--max_restarts=N] [--restart_backoff_secs=S]
#       [--max_restart_backoff_secs=S] [--gpus_per_worker=N [--gpus=LIST]]
#       -- WORKER_FLAGS...
#
# ps tasks run build/bin/psrt_ps with --ps_flags; worker, chief and
# evaluator tasks run build/bin/psrt_worker with WORKER_FLAGS. Every task gets
# --cluster_spec=FILE --job_name=JOB --task_index=I, exactly what you would
# type to start it by hand on its own machine. --checkpoint_dir DIR is short
# for --ps_flags "--checkpoint_dir=DIR": the shards save there and restore
# from there when started again (with no ps job, an allreduce-mode job, it
# goes to the workers instead; with --dense_allreduce among WORKER_FLAGS, to
# both). One log file per task:
# DIR/JOB-I.log (DIR defaults to a new /tmp/psrt_logs.XXXXXX). The chief's
# log is echoed here as it runs.
#
# A task "lives on this host" when its host is 127.0.0.1, localhost, ::1, this
# machine's name or one of its addresses; --all_hosts starts every task here.
#
# GPUs (what DC/OS and Mesos give each task): with --gpus_per_worker=N each
# worker and chief task started here gets N GPUs of its own, in start order,
# through CUDA_VISIBLE_DEVICES (and --num_gpus=N, one tower per GPU, unless
# WORKER_FLAGS set --num_gpus); ps and evaluator tasks get none
# (CUDA_VISIBLE_DEVICES=""; the evaluator runs with --device=cpu). The GPUs
# handed out are --gpus=LIST (e.g. 0,1,2,3), else the launcher's own
# CUDA_VISIBLE_DEVICES, else every GPU nvidia-smi lists; too few, or one
# named twice, is refused before anything starts. A restarted task gets its
# GPUs back. Without --gpus_per_worker (or with 0) tasks inherit the
# launcher's environment.
#
# Restarts, with Kubeflow's restart policies (the evaluator is never
# restarted):
#   Never      (default) a task that exits non-zero fails the job.
#   OnFailure  any non-zero exit is retried.
#   ExitCode   exit codes 1-127 are permanent errors (the job fails); 128-255
#              (killed by a signal: 130 SIGINT, 137 SIGKILL, 143 SIGTERM) are
#              retried.
# A task is restarted at most --max_restarts times (default 3), after
# --restart_backoff_secs (default 1), doubling per restart of that task up to
# --max_restart_backoff_secs (default 30). A restart appends to the task's log
# after a line "=== restart N of task JOB/I (exit code C) ===". A task that
# exits 0 is never restarted; once the chief has succeeded the job is done and
# nothing is restarted any more (ps tasks and other workers finish by
# themselves).
#
# Replicated shards (--ps_replicas=1 among --ps_flags): a ps task that exits
# non-zero and is not restarted does not fail the job: the backup copies of
# its shards, on the next ps task, serve them, and a restarted one rejoins as
# their backup. Its status reads "lost"; the job's outcome is the workers'.
#
# Elastic workers (--max_workers among the worker flags): a worker other
# than the chief that is killed by a signal and not restarted does not fail
# the job either: the chief drops it after its lease. Its status reads
# "lost". (One that exits with an error, bad flags say, still fails it.)
#
# Exit status: 0 when every task exited 0 (a lost replicated ps task or
# elastic worker aside); 1 when a task failed for good (the launcher names it, shows the
# end of its log and stops the others); 2 for bad
# arguments or a malformed spec (refused before anything starts); 130, 143
# or 129 on Ctrl-C, SIGTERM or SIGHUP (every task is stopped). Unless refused
# at the start, it ends with a summary: each task's final status and restart
# count, and the task that made the job fail.
set -uo pipefail
if [ "${BASH_VERSINFO[0]}" -lt 5 ] || { [ "${BASH_VERSINFO[0]}" -eq 5 ] && [ "${BASH_VERSINFO[1]}" -lt 1 ]; }; then
  echo "launch: needs bash 5.1 or newer, this is $BASH_VERSION" >&2
  exit 2
fi
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${PSRT_BIN_DIR:-$root/build/bin}"

usage() { sed -n '2,54p' "$0" >&2; exit 2; }
spec="" logdir="" ps_flags="" checkpoint_dir="" all_hosts=0 gpus_per_worker=0 gpu_list=""
restart_policy=Never max_restarts=3 backoff_secs=1 max_backoff_secs=30
worker_flags=()
while [ $# -gt 0 ]; do
  # --flag=value and --flag value are the same.
  if [[ "$1" == --*=* ]]; then
    flag="${1%%=*}" value="${1#*=}" used=1
  else
    flag="$1" value="${2:-}" used=2
  fi
  case "$flag" in
    --cluster_spec) spec="$value" ;;
    --logdir) logdir="$value" ;;
    --ps_flags) ps_flags="$value" ;;
    --checkpoint_dir) checkpoint_dir="$value" ;;
    --restart_policy) restart_policy="$value" ;;
    --max_restarts) max_restarts="$value" ;;
    --restart_backoff_secs) backoff_secs="$value" ;;
    --max_restart_backoff_secs) max_backoff_secs="$value" ;;
    --gpus_per_worker) gpus_per_worker="$value" ;;
    --gpus) gpu_list="$value" ;;
    --all_hosts) all_hosts=1 used=1 ;;
    --) shift; worker_flags=("$@"); break ;;
    -h|--help) usage ;;
    *) echo "launch: unknown argument $1 (worker flags go after --)" >&2; exit 2 ;;
  esac
  shift "$used" 2>/dev/null || { echo "launch: $flag needs a value" >&2; exit 2; }
done
[ -n "$spec" ] || { echo "launch: --cluster_spec FILE is required" >&2; usage; }
case "$restart_policy" in
  Never|OnFailure|ExitCode) ;;
  *) echo "launch: --restart_policy=$restart_policy: must be Never, OnFailure or ExitCode" >&2; exit 2 ;;
esac
[[ "$max_restarts" =~ ^[0-9]+$ ]] \
  || { echo "launch: --max_restarts=$max_restarts: must be a whole number >= 0" >&2; exit 2; }
for pair in "restart_backoff_secs=$backoff_secs" "max_restart_backoff_secs=$max_backoff_secs"; do
  [[ "${pair#*=}" =~ ^[0-9]+(\.[0-9]+)?$ ]] \
    || { echo "launch: --$pair: must be a number of seconds >= 0" >&2; exit 2; }
done
[[ "$gpus_per_worker" =~ ^(0|[1-9][0-9]*)$ ]] \
  || { echo "launch: --gpus_per_worker=$gpus_per_worker: must be a whole number >= 0" >&2; exit 2; }
if [ -n "$gpu_list" ] && [ "$gpus_per_worker" -eq 0 ]; then
  echo "launch: --gpus=$gpu_list hands out GPUs only with --gpus_per_worker=N" >&2
  exit 2
fi
for b in psrt_ps psrt_worker psrtctl; do
  [ -x "$bin/$b" ] || { echo "launch: $bin/$b not found: run scripts/setup.sh" >&2; exit 2; }
done
spec="$(cd "$(dirname "$spec")" 2>/dev/null && pwd)/$(basename "$spec")"
tasks="$("$bin/psrtctl" tasks --cluster_spec="$spec")" || exit 2
if [ -n "$checkpoint_dir" ]; then
  if grep -q '^ps ' <<<"$tasks"; then
    ps_flags="$ps_flags --checkpoint_dir=$checkpoint_dir"
  fi
  # Allreduce mode, and --dense_allreduce's dense part: the workers keep
  # (that part of) the model and its checkpoints.
  dense_on_workers=0
  grep -q '^ps ' <<<"$tasks" || dense_on_workers=1
  for f in "${worker_flags[@]}"; do
    [[ "$f" =~ ^--?dense_allreduce(=([Tt]rue|TRUE|1|[Yy]es|t|y))?$ ]] && dense_on_workers=1
  done
  [ "$dense_on_workers" = 0 ] || worker_flags+=(--checkpoint_dir="$checkpoint_dir")
fi

# Replicated shards (--ps_replicas=1 among --ps_flags): a ps task lost for
# good is covered by the backups of its shards, so it does not fail the job.
ps_replicated=0
read -r -a ps_flag_words <<<"$ps_flags"
for ((w = 0; w < ${#ps_flag_words[@]}; w++)); do
  f="${ps_flag_words[w]}"
  [[ "$f" =~ ^--?ps_replicas=0*[1-9] ]] && ps_replicated=1
  [[ "$f" =~ ^--?ps_replicas$ && "${ps_flag_words[w + 1]:-}" =~ ^0*[1-9] ]] && ps_replicated=1
done

# Elastic workers (--max_workers=N, N > 0, among the worker flags).
workers_elastic=0
for ((w = 0; w < ${#worker_flags[@]}; w++)); do
  f="${worker_flags[w]}"
  [[ "$f" =~ ^--?max_workers=0*[1-9] ]] && workers_elastic=1
  [[ "$f" =~ ^--?max_workers$ && "${worker_flags[w + 1]:-}" =~ ^0*[1-9] ]] && workers_elastic=1
done

logdir="${logdir:-$(mktemp -d /tmp/psrt_logs.XXXXXX)}"
mkdir -p "$logdir"
local_hosts=" 127.0.0.1 localhost ::1 $(hostname 2>/dev/null) $(hostname -f 2>/dev/null) $(hostname -I 2>/dev/null) "

# Every task started here is a key "job/index", in start order in `started`.
started=()
declare -A status_of=()   # task -> running | restarting | succeeded | failed (exit code C) | stopped
declare -A restarts_of=() # task -> restarts so far
declare -A last_code_of=()  # task -> its last non-zero exit code
declare -A task_of=()     # pid of a running task -> task
declare -A timer_of=()    # pid of a backoff timer (a sleep) -> task it restarts
failed_task="" failure=""
job_done=0
chief_log=""
chief_job=worker
grep -q '^chief ' <<<"$tasks" && chief_job=chief

log_of() { echo "$logdir/${1/\//-}.log"; }

# Whether the task at address $1 (host:port) is started here.
lives_here() {
  local host="${1%:*}"
  host="${host#[}"; host="${host%]}"
  [ $all_hosts -eq 1 ] || [[ "$local_hosts" == *" $host "* ]]
}

# --gpus_per_worker: the GPUs to hand out, and each training task's share.
declare -A gpus_of=()     # worker or chief task -> "2,3"
free_gpus=()
if [ "$gpus_per_worker" -gt 0 ]; then
  if [ -n "$gpu_list" ]; then
    gpu_source="--gpus=$gpu_list"
  elif [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    gpu_list="$CUDA_VISIBLE_DEVICES" gpu_source="CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"
  else
    gpu_list="$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | tr -d ' ' | paste -sd, -)"
    gpu_source="nvidia-smi"
  fi
  IFS=, read -r -a free_gpus <<<"$gpu_list"
  training_tasks=0
  while read -r job index address; do
    if { [ "$job" = worker ] || [ "$job" = chief ]; } && lives_here "$address"; then
      training_tasks=$((training_tasks + 1))
    fi
  done <<<"$tasks"
  needed=$((training_tasks * gpus_per_worker))
  if [ "${#free_gpus[@]}" -lt "$needed" ]; then
    echo "launch: --gpus_per_worker=$gpus_per_worker for $training_tasks worker/chief tasks here needs $needed GPUs, but $gpu_source gives ${#free_gpus[@]} (${gpu_list:-none})" >&2
    exit 2
  fi
  if [ "$(printf '%s\n' "${free_gpus[@]}" | sort | uniq -d)" ]; then
    echo "launch: $gpu_source names a GPU twice" >&2
    exit 2
  fi
  user_num_gpus=0
  for f in "${worker_flags[@]}"; do
    [[ "$f" =~ ^--?num_gpus(=|$) ]] && user_num_gpus=1
  done
fi

# Starts task $1 (job/index) in the background; its output goes to its log,
# appended (">>") when $2 is "append".
start_task() {
  local task="$1" job="${1%/*}" index="${1#*/}" log
  log="$(log_of "$1")"
  [ "${2:-}" = append ] || : >"$log"
  local common=(--cluster_spec="$spec" --job_name="$job" --task_index="$index")
  local env=() extra=()
  if [ "$gpus_per_worker" -gt 0 ]; then
    if [ "$job" = worker ] || [ "$job" = chief ]; then
      if [ -z "${gpus_of[$task]:-}" ]; then
        gpus_of[$task]="$(IFS=,; echo "${free_gpus[*]:0:$gpus_per_worker}")"
        free_gpus=("${free_gpus[@]:$gpus_per_worker}")
      fi
      env=(CUDA_VISIBLE_DEVICES="${gpus_of[$task]}")
      [ "$user_num_gpus" = 1 ] || extra=(--num_gpus="$gpus_per_worker")
    else
      env=(CUDA_VISIBLE_DEVICES=)
      # The evaluator has no GPU: it evaluates on the CPU, after the flags
      # meant for the GPU workers.
      [ "$job" = evaluator ] && extra=(--device=cpu --num_gpus=1)
    fi
  fi
  if [ "$job" = ps ]; then
    # shellcheck disable=SC2086  # --ps_flags is a list of flags.
    env "${env[@]}" "$bin/psrt_ps" "${common[@]}" $ps_flags >>"$log" 2>&1 &
  else
    env "${env[@]}" "$bin/psrt_worker" "${common[@]}" "${worker_flags[@]}" "${extra[@]}" \
      >>"$log" 2>&1 &
  fi
  task_of[$!]="$task"
  status_of[$task]=running
}

# Why exit code $1 of task $2 is (or is not) retried: prints "retry" or a
# reason it is not.
restart_verdict() {
  local code="$1" task="$2"
  if [ "${task%/*}" = evaluator ]; then
    echo "the evaluator is never restarted"
  elif [ "$restart_policy" = Never ]; then
    echo "--restart_policy=Never"
  elif [ "$restart_policy" = ExitCode ] && [ "$code" -lt 128 ]; then
    echo "exit codes 1-127 are permanent errors under --restart_policy=ExitCode"
  elif [ "${restarts_of[$task]}" -ge "$max_restarts" ]; then
    echo "it was restarted $max_restarts times already (--max_restarts)"
  else
    echo retry
  fi
}

describe_exit() {
  if [ "$1" -gt 128 ] && [ "$1" -lt 160 ]; then
    echo "exit code $1, killed by SIG$(kill -l $(($1 - 128)) 2>/dev/null)"
  else
    echo "exit code $1"
  fi
}

# Cancels every pending restart (the task stays stopped).
cancel_restarts() {
  local pid
  for pid in "${!timer_of[@]}"; do
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    status_of[${timer_of[$pid]}]=stopped
    unset "timer_of[$pid]"
  done
}

# True while one of the processes $@ runs (a zombie has ended: it only
# waits for the launcher to collect its exit status).
any_running() {
  local pid state
  for pid in "$@"; do
    { read -r _ _ state _ </proc/"$pid"/stat; } 2>/dev/null && [ "$state" != Z ] && return 0
  done
  return 1
}

# SIGTERM to every task still running; SIGKILL to those alive 10 s later.
stop_all() {
  cancel_restarts
  local pids=("${!task_of[@]}") pid
  if [ ${#pids[@]} -gt 0 ]; then
    kill "${pids[@]}" 2>/dev/null
    for _ in $(seq 100); do
      any_running "${pids[@]}" || break
      sleep 0.1
    done
    kill -9 "${pids[@]}" 2>/dev/null
    for pid in "${pids[@]}"; do
      # Only a process that is still there can be waited for: bash may have
      # reaped one already (a child that died while a trap ran), and then
      # `wait PID` would block until no child at all is left.
      [ -e /proc/"$pid" ] && wait "$pid" 2>/dev/null
      status_of[${task_of[$pid]}]=stopped
      unset "task_of[$pid]"
    done
  fi
  [ -n "${tail_pid:-}" ] && kill "$tail_pid" 2>/dev/null
  tail_pid=""
}

print_summary() {
  local task
  echo "launch: summary (--restart_policy=$restart_policy, logs in $logdir)"
  printf '  %-14s %-42s %s\n' TASK STATUS RESTARTS
  for task in "${started[@]}"; do
    printf '  %-14s %-42s %s%s\n' "$task" "${status_of[$task]}" "${restarts_of[$task]}" \
      "$([ "$task" = "$failed_task" ] && echo '   <- made the job fail')"
  done
  if [ -n "$failed_task" ]; then
    echo "launch: the job failed: task $failed_task $failure"
  fi
}

# A signal only sets caught_signal: the main loop then stops everything at
# top level (waiting for children from inside a trap handler can hang bash).
caught_signal=""
trap 'caught_signal=INT' INT
trap 'caught_signal=TERM' TERM
trap 'caught_signal=HUP' HUP

# Ends the launcher after a signal: stop everything, summary, 128 + signal.
exit_on_signal() {
  local code=129 what="hung up"
  [ "$caught_signal" = INT ] && code=130 what=interrupted
  [ "$caught_signal" = TERM ] && code=143 what=terminated
  echo "launch: $what: stopping every task" >&2
  stop_all
  print_summary
  exit "$code"
}

while read -r job index address; do
  if ! lives_here "$address"; then
    echo "launch: not starting $job/$index ($address): another host's task; start it there (or --all_hosts)"
    continue
  fi
  if [ "$job" != ps ] && [ "$job" != worker ] && [ "$job" != chief ] && [ "$job" != evaluator ]; then
    echo "launch: skipping $job/$index: psrt has no $job binary yet" >&2
    continue
  fi
  task="$job/$index"
  started+=("$task")
  restarts_of[$task]=0
  start_task "$task"
  echo "launch: started $task on $address (pid $!, log $(log_of "$task")${gpus_of[$task]:+, GPUs ${gpus_of[$task]}})"
  [ "$task" = "$chief_job/0" ] && chief_log="$(log_of "$task")"
done <<<"$tasks"

if [ ${#started[@]} -eq 0 ]; then
  echo "launch: no task of $spec lives on this host (use --all_hosts?)" >&2
  exit 2
fi
if [ -n "$chief_log" ]; then
  # Started from a command substitution, so that it is not the launcher's
  # child (bash's waits end when no child is left); --pid: it ends with the
  # launcher, however the launcher ends.
  exec 3>&1
  tail_pid=$(tail --pid=$$ -n +1 -F "$chief_log" 2>/dev/null >&3 & echo $!)
  exec 3>&-
fi

# Waits until a task or a backoff timer ends; sets `finished` to its pid and
# `code` to its exit status; returns 1 when a signal came first. It polls
# instead of blocking in `wait -n`: bash reaps a child that dies while the
# launcher runs another command (two tasks killed at once: the second dies
# while the first is handled), and `wait -n` then never reports it, though
# `wait PID` still returns its status. So every task and timer is looked at
# (`kill -0`) five times a second, and a gone one's status taken with `wait PID`.
wait_for_any() {
  local pid
  while true; do
    [ -n "$caught_signal" ] && return 1
    for pid in "${!task_of[@]}" "${!timer_of[@]}"; do
      if ! kill -0 "$pid" 2>/dev/null; then
        # (2>/dev/null: bash's own "PID Killed" notice; the launcher says it better.)
        wait "$pid" 2>/dev/null
        code=$? finished=$pid
        return
      fi
    done
    sleep 0.2
  done
}

while [ ${#task_of[@]} -gt 0 ] || [ ${#timer_of[@]} -gt 0 ]; do
  [ -n "$caught_signal" ] && exit_on_signal
  wait_for_any || exit_on_signal
  if [ -n "${timer_of[$finished]:-}" ]; then  # A backoff ended: restart.
    task="${timer_of[$finished]}"
    unset "timer_of[$finished]"
    restarts_of[$task]=$((restarts_of[$task] + 1))
    echo "=== restart ${restarts_of[$task]} of task $task (exit code ${last_code_of[$task]}) ===" \
      >>"$(log_of "$task")"
    start_task "$task" append
    echo "launch: restarted $task (restart ${restarts_of[$task]} of at most $max_restarts, pid $!)"
    continue
  fi
  task="${task_of[$finished]}"
  unset "task_of[$finished]"
  if [ "$code" -eq 0 ]; then
    status_of[$task]=succeeded
    echo "launch: task $task finished"
    if [ "$task" = "$chief_job/0" ] && [ $job_done -eq 0 ]; then
      job_done=1
      cancel_restarts
    fi
    continue
  fi
  last_code_of[$task]=$code
  verdict="$(restart_verdict "$code" "$task")"
  [ $job_done -eq 1 ] && verdict="nothing is restarted after the chief succeeded"
  if [ "$verdict" = retry ]; then
    status_of[$task]=restarting
    delay="$(awk -v b="$backoff_secs" -v n="${restarts_of[$task]}" -v m="$max_backoff_secs" \
      'BEGIN { d = b * 2 ^ n; if (d > m) d = m; print d }')"
    echo "launch: task $task exited ($(describe_exit "$code")); restarting it in ${delay}s" >&2
    sleep "$delay" &
    timer_of[$!]="$task"
    continue
  fi
  status_of[$task]="failed ($(describe_exit "$code"))"
  if [ "$ps_replicated" = 1 ] && [ "${task%/*}" = ps ] && [ $job_done -eq 0 ]; then
    # Its shards' backups serve them; the workers fail if they cannot.
    status_of[$task]="lost ($(describe_exit "$code"))"
    echo "launch: task $task exited ($(describe_exit "$code")), not restarted: $verdict;" \
         "the backups of its shards serve them (--ps_replicas)" >&2
    continue
  fi
  if [ "$workers_elastic" = 1 ] && [ "${task%/*}" = worker ] && [ "$task" != "$chief_job/0" ] &&
     [ "$code" -ge 128 ] && [ $job_done -eq 0 ]; then
    status_of[$task]="lost ($(describe_exit "$code"))"
    echo "launch: task $task exited ($(describe_exit "$code")), not restarted: $verdict;" \
         "the chief drops it from the elastic workers (--max_workers)" >&2
    continue
  fi
  failed_task="$task"
  failure="failed with $(describe_exit "$code"), not restarted: $verdict"
  sleep 0.2
  echo "launch: task $task failed with exit code $code ($verdict); its log ($(log_of "$task")) ends:" >&2
  tail -n 15 "$(log_of "$task")" | sed 's/^/    /' >&2
  echo "launch: stopping the other tasks" >&2
  stop_all
  print_summary
  exit 1
done
sleep 0.2
[ -n "${tail_pid:-}" ] && kill "$tail_pid" 2>/dev/null
print_summary
echo "launch: all tasks finished; logs in $logdir"
exit 0
