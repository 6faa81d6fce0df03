#!/usr/bin/env bash
# Writes a valid ClusterSpec JSON for N ps and M worker tasks.
#
#   scripts/make_cluster_spec.sh --ps 2 --workers 2 [--hosts h1,h2,...] [--out FILE]
#
# Tasks go to the hosts in turn. On 127.0.0.1/localhost the ports are free
# ports found now; on other hosts they count up from --base_port (2222).
# Without --out the spec goes to stdout.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${PSRT_BIN_DIR:-$root/build/bin}"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --ps|--workers|--hosts|--out|--base_port) args+=("$1=$2"); shift 2 ;;
    --ps=*|--workers=*|--hosts=*|--out=*|--base_port=*) args+=("$1"); shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "make_cluster_spec.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
exec "$bin/psrtctl" make_spec "${args[@]}"
