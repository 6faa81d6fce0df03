#!/usr/bin/env bash
# The main example through a real Slurm on this machine: installs and builds
# (scripts/setup.sh, Slurm included), starts a local Slurm of three nodes
# (scripts/slurm/local_slurm.sh), runs 2 ps + 2 workers in one srun step
# (scripts/slurm/psrt_task.sh: the cluster comes from Slurm's variables),
# trains the MLP on Fashion-MNIST with scripts/run_example.sh's recipe, stops
# Slurm and prints the chief's
#   final: global_step=N test_accuracy=A
#
#   scripts/run_slurm_example.sh [extra worker flags, e.g. --train_steps=4000]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
dir="${PSRT_LOGDIR:-$(mktemp -d /tmp/psrt_slurm_example.XXXXXX)}"
scripts/slurm/local_slurm.sh start "$dir/slurm"
trap 'scripts/slurm/local_slurm.sh stop "$dir/slurm"' EXIT
echo "local Slurm in $dir/slurm; the job's output in $dir/job.log"
# Ranks 0-1 are ps/0-1, rank 2 the chief (worker/0), rank 3 worker/1.
SLURM_CONF="$dir/slurm/slurm.conf" srun --nodes=3 --ntasks=4 --kill-on-bad-exit=1 --label \
  scripts/slurm/psrt_task.sh --ps 2 -- \
  --sync_replicas --model=mlp --batch_size=100 --train_steps=3000 \
  --optimizer=momentum --learning_rate=0.02 --momentum=0.9 \
  --log_every_steps=250 "$@" 2>&1 | tee "$dir/job.log" | grep -v 'final:'
grep 'final:' "$dir/job.log" | sed 's/^ *[0-9]*: //'
