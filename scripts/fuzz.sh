#!/usr/bin/env bash
# Runs psrt's libFuzzer targets (fuzz/) for a bounded time each.
#
#   scripts/fuzz.sh [--secs N] [--build-only] [target...]
#
# CI runs --build-only (.ci/run), so a change that breaks a target, or the
# build with clang, fails CI.
# Targets (default: all): cluster_spec idx tfrecord image safetensors checkpoint
# tensor_frame ps_requests dataplane_frame keras_model keras_weights. Configures build-fuzz/
# with clang and
# -DPSRT_FUZZ=ON (libFuzzer, AddressSanitizer, UndefinedBehaviorSanitizer;
# the first build takes several minutes on 2 cores), builds the targets, then
# fuzzes each for N seconds (default 60), starting from its seeds
# (fuzz/corpus/<target>/, with the dictionary fuzz/dict/<target>.dict if
# there is one) and from what earlier runs found
# (build-fuzz/corpus/<target>/, which new inputs go to). libFuzzer runs in
# fork mode and keeps going after a crash, a sanitizer report, a leak, a
# timeout (10 s per input) or an out-of-memory (2 GB); the inputs that
# caused them land in build-fuzz/artifacts/<target>/. Reproduce one with
#   build-fuzz/bin/fuzz_<target> build-fuzz/artifacts/<target>/crash-...
# Prints one line per target: executions, crashes (timeouts and OOMs
# included), artifacts. Exits 1 when any target crashed.
set -euo pipefail
cd "$(dirname "$0")/.."

ALL_TARGETS=(cluster_spec idx tfrecord image safetensors checkpoint tensor_frame ps_requests
             dataplane_frame keras_model keras_weights)
secs=60
build_only=0
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --secs) secs="$2"; shift 2 ;;
    --secs=*) secs="${1#--secs=}"; shift ;;
    --build-only) build_only=1; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown flag $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -eq 0 ] && targets=("${ALL_TARGETS[@]}")
for t in "${targets[@]}"; do
  if [[ ! " ${ALL_TARGETS[*]} " =~ " $t " ]]; then
    echo "fuzz.sh: unknown target \"$t\" (known: ${ALL_TARGETS[*]})" >&2
    exit 2
  fi
done
# psrt's packages, and clang with its sanitizer and libFuzzer runtimes
# (clang: /usr/bin/clang++, version 14 on Debian 12).
fuzz_packages=(clang libclang-rt-14-dev)
scripts/setup.sh --no-build "${fuzz_packages[@]}" >/dev/null
if ! command -v clang++ >/dev/null; then
  echo "fuzz.sh: clang++ not found after installing ${fuzz_packages[*]}" >&2
  exit 2
fi

BUILD=build-fuzz
if [ ! -f "$BUILD/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$BUILD" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPSRT_FUZZ=ON -DPSRT_CUDA=OFF
fi
cmake --build "$BUILD" -j2 --target "${targets[@]/#/fuzz_}"
[ "$build_only" -eq 1 ] && exit 0

# Scratch files of the targets (each process makes its own directory).
scratch=$(mktemp -d "$( [ -w /dev/shm ] && echo /dev/shm || echo /tmp )/psrt_fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
export TEST_TMPDIR="$scratch"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$PWD/fuzz/lsan.supp}"  # HDF5's own leaks.
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"

summary=()
failed=0
for t in "${targets[@]}"; do
  corpus="$BUILD/corpus/$t"
  artifacts="$BUILD/artifacts/$t"
  log="$BUILD/logs/$t.log"
  mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
  before=$(find "$artifacts" -type f | wc -l)
  dict=()
  [ -f "fuzz/dict/$t.dict" ] && dict=(-dict="fuzz/dict/$t.dict")
  echo "fuzz.sh: fuzzing $t for ${secs}s (log: $log)"
  "$BUILD/bin/fuzz_$t" "${dict[@]}" -fork=1 -ignore_crashes=1 -ignore_timeouts=1 \
    -ignore_ooms=1 -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$artifacts/" "$corpus" "fuzz/corpus/$t" >"$log" 2>&1 || true
  # Fork mode's status lines: "#N: cov: .. oom/timeout/crash: O/T/C time: .."
  status=$(grep -E '^#[0-9]+: cov' "$log" | tail -1 || true)
  execs=$(sed -nE 's/^#([0-9]+):.*/\1/p' <<<"$status")
  counts=$(sed -nE 's|.*oom/timeout/crash: ([0-9]+)/([0-9]+)/([0-9]+).*|\1 \2 \3|p' <<<"$status")
  read -r ooms timeouts crashes <<<"${counts:-0 0 0}"
  new=$(( $(find "$artifacts" -type f | wc -l) - before ))
  total=$(( ooms + timeouts + crashes ))
  [ "$total" -gt 0 ] && failed=1
  summary+=("$(printf '%-13s executions %10s  crashes %3d (oom %d, timeout %d)  new artifacts %d' \
    "$t" "${execs:-?}" "$total" "$ooms" "$timeouts" "$new")")
done
echo
printf '%s\n' "${summary[@]}"
exit "$failed"
