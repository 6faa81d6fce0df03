#!/usr/bin/env bash
# Sets up (packages, build) and runs the whole test suite with ctest:
# GoogleTest units, then the multi-process cluster tests on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j2 --timeout 600 "$@"
