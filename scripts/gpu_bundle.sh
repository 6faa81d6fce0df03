#!/usr/bin/env bash
# Packs what a GPU machine without psrt's Debian packages needs, from the
# build in build/ (whose CUDA code is built for sm_80 and sm_90 already: no
# second build): the stripped binaries and tests that touch the GPU,
# libpsrt_kernels_cuda.so, and every shared library they load that is
# neither the C/C++ runtime nor CUDA's (the GPU machine brings its own
# driver, cudart and cuBLAS; scripts/gpu_first_run.sh finds them). Every
# binary's RUNPATH becomes $ORIGIN:$ORIGIN/../lib, so the bundle works from
# wherever it lands.
#
#   scripts/gpu_bundle.sh                 # .gpu_bundle/: the first-run bundle
#   scripts/gpu_bundle.sh --train         # .gpu_train/: psrt_ps, psrt_worker,
#                                         # psrtctl, their libraries and
#                                         # Fashion-MNIST's four gz files
#   scripts/gpu_bundle.sh --out DIR --max_mib N
#
# The folder is also packed as DIR.tar.gz, which is what to carry to the
# GPU machine (scripts/gpu_first_run.sh unpacks it): the libraries compress
# about 2.5x, and the device tool carries 64 MiB at most (the folder is
# over it: psrt_worker's HDF5, for Keras weights files, brings Debian's
# libcurl and its TLS, LDAP and Kerberos libraries).
# It then checks what it made, and fails if a check fails:
#   - size: DIR.tar.gz at most --max_mib MiB (40 for the bundle, 56 for
#     --train, which leaves room for the working tree beside it);
#   - ldd: every library a binary needs resolves to the bundle, to the C/C++
#     runtime, or to CUDA's libcuda, cudart and cuBLAS (found on the GPU
#     machine), and nothing else;
#   - a clean environment (env -i, only CUDA's library folder on
#     LD_LIBRARY_PATH): every binary starts (--version, or --gtest_list_tests).
# The run on a GPU machine (device tool: carry .gpu_bundle):
#   scripts/gpu_first_run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
train=0 out="" max_mib=""
while [ $# -gt 0 ]; do
  case "$1" in
    --train) train=1; shift ;;
    --out) out="$2"; shift 2 ;;
    --max_mib) max_mib="$2"; shift 2 ;;
    *) echo "gpu_bundle.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ "$train" = 1 ]; then
  out=${out:-.gpu_train} max_mib=${max_mib:-56}
  targets=(psrt_ps psrt_worker psrtctl)
else
  out=${out:-.gpu_bundle} max_mib=${max_mib:-40}
  targets=(psrt_ps psrt_worker psrtctl step_bench pushpull_bench device_test
           gpu_model_test towers_test ops_cuda_test layers_cuda_test cudnn_conv_test)
fi
scripts/setup.sh >/dev/null  # The packages and the build in build/.
if ! command -v patchelf >/dev/null; then
  apt-get install -y -q --no-install-recommends patchelf >/dev/null ||
    { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends patchelf >/dev/null; }
fi
build=build/bin
[ -f "$build/libpsrt_kernels_cuda.so" ] || {
  echo "gpu_bundle: $build/libpsrt_kernels_cuda.so is missing: the build has no CUDA (nvcc not found when it was configured)" >&2
  exit 1
}
# Hopper (the H100 and H200 lent here) runs sm_90 code; this toolkit has no
# cuobjdump to read the library, so ask the build's rules.
grep -q 'arch=compute_90,code=\[compute_90,sm_90\]' build/build.ninja || {
  echo "gpu_bundle: build/ has no sm_90 code: reconfigure with -DCMAKE_CUDA_ARCHITECTURES=\"80;90\"" >&2
  exit 1
}

rm -rf "$out" && mkdir -p "$out/bin" "$out/lib"
for t in "${targets[@]}" libpsrt_kernels_cuda.so; do
  cp "$build/$t" "$out/bin/"
  strip "$out/bin/$t"
  patchelf --set-rpath '$ORIGIN:$ORIGIN/../lib' "$out/bin/$t"
done
# The C/C++ runtime and CUDA's libraries stay behind.
keep_out='/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*|libcuda|libcudart|libcublas|libcublasLt)\.so'
# ldd lists the whole closure; RUNPATH is not inherited, so each library
# copied gets its own ($ORIGIN: its neighbours in lib/).
ldd "$out"/bin/* 2>/dev/null | awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -vE "$keep_out" | grep -v "^$(realpath "$out")/" |
  while read -r lib; do
    dest="$out/lib/$(basename "$lib")"
    cp -L "$lib" "$dest"
    strip --strip-unneeded "$dest"
    patchelf --set-rpath '$ORIGIN' "$dest"
  done
if [ "$train" = 1 ]; then
  mkdir -p "$out/data"
  cp /usr/share/datasets/fashion-mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz "$out/data/"
fi

# The checks.
rm -f "$out.tar.gz"
tar -C "$out" -czf "$out.tar.gz" .
mib=$(( ($(stat -c %s "$out.tar.gz") + 1048575) / 1048576 ))
echo "gpu_bundle: $out.tar.gz is $mib MiB (at most $max_mib; the folder $(du -sm "$out" | cut -f1) MiB)"
[ "$mib" -le "$max_mib" ] || { echo "gpu_bundle: $out.tar.gz is over $max_mib MiB" >&2; exit 1; }
bad=$(for f in "$out"/bin/* "$out"/lib/*; do
        ldd "$f" 2>/dev/null | awk -v f="$f" '{print f ": " $0}'
      done | grep '=>' |
      grep -vE "=> $(realpath "$out")/|=> $out/" |
      grep -vE "(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^ ]*|libcuda|libcudart|libcublas|libcublasLt)\.so[.0-9]* =>" || true)
if [ -n "$bad" ]; then
  echo "gpu_bundle: $(echo "$bad" | wc -l) libraries resolve outside the bundle, as:" >&2
  echo "$bad" | head -n 20 >&2
  exit 1
fi
echo "gpu_bundle: ldd: every library resolves to the bundle, the C/C++ runtime or CUDA's"
cuda_lib=$(dirname "$(ldconfig -p | awk '/libcudart\.so\.13 / {print $NF; exit}')" 2>/dev/null || true)
for f in "$out"/bin/*; do
  case "$f" in
    *.so) continue ;;
    *_test) args=(--gtest_list_tests) ;;
    *) args=(--version) ;;
  esac
  env -i LD_LIBRARY_PATH="${cuda_lib:-/usr/local/cuda/lib}" "$f" "${args[@]}" >/dev/null 2>&1 ||
    { echo "gpu_bundle: $f does not start in a clean environment" >&2; exit 1; }
done
echo "gpu_bundle: every binary starts in a clean environment"
