#!/usr/bin/env bash
# The image example: generates a folder of JPEGs whose 8 classes are told
# apart by color, stripes and shape (psrt_make_images), converts it to
# build_image_data.py TFRecords (scripts/images_to_tfrecord.sh), and trains
# inception_mini on 32x32 RGB crops of it with 1 ps + 2 workers in
# synchronous mode: the workers decode their own shard (by file) on their
# own threads, with random crops and flips; the chief evaluates central
# crops of the validation split and prints
#   final: global_step=N test_accuracy=A
# (chance is 0.125). A couple of minutes on 2 cores.
#
#   scripts/run_inception_example.sh [extra worker flags, e.g. --train_steps=400]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${PSRT_SKIP_SETUP:-}" ] || scripts/setup.sh
bin="${PSRT_BIN_DIR:-build/bin}"
logdir="${PSRT_LOGDIR:-$(mktemp -d /tmp/psrt_inception.XXXXXX)}"
"$bin/psrt_make_images" --out="$logdir/images" --classes=8 --per_class=100 --size=40
scripts/images_to_tfrecord.sh --in "$logdir/images" --out "$logdir/records" \
  --train_shards 4 --validation_percent 20
spec="$logdir/cluster.json"
scripts/make_cluster_spec.sh --ps 1 --workers 2 --out "$spec"
# The chief's log streams through the launcher; its final line is repeated
# last, for scripts that read the last line.
scripts/launch.sh --cluster_spec "$spec" --logdir "$logdir" -- \
  --sync_replicas --model=inception_mini --num_classes=8 \
  --train_data="$logdir/records/train-*" --test_data="$logdir/records/validation-*" \
  --input_height=32 --input_width=32 --input_channels=3 --input_threads=1 \
  --batch_size=32 --train_steps=300 --optimizer=momentum --learning_rate=0.05 \
  --momentum=0.9 --log_every_steps=50 --eval_every_steps=100 --intra_op_threads=1 --progress=log \
  "$@" | grep -v '^final:'
grep -h "input wait" "$logdir"/worker-*.log | sed 's/^.*\] /input: /' || true
grep '^final:' "$logdir/worker-0.log"
