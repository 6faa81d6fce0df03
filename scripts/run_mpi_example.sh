#!/usr/bin/env bash
# The main example in allreduce mode through mpirun, as Horovod's users
# launch: installs and builds (scripts/setup.sh, OpenMPI included), runs 2
# psrt_worker processes with mpirun (no cluster spec: they meet at a
# rendezvous, common/rendezvous.h, from mpirun's ranks), trains the MLP on
# Fashion-MNIST with scripts/run_example.sh's recipe and prints the chief's
#   final: global_step=N test_accuracy=A
#
#   scripts/run_mpi_example.sh [extra worker flags, e.g. --train_steps=4000]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
dir="${PSRT_LOGDIR:-$(mktemp -d /tmp/psrt_mpi_example.XXXXXX)}"
echo "the job's output in $dir/job.log"
# mpirun refuses root unless told; --oversubscribe: more ranks than cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun --oversubscribe -np 2 build/bin/psrt_worker \
  --coordinator=127.0.0.1:"${PSRT_COORDINATOR_PORT:-23456}" --advertise_host=127.0.0.1 \
  --task_port="${PSRT_TASK_PORT:-23460}" \
  --model=mlp --batch_size=100 --train_steps=3000 \
  --optimizer=momentum --learning_rate=0.02 --momentum=0.9 \
  --log_every_steps=250 "$@" 2>&1 | tee "$dir/job.log" | grep -v '^final:'
grep '^final:' "$dir/job.log"
