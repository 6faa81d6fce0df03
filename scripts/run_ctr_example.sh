#!/usr/bin/env bash
# The CTR example: Wide & Deep (models/ctr_models.h) trained through 2 ps +
# 2 sync workers on 127.0.0.1, its embedding tables sharded over both ps
# tasks (docs/sparse.md). Generates Criteo-format click logs from a planted
# model (psrt_make_criteo: 500,000 training and 50,000 test lines, Zipf ids
# over 26 categorical fields, 13 counts), trains one epoch, and ends with
# the chief's
#   final: global_step=N test_auc=A test_logloss=L
# beside the planted model's best AUC (the `criteo: ... planted_auc=` line
# of the test file). About a minute on 2 cores once built.
#
#   scripts/run_ctr_example.sh [extra worker flags, e.g. --model=dlrm]
#   PSRT_CTR_ROWS=100000 scripts/run_ctr_example.sh   # a smaller file
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${PSRT_SKIP_SETUP:-}" ] || scripts/setup.sh
bin="${PSRT_BIN_DIR:-build/bin}"
logdir="${PSRT_LOGDIR:-$(mktemp -d /tmp/psrt_ctr.XXXXXX)}"
rows="${PSRT_CTR_ROWS:-500000}"
batch=256
workers=2
"$bin/psrt_make_criteo" --out="$logdir/train.gz" --rows="$rows" --seed=1
"$bin/psrt_make_criteo" --out="$logdir/test.gz" --rows=$((rows / 10)) --seed=2
spec="$logdir/cluster.json"
scripts/make_cluster_spec.sh --ps 2 --workers "$workers" --out "$spec"
# One epoch: every worker reads every 2nd line, a global step one batch of each.
steps=$((rows / (batch * workers)))
# The chief's log streams through the launcher; its final line is repeated
# last, for scripts that read the last line.
scripts/launch.sh --cluster_spec "$spec" --logdir "$logdir" -- \
  --sync_replicas --model=wide_deep --data_format=criteo \
  --train_data="$logdir/train.gz" --test_data="$logdir/test.gz" \
  --hidden_units=256,128 --embedding_dim=16 --optimizer=adagrad --learning_rate=0.1 \
  --sparse_learning_rate=0.5 --batch_size=$batch --train_steps=$steps \
  --log_every_steps=200 --progress=log "$@" | grep -v '^final:'
grep '^final:' "$logdir/worker-0.log"
