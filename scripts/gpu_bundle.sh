#!/usr/bin/env bash
# Builds psrt for one GPU architecture in its own build folder and packs what
# a GPU machine without psrt's Debian packages needs into one folder: the
# stripped binaries and tests that touch the GPU, libpsrt_kernels_cuda.so,
# and every shared library they load that is neither the C/C++ runtime nor
# CUDA's (the GPU machine brings its own driver, cudart and cuBLAS).
#
#   scripts/gpu_bundle.sh [--arch 90] [--out .gpu_bundle]
#
# Then, on the GPU machine, from the repository root:
#   export LD_LIBRARY_PATH=$PWD/.gpu_bundle/lib:$LD_LIBRARY_PATH
#   .gpu_bundle/bin/gpu_model_test && .gpu_bundle/bin/towers_test
#   PSRT_BIN_DIR=$PWD/.gpu_bundle/bin scripts/bench_gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
arch=90 out=.gpu_bundle
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "gpu_bundle.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
scripts/setup.sh >/dev/null  # The packages (and the CPU build).
export PATH=/usr/local/cuda/bin:$PATH
build="build-sm$arch"
[ -f "$build/build.ninja" ] ||
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES="$arch"
targets=(psrt_ps psrt_worker psrtctl step_bench pushpull_bench gpu_model_test
         towers_test ops_cuda_test layers_cuda_test psrt_kernels_cuda)
cmake --build "$build" -j2 --target "${targets[@]}"
rm -rf "$out" && mkdir -p "$out/bin" "$out/lib"
for t in "${targets[@]}"; do
  f="$build/bin/$t"
  [ "$t" = psrt_kernels_cuda ] && f="$build/bin/libpsrt_kernels_cuda.so"
  cp "$f" "$out/bin/" && strip "$out/bin/$(basename "$f")"
done
ldd "$out"/bin/* 2>/dev/null | awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*|libcuda|libcudart|libcublas[^/]*)\.so' |
  while read -r lib; do cp -L "$lib" "$out/lib/"; done
du -sh "$out"
