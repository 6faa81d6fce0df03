#!/usr/bin/env bash
# The body of psrt's batch scripts (scripts/slurm/*.sbatch): one srun step
# of psrt_task.sh over the job's tasks (every component of a heterogeneous
# job), and a requeue when it fails.
#
#   psrt_job.sh [psrt_task.sh flags] -- [psrt_worker flags]
#
# The step runs with --kill-on-bad-exit: a task that fails (a crash, a
# kill -9, a device fault) ends the step at once instead of leaving the
# others waiting for it. The job then requeues itself (scontrol requeue; at
# most PSRT_MAX_REQUEUES times, default 3, counted by SLURM_RESTART_COUNT),
# and its next run resumes from the newest checkpoint (the sbatch scripts
# keep checkpoints in the submit directory, under the job's id, which a
# requeued job keeps). A task that exited with a code of 1-127 (bad flags, bad
# data, no cluster: errors a rerun repeats) fails the job without a requeue,
# as the launcher's ExitCode policy does; srun's own exit status cannot tell
# (it is 143 once the step's other tasks are terminated), so its report of
# each task ("task 2: Exited with exit code 1", "tasks 0-1: ...") decides. Exit status: the
# step's.
set -uo pipefail
# The checkout this script is in (the sbatch scripts run it by its path).
root="${PSRT_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}"
if [ ! -x "$root/scripts/slurm/psrt_task.sh" ]; then
  echo "psrt_job: $root/scripts/slurm/psrt_task.sh not found: set PSRT_ROOT to the psrt" \
       "checkout" >&2
  exit 2
fi
restarts="${SLURM_RESTART_COUNT:-0}"
echo "psrt_job: job ${SLURM_JOB_ID:-?} run $((restarts + 1)) on ${SLURM_JOB_NODELIST:-?}"
components=()
if [ "${SLURM_HET_SIZE:-1}" -gt 1 ]; then
  # A heterogeneous job: one step over every component, ranks in component order.
  components=(--het-group="$(seq -s, 0 $((SLURM_HET_SIZE - 1)))")
fi
report="$(mktemp)"
trap 'rm -f "$report"' EXIT
{
  srun "${components[@]}" --kill-on-bad-exit=1 --label "$root/scripts/slurm/psrt_task.sh" "$@" \
    2>&1 >&3 3>&- | tee "$report" >&2
  code=${PIPESTATUS[0]}
} 3>&1
[ $code -eq 0 ] && exit 0
permanent="$(grep -m1 -E '^srun: error: .*: tasks? [0-9,-]+: Exited with exit code ([1-9]|[1-9][0-9]|1[01][0-9]|12[0-7])$' \
  "$report" | sed 's/^srun: error: //')"
if [ -n "$permanent" ]; then
  echo "psrt_job: the step failed (exit code $code); not requeued: $permanent, an error" \
       "a rerun would repeat (exit codes 1-127; see the task's log above)"
elif [ "$restarts" -lt "${PSRT_MAX_REQUEUES:-3}" ]; then
  echo "psrt_job: the step failed (exit code $code); requeueing job $SLURM_JOB_ID" \
       "(requeue $((restarts + 1)) of at most ${PSRT_MAX_REQUEUES:-3})"
  scontrol requeue "$SLURM_JOB_ID"
else
  echo "psrt_job: the step failed (exit code $code); not requeued: it was requeued" \
       "$restarts times already (PSRT_MAX_REQUEUES)"
fi
exit $code
