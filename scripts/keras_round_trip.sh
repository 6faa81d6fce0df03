#!/usr/bin/env bash
# Trained models go back to Keras, checked: for a Sequential CNN and a
# Functional network with batch norms (scripts/peers/keras_round_trip.py
# writes both model files), psrt trains the file through 1 ps + 2 workers
# on Fashion-MNIST (sync, 50 steps, a checkpoint at the end), exports the
# checkpoint as Keras weights (psrt_export_checkpoint --keras_weights) and
# as psrt's variables (--out); Keras loads the weights into
# model_from_json(file) and its predictions of the first --images test
# images must match psrt's evaluation of the same checkpoint (psrt_predict)
# within 1e-5. Then a job started from the exported weights
# (--init_from_keras_weights, 0 steps) must hold the trained model: its
# final evaluation is the first job's, to the last digit.
#
#   scripts/keras_round_trip.sh [--steps N] [--images N] [--work DIR]
#
# Needs Keras (scripts/keras_venv.sh installs tensorflow-cpu into a cached
# virtual environment) and a built tree (scripts/setup.sh). Prints a
# "round_trip:" line per model; exits non-zero when one does not match.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=50
images=200
work=""
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --images) images=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "keras_round_trip.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
bin="${PSRT_BIN_DIR:-build/bin}"
for b in psrt_ps psrt_worker psrt_export_checkpoint psrt_predict; do
  [ -x "$bin/$b" ] || { echo "keras_round_trip.sh: $bin/$b not built (run scripts/setup.sh)" >&2; exit 2; }
done
data=/usr/share/datasets/fashion-mnist
. scripts/keras_venv.sh
[ -n "$work" ] || work=$(mktemp -d /tmp/psrt_keras_round_trip.XXXXXX)
mkdir -p "$work"
"$keras_venv/bin/python" scripts/peers/keras_round_trip.py models "$work" 2> "$work/keras.err" \
  || { cat "$work/keras.err" >&2; exit 1; }

failed=0
for name in sequential_cnn functional_bn; do
  dir="$work/$name"
  rm -rf "$dir" && mkdir -p "$dir"
  scripts/make_cluster_spec.sh --ps 1 --workers 2 --out "$dir/cluster.json"
  scripts/launch.sh --cluster_spec "$dir/cluster.json" --logdir "$dir/logs" \
      --checkpoint_dir "$dir/ckpt" -- \
      --model_file="$work/$name.json" --data_dir="$data" --sync_replicas --batch_size=50 \
      --optimizer=momentum --learning_rate=0.05 --train_steps="$steps" \
      --save_checkpoint_steps="$steps" > "$dir/train.log" 2>&1 \
      || { echo "keras_round_trip.sh: training $name failed: $dir/train.log" >&2; exit 1; }
  grep "final:" "$dir/train.log" | tail -1
  "$bin/psrt_export_checkpoint" --checkpoint_dir="$dir/ckpt" --out="$dir/psrt.safetensors" \
      --keras_weights="$dir/$name.weights.h5" --model_file="$work/$name.json"
  "$bin/psrt_predict" --model_file="$work/$name.json" --params="$dir/psrt.safetensors" \
      --data_dir="$data" --count="$images" > "$dir/psrt_predictions.txt"
  # TensorFlow's start-up lines go to keras.err.
  "$keras_venv/bin/python" scripts/peers/keras_round_trip.py check "$work/$name.json" \
      "$dir/$name.weights.h5" "$dir/psrt_predictions.txt" "$data" 2> "$dir/keras.err" \
      || { failed=1; cat "$dir/keras.err" >&2; }

  # Back again: a new job from the exported weights starts where this one ended.
  scripts/make_cluster_spec.sh --ps 1 --workers 1 --out "$dir/cluster2.json"
  scripts/launch.sh --cluster_spec "$dir/cluster2.json" --logdir "$dir/logs2" -- \
      --model_file="$work/$name.json" --data_dir="$data" --batch_size=50 --train_steps=0 \
      --init_from_keras_weights="$dir/$name.weights.h5" \
      > "$dir/init.log" 2>&1 \
      || { echo "keras_round_trip.sh: the job from $name's weights failed: $dir/init.log" >&2; exit 1; }
  trained=$(grep -o "test_accuracy=[0-9.]*" "$dir/train.log" | tail -1 | cut -d= -f2)
  started=$(grep -o "final: global_step=0 test_accuracy=[0-9.]*" "$dir/init.log" | cut -d= -f3)
  echo "init_from_keras_weights: model=$name trained_accuracy=$trained started_accuracy=$started"
  [ -n "$started" ] && [ "$started" = "$trained" ] || failed=1
done
exit $failed
