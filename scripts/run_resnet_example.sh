#!/usr/bin/env bash
# The ResNet example: ResNet-50 (models/zoo.h) trained through the image
# pipeline with 1 ps + 2 workers in synchronous mode, at 64x64 so that it
# fits 2 cores: generates a folder of JPEGs whose 8 classes are told apart
# by color, stripes and shape (psrt_make_images), converts it to
# build_image_data.py TFRecords (scripts/images_to_tfrecord.sh --skip_bad:
# a file that cannot be decoded is left out and listed, not fatal), and
# trains on 64x64 random crops and flips; the chief evaluates central crops
# of the validation split and prints
#   final: global_step=N test_accuracy=A
# (chance is 0.125). A few minutes on 2 cores.
#
#   scripts/run_resnet_example.sh [extra worker flags, e.g. --train_steps=300]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${PSRT_SKIP_SETUP:-}" ] || scripts/setup.sh
bin="${PSRT_BIN_DIR:-build/bin}"
logdir="${PSRT_LOGDIR:-$(mktemp -d /tmp/psrt_resnet.XXXXXX)}"
"$bin/psrt_make_images" --out="$logdir/images" --classes=8 --per_class=100 --size=72
scripts/images_to_tfrecord.sh --in "$logdir/images" --out "$logdir/records" \
  --train_shards 4 --validation_percent 20 --skip_bad
spec="$logdir/cluster.json"
scripts/make_cluster_spec.sh --ps 1 --workers 2 --out "$spec"
# The chief's log streams through the launcher; its final line is repeated
# last, for scripts that read the last line.
scripts/launch.sh --cluster_spec "$spec" --logdir "$logdir" -- \
  --sync_replicas --model=resnet50 --num_classes=8 \
  --train_data="$logdir/records/train-*" --test_data="$logdir/records/validation-*" \
  --input_height=64 --input_width=64 --input_channels=3 --input_threads=1 \
  --batch_size=16 --train_steps=150 --optimizer=momentum --learning_rate=0.02 \
  --momentum=0.9 --log_every_steps=25 --eval_every_steps=75 --intra_op_threads=1 --progress=log \
  "$@" | grep -v '^final:'
grep '^final:' "$logdir/worker-0.log"
