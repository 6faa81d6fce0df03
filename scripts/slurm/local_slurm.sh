#!/usr/bin/env bash
# A real Slurm (Debian's slurmctld and slurmd) of three emulated nodes on
# this host, for the tests and the Slurm example:
#
#   scripts/slurm/local_slurm.sh start DIR   start it; waits until the nodes are idle
#   scripts/slurm/local_slurm.sh stop DIR    stop every daemon it started
#   eval "$(scripts/slurm/local_slurm.sh env DIR)"   SLURM_CONF for srun, sbatch, ...
#
# Nodes n1, n2 and n3 (4 CPUs each) listen on 127.0.1.1-3; their names
# resolve through a copy of /etc/hosts bind-mounted in a private mount
# namespace (unshare -m) in which the daemons, and so the job's tasks, run.
# No munge: AuthType=auth/none, CredType=cred/none (a test cluster that only
# root on this host can reach). Ports: 16817 (slurmctld) and 16818-16820
# (slurmd), below the ephemeral range the tests' own servers use; set
# PSRT_SLURM_PORT to move them. Scheduling and requeueing are tuned to take
# seconds. Exit status: 0, or 1 with the reason (no Slurm installed: install
# it with scripts/setup.sh).
set -euo pipefail
command="${1:-}"
dir="${2:-}"
if [ -z "$command" ] || [ -z "$dir" ]; then
  echo "usage: local_slurm.sh start|stop|env DIR" >&2
  exit 2
fi
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
conf="$dir/slurm.conf"
port="${PSRT_SLURM_PORT:-16817}"

write_conf() {
  mkdir -p "$dir/state" "$dir/spool"
  cat >"$conf" <<EOF
ClusterName=psrtlocal
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$port
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
AuthInfo=cred_expire=10
MpiDefault=none
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=2
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
KillWait=2
MinJobAge=5
SlurmctldTimeout=10
SlurmdTimeout=10
MessageTimeout=10
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
NodeName=n1 NodeHostname=localhost NodeAddr=127.0.1.1 Port=$((port + 1)) CPUs=4 State=UNKNOWN
NodeName=n2 NodeHostname=localhost NodeAddr=127.0.1.2 Port=$((port + 2)) CPUs=4 State=UNKNOWN
NodeName=n3 NodeHostname=localhost NodeAddr=127.0.1.3 Port=$((port + 3)) CPUs=4 State=UNKNOWN
PartitionName=local Nodes=n[1-3] Default=YES MaxTime=INFINITE State=UP
EOF
  cp /etc/hosts "$dir/hosts"
  printf '127.0.1.1 n1\n127.0.1.2 n2\n127.0.1.3 n3\n' >>"$dir/hosts"
}

daemon_pids() {
  cat "$dir"/slurmctld.pid "$dir"/slurmd-n*.pid 2>/dev/null || true
}

# Every process in the daemons' private mount namespace: the daemons, and the
# job steps (slurmstepd and the tasks under it) they started.
namespace_pids() {
  local ns pid
  ns="$(cat "$dir/mount_ns" 2>/dev/null)" || return 0
  for pid in /proc/[0-9]*; do
    [ "$(readlink "$pid/ns/mnt" 2>/dev/null)" = "$ns" ] && echo "${pid#/proc/}"
  done
  return 0
}

stop() {
  # (Without its file scontrol retries reading it for a minute.)
  if [ -f "$conf" ] && [ -n "$(daemon_pids)" ]; then
    # Jobs first, so that their steps end cleanly.
    SLURM_CONF="$conf" scancel --quiet --user="$(id -un)" >/dev/null 2>&1 || true
    for _ in $(seq 50); do
      [ -z "$(SLURM_CONF="$conf" squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.2
    done
    SLURM_CONF="$conf" scontrol shutdown >/dev/null 2>&1 || true
  fi
  local pids pid
  pids="$(daemon_pids)"
  for _ in $(seq 50); do
    local alive=0
    for pid in $pids; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ $alive -eq 0 ] && break
    sleep 0.2
  done
  for pid in $pids $(namespace_pids); do kill -9 "$pid" 2>/dev/null || true; done
  rm -f "$dir"/*.pid "$dir/mount_ns"
}

case "$command" in
  env)
    echo "export SLURM_CONF='$conf'"
    ;;
  stop)
    stop
    ;;
  start)
    for tool in slurmctld slurmd srun sinfo scontrol unshare; do
      if ! command -v "$tool" >/dev/null; then
        echo "local_slurm: $tool not found: scripts/setup.sh installs Slurm" >&2
        exit 1
      fi
    done
    stop
    write_conf
    rm -rf "$dir/state"/* "$dir/spool"/*
    # The daemons fork into the background and keep the namespace alive.
    if ! unshare -m --propagation private bash -c "
        set -e
        mount --bind '$dir/hosts' /etc/hosts
        slurmctld -f '$conf'
        for n in 1 2 3; do slurmd -f '$conf' -N n\$n; done" >"$dir/start.log" 2>&1; then
      echo "local_slurm: the daemons did not start:" >&2
      sed 's/^/    /' "$dir/start.log" "$dir"/slurm*.log >&2 2>/dev/null || true
      stop
      exit 1
    fi
    for _ in $(seq 150); do
      if [ ! -s "$dir/mount_ns" ] && [ -s "$dir/slurmctld.pid" ]; then
        readlink "/proc/$(cat "$dir/slurmctld.pid")/ns/mnt" >"$dir/mount_ns" || true
      fi
      idle="$(SLURM_CONF="$conf" sinfo -h -N -o '%T' 2>/dev/null | grep -c '^idle' || true)"
      [ "$idle" = 3 ] && exit 0
      sleep 0.2
    done
    echo "local_slurm: the nodes did not become idle within 30 s:" >&2
    SLURM_CONF="$conf" sinfo -N >&2 || true
    tail -n 20 "$dir/slurmctld.log" "$dir"/slurmd-n*.log 2>/dev/null | sed 's/^/    /' >&2
    stop
    exit 1
    ;;
  *)
    echo "usage: local_slurm.sh start|stop|env DIR" >&2
    exit 2
    ;;
esac
