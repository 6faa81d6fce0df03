#!/usr/bin/env bash
# Converts an MNIST-format data set (IDX files) into TFRecord files of
# tf.train.Example, as TensorFlow's convert_to_records.py does: features
# image_raw, label, height, width, depth; OUT_DIR/train.tfrecords and
# OUT_DIR/test.tfrecords (or train.tfrecords-00000-of-0000N, ... with
# --num_files N).
#
#   scripts/idx_to_tfrecord.sh [--data_dir DIR] [--out_dir DIR]
#       [--compression none|gzip] [--num_files N]
#
# --data_dir defaults to /usr/share/datasets/fashion-mnist (installed by
# scripts/setup.sh), --out_dir to ./fashion-mnist-tfrecord. psrt reads the
# result as a file, a comma-separated list, a directory or a glob pattern
# (quoted: 'OUT_DIR/train.tfrecords-*').
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${PSRT_BIN_DIR:-$root/build/bin}"
data_dir=/usr/share/datasets/fashion-mnist
out_dir=fashion-mnist-tfrecord
compression=none
num_files=1
while [ $# -gt 0 ]; do
  case "$1" in
    --data_dir|--out_dir|--compression|--num_files)
      [ $# -ge 2 ] || { echo "idx_to_tfrecord.sh: $1 needs a value" >&2; exit 2; }
      declare "${1#--}=$2"; shift 2 ;;
    --data_dir=*|--out_dir=*|--compression=*|--num_files=*)
      arg="${1#--}"; declare "${arg%%=*}=${arg#*=}"; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "idx_to_tfrecord.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ ! -x "$bin/psrt_idx_to_tfrecord" ]; then
  echo "idx_to_tfrecord.sh: $bin/psrt_idx_to_tfrecord is missing; build with scripts/setup.sh" >&2
  exit 1
fi
mkdir -p "$out_dir"
for pair in train:train t10k:test; do
  split="${pair%%:*}"
  name="${pair#*:}"
  "$bin/psrt_idx_to_tfrecord" --data_dir="$data_dir" --split="$split" \
    --out="$out_dir/$name.tfrecords" --compression="$compression" \
    --num_files="$num_files"
done
