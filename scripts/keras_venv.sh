# Sourced by scripts that run Keras (the Keras peer of bench_train.sh, the
# fixture generator): sets $keras_venv to a virtual environment (outside
# the repository, reused) holding tensorflow-cpu and tf_keras from PyPI,
# installing them the first time (about 1 GB): $PSRT_KERAS_VENV, default
# ~/.cache/psrt-bench/tf-venv.
keras_venv="${PSRT_KERAS_VENV:-$HOME/.cache/psrt-bench/tf-venv}"
if ! "$keras_venv/bin/python" -c "import tensorflow, keras, tf_keras" 2>/dev/null; then
  echo "installing tensorflow-cpu and tf_keras from PyPI into $keras_venv (once; about 1 GB)" >&2
  mkdir -p "$(dirname "$keras_venv")"
  python3 -m venv "$keras_venv"
  "$keras_venv/bin/pip" install -q --upgrade pip
  "$keras_venv/bin/pip" install -q tensorflow-cpu tf_keras
fi
