#!/usr/bin/env bash
# Converts a folder of images, one subfolder per class (the layout
# TensorFlow's build_image_data.py takes), into TFRecord files of
# tf.train.Example in build_image_data.py's format: image/encoded (the JPEG
# or PNG bytes as stored), image/class/label (1..N in sorted subfolder
# order; 0 unused), image/class/text, image/format, image/height,
# image/width, image/channels, image/colorspace, image/filename.
#
#   scripts/images_to_tfrecord.sh --in DIR --out DIR [--train_shards N]
#       [--validation_percent P] [--validation_shards N] [--seed S]
#       [--num_threads T] [--skip_bad]
#
# Writes OUT/train-00000-of-0000N, ... (and OUT/validation-* with
# --validation_percent), and OUT/labels.txt (the class names, line i is
# label i). psrt reads them with --train_data='OUT/train-*'
# --num_classes=N (--label_offset=1, the default, maps labels 1..N to class
# ids 0..N-1). A file that cannot be decoded stops the conversion, naming
# it; with --skip_bad it is left out, counted, and listed with its reason in
# OUT/skipped.txt. See worker/input/image_folder.h.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${PSRT_BIN_DIR:-$root/build/bin}"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --in|--out|--train_shards|--validation_percent|--validation_shards|--seed|--num_threads)
      [ $# -ge 2 ] || { echo "images_to_tfrecord.sh: $1 needs a value" >&2; exit 2; }
      args+=("$1=$2"); shift 2 ;;
    --in=*|--out=*|--train_shards=*|--validation_percent=*|--validation_shards=*|--seed=*|--num_threads=*)
      args+=("$1"); shift ;;
    --skip_bad) args+=("--skip_bad"); shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "images_to_tfrecord.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ ! -x "$bin/psrt_images_to_tfrecord" ]; then
  echo "images_to_tfrecord.sh: $bin/psrt_images_to_tfrecord is missing; build with scripts/setup.sh" >&2
  exit 1
fi
exec "$bin/psrt_images_to_tfrecord" "${args[@]}"
