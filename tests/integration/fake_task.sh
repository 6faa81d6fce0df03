#!/usr/bin/env bash
# A stand-in for psrt_ps and psrt_worker in the launcher's tests: it does what
# a plan says instead of training, so restart policies can be tested exactly.
#
#   FAKE_PLAN="worker/1=137,0 ps/0=hang" FAKE_STATE_DIR=DIR fake_task.sh \
#       --job_name=worker --task_index=1 [other flags, ignored]
#
# The n-th start of task JOB/I ends as the n-th entry of its plan says (the
# last entry repeats; a task the plan does not name runs "0"):
#   CODE[@SECS]  run SECS seconds (default 0.3), then exit with CODE; codes
#                129-159 die by signal CODE-128, as a crash would
#   hang         run until killed
# Starts are counted in DIR/JOB-I.starts; each start prints its entry, and
# with FAKE_SHOW_ENV=1 a second line: its CUDA_VISIBLE_DEVICES (or "unset")
# and arguments.
set -u
job="" index=""
for arg in "$@"; do
  case "$arg" in
    --job_name=*) job="${arg#*=}" ;;
    --task_index=*) index="${arg#*=}" ;;
  esac
done
task="$job/$index"
state="${FAKE_STATE_DIR:?FAKE_STATE_DIR must name a directory}/$job-$index.starts"
starts=$(($(cat "$state" 2>/dev/null || echo 0) + 1))
echo "$starts" >"$state"

plan="0"
for item in ${FAKE_PLAN:-}; do
  [ "${item%%=*}" = "$task" ] && plan="${item#*=}"
done
IFS=, read -r -a entries <<<"$plan"
entry="${entries[$((starts <= ${#entries[@]} ? starts - 1 : ${#entries[@]} - 1))]}"
echo "fake $task: start $starts: $entry"
if [ -n "${FAKE_SHOW_ENV:-}" ]; then
  echo "fake $task: CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset} args: $*"
fi

if [ "$entry" = hang ]; then
  # exec: the launcher's SIGTERM reaches the sleep itself.
  exec sleep 1000
fi
code="${entry%@*}"
secs=0.3
[[ "$entry" == *@* ]] && secs="${entry#*@}"
sleep "$secs"
if [ "$code" -gt 128 ] && [ "$code" -lt 160 ]; then
  kill -s $((code - 128)) $$
fi
exit "$code"
