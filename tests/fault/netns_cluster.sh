#!/usr/bin/env bash
# Runs a psrt cluster with every task on a host of its own (a network
# namespace), takes one PS's link down in the middle of training, brings it
# back, and reports whether and how fast training recovered.
#
#   tests/fault/netns_cluster.sh --bin DIR --out DIR [--ps 1] [--workers 2]
#       [--cut_ps 0] [--cut_at_step 50] [--down_secs 4] [--ps_flags "FLAGS"]
#       -- WORKER_FLAGS...
#
# The hosts psrt<PID>-ps<k> and psrt<PID>-w<i> each get an eth0 joined by a
# veth pair to a bridge in the namespace psrt<PID>-sw (a switch), with
# addresses 10.200.0.0/24; nothing touches this machine's own interfaces and
# no traffic leaves the namespaces. Once the chief (worker 0) logs step
# --cut_at_step (run it with --log_every_steps=1), the switch port of ps
# --cut_ps goes down for --down_secs and comes back. Logs: DIR/JOB-I.log.
#
# Prints "netns_cluster: ..." lines: when the link went down and came back,
# how long until the chief's next step, and each task's exit code.
# Exit status: 0 when every task exited 0 and the chief printed its final
# line; 1 otherwise; 77 when network namespaces are not available here (not
# root, or `ip netns add` fails). Every namespace and task is removed on
# every exit.
set -uo pipefail

bin="" out="" ps=1 workers=2 cut_ps=0 cut_at_step=50 down_secs=4 ps_flags=""
worker_flags=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --ps) ps="$2"; shift 2 ;;
    --workers) workers="$2"; shift 2 ;;
    --cut_ps) cut_ps="$2"; shift 2 ;;
    --cut_at_step) cut_at_step="$2"; shift 2 ;;
    --down_secs) down_secs="$2"; shift 2 ;;
    --ps_flags) ps_flags="$2"; shift 2 ;;
    --) shift; worker_flags=("$@"); break ;;
    *) echo "netns_cluster: unknown argument $1" >&2; sed -n '2,22p' "$0" >&2
       exit 2 ;;
  esac
done
if [ -z "$bin" ] || [ -z "$out" ]; then
  echo "netns_cluster: --bin and --out are required" >&2
  exit 2
fi
for b in psrt_ps psrt_worker; do
  [ -x "$bin/$b" ] || { echo "netns_cluster: $bin/$b not found" >&2; exit 2; }
done
if [ "$cut_ps" -ge "$ps" ]; then
  echo "netns_cluster: --cut_ps $cut_ps but only $ps ps tasks" >&2
  exit 2
fi

say() { echo "netns_cluster: $*"; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

if [ "$(id -u)" -ne 0 ]; then
  say "skipped: network namespaces need root"
  exit 77
fi
tag="psrt$$"
sw="$tag-sw"
namespaces=()
pids=()
# shellcheck disable=SC2317  # Run by the EXIT trap.
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
  for ns in "${namespaces[@]}"; do ip netns del "$ns" 2>/dev/null; done
}
trap cleanup EXIT
trap 'exit 143' TERM INT HUP

if ! error="$(ip netns add "$sw" 2>&1)"; then
  say "skipped: ip netns add failed: $error"
  exit 77
fi
namespaces+=("$sw")
mkdir -p "$out"
run() { "$@" || { say "setup failed: $*"; exit 1; }; }
run ip -n "$sw" link add br0 type bridge
run ip -n "$sw" link set dev br0 up

# add_host NAME ADDRESS: a namespace with eth0 on the switch's port NAME.
add_host() {
  local ns="$tag-$1"
  run ip netns add "$ns"
  namespaces+=("$ns")
  run ip link add eth0 netns "$ns" type veth peer name "$1" netns "$sw"
  run ip -n "$sw" link set dev "$1" master br0
  run ip -n "$sw" link set dev "$1" up
  run ip -n "$ns" link set dev lo up
  run ip -n "$ns" addr add "$2/24" dev eth0
  run ip -n "$ns" link set dev eth0 up
}
ps_addresses=() worker_addresses=()
for ((k = 0; k < ps; k++)); do
  add_host "ps$k" "10.200.0.$((10 + k))"
  ps_addresses+=("\"10.200.0.$((10 + k)):2222\"")
