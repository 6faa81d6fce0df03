#!/usr/bin/env bash
# Runs the pods of a psrt Kubernetes manifest (deploy/tfjob.yaml, a Kubeflow
# TFJob, by default; or deploy/psrt.yaml, Indexed Jobs) as local processes,
# each with the TF_CONFIG it gets in the cluster, addresses mapped to
# 127.0.0.1 and free ports. No Kubernetes, docker or kubectl needed.
#
#   scripts/k8s_local.sh [--manifest FILE] [--namespace NS] [--logdir DIR]
#                        [--render] [--ps_args "FLAGS"] [-- WORKER_FLAGS...]
#
#   scripts/k8s_local.sh --render                  # each pod's TF_CONFIG, there and here
#   scripts/k8s_local.sh -- --train_steps=200      # a short run of the TFJob's pods
#
# The details, and what differs from a cluster, are in deploy/k8s_local.py.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
exec python3 "$root/deploy/k8s_local.py" "$@"
