#!/usr/bin/env bash
# Installs psrt's dependencies (Debian packages, Fashion-MNIST included) and
# builds everything into build/ with ccache and -j2. Idempotent: when nothing
# changed it only checks and returns.
#
#   scripts/setup.sh            # Release build in build/
#   BUILD_DIR=out scripts/setup.sh
#   scripts/setup.sh --no-build [PACKAGE...]
#                               # the packages only (and these others)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
build=1
extra=()
if [ "${1:-}" = --no-build ]; then
  build=0
  shift
  extra=("$@")
fi

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libeigen3-dev libabsl-dev libgflags-dev libgoogle-glog-dev
  libgtest-dev libgmock-dev zlib1g-dev openssl prometheus-cpp-dev
  libjpeg62-turbo-dev libpng-dev  # worker/image_decoder.cc
  libhdf5-dev  # models/keras_weights_file.cc: Keras .weights.h5 files
  dataset-fashion-mnist
  iproute2  # ip netns, for tests/fault/netns_cluster.sh
  python3-yaml  # scripts/k8s_local.sh reads the Kubernetes manifests
  slurmctld slurmd slurm-client  # scripts/slurm/local_slurm.sh, tests/integration/slurm_test.cc
  openmpi-bin  # mpirun: tests/integration/mpirun_test.cc, scripts/run_mpi_example.sh
  "${extra[@]}"
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# nvcc lives outside PATH in the CUDA toolkit's usual place.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

[ "$build" -eq 1 ] || exit 0
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
cmake --build "$BUILD_DIR" -j2
