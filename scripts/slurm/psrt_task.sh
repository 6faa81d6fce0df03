#!/usr/bin/env bash
# One task of a psrt job under srun: it finds the job's cluster from Slurm's
# variables alone and runs psrt_ps or psrt_worker in its place.
#
#   srun [--kill-on-bad-exit=1] scripts/slurm/psrt_task.sh [--ps N]
#       [--base_port P] [--ps_flags "FLAGS"] -- [psrt_worker flags]
#
# Ranks 0..N-1 (default 1) are the ps tasks, run with --ps_flags; the
# others are workers, worker/0 (rank N) the chief; --ps 0 is an allreduce
# job. A task listens on its node's name at P (default PSRT_BASE_PORT, or
# 2222) plus its rank on that node. `psrtctl slurm_env` reads the variables
# (common/slurm_cluster.h) and its errors name the one at fault; the task
# exits 2 on them. PSRT_BIN_DIR overrides the binaries' folder.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${PSRT_BIN_DIR:-$root/build/bin}"
num_ps=1 base_port="${PSRT_BASE_PORT:-2222}" ps_flags=""
while [ $# -gt 0 ]; do
  case "$1" in
    --ps) num_ps="$2"; shift 2 ;;
    --ps=*) num_ps="${1#*=}"; shift ;;
    --base_port) base_port="$2"; shift 2 ;;
    --base_port=*) base_port="${1#*=}"; shift ;;
    --ps_flags) ps_flags="$2"; shift 2 ;;
    --ps_flags=*) ps_flags="${1#*=}"; shift ;;
    --) shift; break ;;
    *) echo "psrt_task: unknown argument $1 (worker flags go after --)" >&2; exit 2 ;;
  esac
done
if ! assignments="$("$bin/psrtctl" slurm_env --ps="$num_ps" --base_port="$base_port")"; then
  echo "psrt_task: rank ${SLURM_PROCID:-?}: no cluster from Slurm's variables" >&2
  exit 2
fi
PSRT_TASK_TYPE=""
eval "$assignments"
if [ "$PSRT_TASK_TYPE" = ps ]; then
  # shellcheck disable=SC2086  # --ps_flags is a list of flags.
  exec "$bin/psrt_ps" $ps_flags
fi
exec "$bin/psrt_worker" "$@"
