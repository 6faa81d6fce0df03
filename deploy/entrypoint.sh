#!/usr/bin/env bash
# The container's entrypoint: runs this pod's psrt task, with the flags it
# is given (the pod's args).
#
#   TF_CONFIG set (Kubeflow's TFJob injects it; deploy/tfjob.yaml):
#       runs psrt_ps when TF_CONFIG's task type is "ps", psrt_worker
#       otherwise. The binaries read cluster and task from TF_CONFIG.
#   PSRT_CLUSTER, PSRT_JOB and JOB_COMPLETION_INDEX set (a pod of an Indexed
#   Job; deploy/psrt.yaml): TF_CONFIG becomes
#       {"cluster": $PSRT_CLUSTER, "task": {"type": "$PSRT_JOB", "index": $JOB_COMPLETION_INDEX}}
#   Neither, but MASTER_ADDR and MASTER_PORT (an Indexed Job of allreduce
#   workers; deploy/allreduce.yaml): psrt_worker meets the other pods at a
#   rendezvous (docs/cluster-managers.md), its rank JOB_COMPLETION_INDEX, the
#   number of pods WORLD_SIZE, reached at this pod's fully qualified name
#   (hostname -f: NAME-I.SUBDOMAIN.NAMESPACE.svc... with the pod's subdomain).
#   A first argument that is a command (psrt_ps, psrtctl, bash, ...) runs
#       that command instead.
#
# It prints the TF_CONFIG it runs with to stderr (kubectl logs shows it).
# PSRT_ENTRYPOINT_DRY_RUN=1 prints the command line too and exits 0.
set -euo pipefail
bin="${PSRT_BIN_DIR:-$(cd "$(dirname "$0")/.." && pwd)/build/bin}"

if [ $# -gt 0 ] && [[ "$1" != -* ]]; then
  if [ -x "$bin/$1" ]; then exec "$bin/$1" "${@:2}"; fi
  exec "$@"
fi

if [ -z "${TF_CONFIG:-}" ] && [ -z "${PSRT_CLUSTER:-}" ] && [ -n "${MASTER_ADDR:-}" ]; then
  host="$(hostname -f 2>/dev/null || true)"
  [ -n "$host" ] || host="$(hostname)"
  echo "entrypoint: rendezvous at $MASTER_ADDR:${MASTER_PORT:-(MASTER_PORT unset)}, rank" \
       "${JOB_COMPLETION_INDEX:-(from the flags)} of ${WORLD_SIZE:-(from the flags)}," \
       "reached at $host" >&2
  command=("$bin/psrt_worker" --bind_host=0.0.0.0 --advertise_host="$host" "$@")
  if [ -n "${PSRT_ENTRYPOINT_DRY_RUN:-}" ]; then
    echo "entrypoint: would run ${command[*]#"$bin/"}" >&2
    exit 0
  fi
  exec "${command[@]}"
fi

if [ -z "${TF_CONFIG:-}" ]; then
  for var in PSRT_CLUSTER PSRT_JOB JOB_COMPLETION_INDEX; do
    if [ -z "${!var:-}" ]; then
      echo "entrypoint: neither TF_CONFIG nor $var is set: give the pod TF_CONFIG," \
           "or PSRT_CLUSTER and PSRT_JOB in an Indexed Job (see deploy/psrt.yaml), or" \
           "MASTER_ADDR and MASTER_PORT for a rendezvous (deploy/allreduce.yaml)" >&2
      exit 2
    fi
  done
  [[ "$JOB_COMPLETION_INDEX" =~ ^[0-9]+$ ]] \
    || { echo "entrypoint: JOB_COMPLETION_INDEX=$JOB_COMPLETION_INDEX is not an index" >&2; exit 2; }
  [[ "$PSRT_JOB" =~ ^[a-z]+$ ]] \
    || { echo "entrypoint: PSRT_JOB=$PSRT_JOB is not a job name" >&2; exit 2; }
  export TF_CONFIG="{\"cluster\": $PSRT_CLUSTER, \"task\": {\"type\": \"$PSRT_JOB\", \"index\": $JOB_COMPLETION_INDEX}}"
fi

# The task's type: "task":{"type":"ps",...} (the binaries validate the rest).
if [[ "$TF_CONFIG" =~ \"task\"[[:space:]]*:[[:space:]]*\{[^}]*\"type\"[[:space:]]*:[[:space:]]*\"([a-z]+)\" ]]; then
  type="${BASH_REMATCH[1]}"
else
  echo "entrypoint: TF_CONFIG has no task type: $TF_CONFIG" >&2
  exit 2
fi
binary=psrt_worker
[ "$type" = ps ] && binary=psrt_ps

echo "entrypoint: TF_CONFIG=$TF_CONFIG" >&2
if [ -n "${PSRT_ENTRYPOINT_DRY_RUN:-}" ]; then
  echo "entrypoint: would run $binary --bind_host=0.0.0.0 $*" >&2
  exit 0
fi
# A pod's spec address is its Service's: listen on every interface of the pod.
exec "$bin/$binary" --bind_host=0.0.0.0 "$@"
