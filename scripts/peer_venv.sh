# Sourced by the benchmark scripts: sets $venv to a virtual environment
# (outside the repository, reused) holding current PyTorch from PyPI, with
# torchvision and numpy, installing it the first time (several GB):
# $PSRT_BENCH_VENV, default ~/.cache/psrt-bench/torch-venv. Not Debian's
# python3-torch 1.13, which runs pathologically slowly on AVX2-only CPUs and
# would make every ratio meaningless.
venv="${PSRT_BENCH_VENV:-$HOME/.cache/psrt-bench/torch-venv}"
if ! "$venv/bin/python" -c "import torch, torchvision, numpy" 2>/dev/null; then
  echo "installing PyTorch from PyPI into $venv (once; several GB)" >&2
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q torch torchvision numpy
fi
"$venv/bin/python" -c 'import torch; print("peer: torch", torch.__version__,
  "cpu", torch.backends.cpu.get_cpu_capability())' >&2
