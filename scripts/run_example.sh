#!/usr/bin/env bash
# The main example, from a fresh machine: installs and builds (scripts/setup.sh),
# writes a cluster spec of 2 ps + 2 workers on 127.0.0.1, launches it, trains
# the MLP on Fashion-MNIST in synchronous mode and prints the chief's
#   final: global_step=N test_accuracy=A
#
#   scripts/run_example.sh [extra worker flags, e.g. --train_steps=4000]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
logdir="${PSRT_LOGDIR:-$(mktemp -d /tmp/psrt_example.XXXXXX)}"
spec="$logdir/cluster.json"
scripts/make_cluster_spec.sh --ps 2 --workers 2 --out "$spec"
echo "cluster spec $spec:"
cat "$spec"
# The chief's log streams through the launcher; its final line is repeated
# last, for scripts that read the last line.
scripts/launch.sh --cluster_spec "$spec" --logdir "$logdir" -- \
  --sync_replicas --model=mlp --batch_size=100 --train_steps=3000 \
  --optimizer=momentum --learning_rate=0.02 --momentum=0.9 \
  --log_every_steps=250 "$@" | grep -v '^final:'
grep '^final:' "$logdir/worker-0.log"