done
for ((i = 0; i < workers; i++)); do
  add_host "w$i" "10.200.0.$((100 + i))"
  worker_addresses+=("\"10.200.0.$((100 + i)):2222\"")
done
spec="$out/cluster.json"
(IFS=,; echo "{\"ps\": [${ps_addresses[*]}], \"worker\": [${worker_addresses[*]}]}") >"$spec"

for ((k = 0; k < ps; k++)); do
  # shellcheck disable=SC2086  # --ps_flags is a list of flags.
  ip netns exec "$tag-ps$k" "$bin/psrt_ps" --cluster_spec="$spec" --job_name=ps \
    --task_index=$k $ps_flags >"$out/ps-$k.log" 2>&1 &
  pids+=($!)
done
worker_pids=()
for ((i = 0; i < workers; i++)); do
  ip netns exec "$tag-w$i" "$bin/psrt_worker" --cluster_spec="$spec" --job_name=worker \
    --task_index=$i "${worker_flags[@]}" >"$out/worker-$i.log" 2>&1 &
  pids+=($!)
  worker_pids+=($!)
done
chief_log="$out/worker-0.log"
chief_step() {
  local s
  s="$(grep -o '\] step [0-9]*, loss' "$chief_log" | tail -1 | grep -o '[0-9]*')"
  echo "${s:--1}"
}
chief_running() { kill -0 "${worker_pids[0]}" 2>/dev/null; }

while chief_running && [ "$(chief_step)" -lt "$cut_at_step" ]; do sleep 0.05; done
if chief_running; then
  run ip -n "$sw" link set dev "ps$cut_ps" down
  t_down="$(now)"
  step_down="$(chief_step)"
  sleep "$down_secs"
  run ip -n "$sw" link set dev "ps$cut_ps" up
  t_up="$(now)"
  step_up="$(chief_step)"
  say "link of ps/$cut_ps down at step $step_down for $(elapsed "$t_down" "$t_up") s;" \
      "step $step_up when it came back"
  while chief_running && [ "$(chief_step)" -le "$step_up" ]; do sleep 0.02; done
  if [ "$(chief_step)" -gt "$step_up" ]; then
    t_next="$(now)"
    say "next step $(elapsed "$t_up" "$t_next") s after the link came back" \
        "(training stalled $(elapsed "$t_down" "$t_next") s)"
  else
    say "no step after the link came back"
  fi
else
  say "the chief ended before step $cut_at_step; the link was never cut"
fi

failed=0
for ((i = 0; i < workers; i++)); do
  wait "${worker_pids[$i]}"
  code=$?
  say "worker/$i exited $code"
  [ "$code" -eq 0 ] || failed=1
done
for ((k = 0; k < ps; k++)); do
  # The PS exits once every worker said goodbye; allow it its grace period.
  for _ in $(seq 400); do kill -0 "${pids[$k]}" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "${pids[$k]}" 2>/dev/null; then
    say "ps/$k still running 40 s after the workers ended; stopping it"
    kill "${pids[$k]}"
  fi
  wait "${pids[$k]}"
  code=$?
  say "ps/$k exited $code"
  [ "$code" -eq 0 ] || failed=1
done
pids=()
final="$(grep '^final:' "$chief_log")"
say "${final:-no final line from the chief}"
if [ $failed -ne 0 ] || [ -z "$final" ]; then
  for log in "$out"/*.log; do
    echo "--- end of $log"
    tail -n 8 "$log"
  done
  exit 1
fi
exit 0
