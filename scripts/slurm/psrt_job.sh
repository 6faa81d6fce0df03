#!/usr/bin/env bash
# The body of psrt's batch scripts (scripts/slurm/*.sbatch): one srun step
# of psrt_task.sh over the job's tasks, and a requeue when it fails.
#
#   psrt_job.sh [psrt_task.sh flags] -- [psrt_worker flags]
#
# The step runs with --kill-on-bad-exit: a task that fails (a crash, a
# kill -9, a device fault) ends the step at once instead of leaving the
# others waiting for it. The job then requeues itself (scontrol requeue; at
# most PSRT_MAX_REQUEUES times, default 3, counted by SLURM_RESTART_COUNT),
# and its next run resumes from the newest checkpoint (the sbatch scripts
# keep checkpoints in the submit directory, under the job's id, which a
# requeued job keeps). Exit status: the step's.
set -uo pipefail
root="${PSRT_ROOT:-${SLURM_SUBMIT_DIR:-.}}"
if [ ! -x "$root/scripts/slurm/psrt_task.sh" ]; then
  echo "psrt_job: $root/scripts/slurm/psrt_task.sh not found: submit from the psrt checkout" \
       "or set PSRT_ROOT" >&2
  exit 2
fi
restarts="${SLURM_RESTART_COUNT:-0}"
echo "psrt_job: job ${SLURM_JOB_ID:-?} run $((restarts + 1)) on ${SLURM_JOB_NODELIST:-?}"
srun --kill-on-bad-exit=1 --label "$root/scripts/slurm/psrt_task.sh" "$@"
code=$?
if [ $code -ne 0 ]; then
  if [ "$restarts" -lt "${PSRT_MAX_REQUEUES:-3}" ]; then
    echo "psrt_job: the step failed (exit code $code); requeueing job $SLURM_JOB_ID" \
         "(requeue $((restarts + 1)) of at most ${PSRT_MAX_REQUEUES:-3})"
    scontrol requeue "$SLURM_JOB_ID"
  else
    echo "psrt_job: the step failed (exit code $code); not requeued: it was requeued" \
         "$restarts times already (PSRT_MAX_REQUEUES)"
  fi
fi
exit $code
