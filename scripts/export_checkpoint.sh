#!/usr/bin/env bash
# Merges the shards of one psrt checkpoint into a single safetensors file of
# the model's variables (partitioned variables reassembled, sorted by name),
# or into the weights file of the Keras model file the job trained, which
# Keras's model.load_weights reads.
#
#   scripts/export_checkpoint.sh --checkpoint_dir=DIR --out=FILE
#       [--step=N] [--moving_average] [--num_shards=K]
#   scripts/export_checkpoint.sh --checkpoint_dir=DIR --keras_weights=OUT.weights.h5
#       --model_file=MODEL.json [--step=N] [--moving_average]
#
# --step defaults to the newest step in every shard's index, --num_shards to
# the count in the index file names (of several, after a job resumed with
# other ps tasks: the count of the newest step). See
# build/bin/psrt_export_checkpoint --help.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${PSRT_BIN_DIR:-$root/build/bin}"
case "${1:-}" in
  -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
esac
if [ ! -x "$bin/psrt_export_checkpoint" ]; then
  echo "export_checkpoint.sh: $bin/psrt_export_checkpoint not built (run scripts/setup.sh)" >&2
  exit 2
fi
exec "$bin/psrt_export_checkpoint" "$@"
