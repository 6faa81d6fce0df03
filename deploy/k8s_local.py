#!/usr/bin/env python3
"""Runs the pods of a psrt Kubernetes manifest as local processes.

    scripts/k8s_local.sh [--manifest deploy/tfjob.yaml] [--namespace default]
        [--logdir DIR] [--render] [--ps_args "FLAGS"] [-- WORKER_FLAGS...]

Reads the manifest the way Kubernetes and Kubeflow's training operator would
and works out, for every pod, the TF_CONFIG it gets there:

  TFJob (kubeflow.org/v1): as the operator's genTFConfigJSONStr, for each
    replica type T (lower-cased) and index I: cluster = {t: ["NAME-t-I.
    NAMESPACE.svc:PORT", ...]} for every replica type but Evaluator, PORT the
    "tfjob-port" of the container named "tensorflow" (2222 without one),
    task = {"type": t, "index": I}, environment "cloud".
  Indexed Jobs (batch/v1, deploy/psrt.yaml): the container's env (ConfigMap
    references resolved from the same manifest) plus JOB_COMPLETION_INDEX=I;
    deploy/entrypoint.sh turns PSRT_CLUSTER/PSRT_JOB/JOB_COMPLETION_INDEX into
    TF_CONFIG, here as in the pod. A pod with MASTER_ADDR and MASTER_PORT and
    no cluster (deploy/allreduce.yaml) gets no TF_CONFIG: it meets the others
    at a rendezvous, reached at its name through its subdomain's Service
    ("NAME-I.SUBDOMAIN:PORT", PORT its container's "grpc" port, else 2222).

Then it starts one process per pod with that environment and the container's
command and args (the image's entrypoint, deploy/entrypoint.sh, when the
container names no command), ps pods first, and waits for all of them.

Secret references (secretKeyRef, in both kinds) resolve to a Secret in the
manifest, or else to one random value per Secret key, shared by every pod,
as the Secret a user creates before applying the manifest would be.

What differs from a cluster, and only this: the pods' host names do not
resolve here and they all listen on the same port, so every address of the
cluster ("psrt-mnist-ps-0.default.svc:2222") is replaced by 127.0.0.1 and a
free port, one to one and in every pod alike, in TF_CONFIG (and in
PSRT_CLUSTER); a rendezvous's MASTER_ADDR:MASTER_PORT likewise, and each of
its pods gets --advertise_host=127.0.0.1 and --task_port=its own free port. Job names, order, task types and indices are untouched.
--render prints both forms for each pod and starts nothing. Volume mount
paths in args become directories under LOGDIR/volumes (one per claim, so
ps pods share a ReadWriteMany claim as they do there). --ps_args and the
flags after "--" are appended to the ps and the other pods' args (flags
given twice: the last wins), e.g. -- --train_steps=50 for a short run.

Each pod's output goes to LOGDIR/POD.log. Exits 0 when every pod exited 0;
when one fails, stops the others and exits 1; ends with the chief's last
line.
"""
import argparse
import base64
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time

try:
    import yaml
except ImportError:
    sys.exit("k8s_local: python3-yaml is missing (scripts/setup.sh installs it)")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENTRYPOINT = os.path.join(ROOT, "deploy", "entrypoint.sh")
# Kubeflow's names: tfv1.DefaultContainerName, DefaultPortName, DefaultPort.
TF_CONTAINER, TF_PORT_NAME, TF_DEFAULT_PORT = "tensorflow", "tfjob-port", 2222


class ManifestError(Exception):
    pass


class Pod:
    """One pod: its name, task and the process it runs."""

    def __init__(self, name, job, index, container, env, volumes):
        self.name, self.job, self.index = name, job, index
        self.container = container  # The pod spec's container (a dict).
        self.env = env  # Name -> value, as Kubernetes sets them.
        self.volumes = volumes  # Volume name -> local key (claim or pod/volume).
        self.local_env = env  # env with the cluster's addresses mapped here.
        # A rendezvous pod's address in the cluster (None: it has a cluster).
        self.rendezvous_address = None

    def argv(self):
        command = self.container.get("command") or [ENTRYPOINT]
        return [str(a) for a in command + self.container.get("args", [])]


def container_port(container, port_name, default):
    for port in container.get("ports", []):
        if port.get("name") == port_name:
            return int(port["containerPort"])
    return default


def volume_keys(pod_name, pod_spec):
    """Volume name -> local directory key: shared per claim, else per pod."""
    keys = {}
    for volume in pod_spec.get("volumes", []):
        claim = volume.get("persistentVolumeClaim", {}).get("claimName")
        keys[volume["name"]] = claim if claim else f"{pod_name}/{volume['name']}"
    return keys


class Secrets:
    """Secret values: those the manifest holds, else one random value per
    (Secret, key), made once and shared by every pod, standing in for the
    Secret that `kubectl create secret` makes in a cluster."""

    def __init__(self, docs):
        self.values = {}
        for doc in docs:
            if doc.get("kind") != "Secret":
                continue
            data = {k: base64.b64decode(v).decode() for k, v in doc.get("data", {}).items()}
            data.update(doc.get("stringData", {}))
            self.values[doc["metadata"]["name"]] = data

    def get(self, name, key):
        data = self.values.setdefault(name, {})
        if key not in data:
            data[key] = secrets.token_hex(32)
            print(f"k8s_local: Secret {name} key {key} is not in the manifest: using a "
                  "random value here (in a cluster, create it first)", flush=True)
        return data[key]


def env_of(container, configmaps, secret_values, where):
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = str(var["value"])
            continue
        source = var.get("valueFrom", {})
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            env[var["name"]] = secret_values.get(ref["name"], ref["key"])
            continue
        ref = source.get("configMapKeyRef")
        if ref is None:
            raise ManifestError(f"{where}: env {var['name']}: only value, "
                                "configMapKeyRef and secretKeyRef are supported here")
        data = configmaps.get(ref["name"])
        if data is None or ref["key"] not in data:
            raise ManifestError(f"{where}: env {var['name']}: ConfigMap "
                                f"{ref['name']} key {ref['key']} is not in the manifest")
        env[var["name"]] = data[ref["key"]]
    return env


def tfjob_pods(tfjob, namespace, cluster_domain, secret_values):
    """The pods the training operator creates for a TFJob, with its TF_CONFIG."""
    name = tfjob["metadata"]["name"]
    replica_specs = tfjob["spec"]["tfReplicaSpecs"]
    containers = {}
    for rtype, spec in replica_specs.items():
        found = [c for c in spec["template"]["spec"]["containers"]
                 if c.get("name") == TF_CONTAINER]
        if not found:
            raise ManifestError(f"TFJob {name} {rtype}: no container named "
                                f"\"{TF_CONTAINER}\" (the operator needs one)")
        containers[rtype] = found[0]
    cluster = {}
    for rtype, spec in replica_specs.items():
        if rtype == "Evaluator":  # The operator leaves evaluators out.
            continue
        rt = rtype.lower()
        port = container_port(containers[rtype], TF_PORT_NAME, TF_DEFAULT_PORT)
        suffix = f".{namespace}.svc" + (f".{cluster_domain}" if cluster_domain else "")
        cluster[rt] = [f"{name}-{rt}-{i}{suffix}:{port}"
                       for i in range(int(spec.get("replicas", 1)))]
    cluster = dict(sorted(cluster.items()))  # Go marshals a map sorted by key.
    pods = []
    for rtype, spec in replica_specs.items():
        rt = rtype.lower()
        for i in range(int(spec.get("replicas", 1))):
            pod_name = f"{name}-{rt}-{i}"
            env = env_of(containers[rtype], {}, secret_values, f"TFJob {name} {rtype}")
            # Field order of the operator's TFConfig struct.
            env["TF_CONFIG"] = json.dumps(
                {"cluster": cluster, "task": {"type": rt, "index": i},
                 "environment": "cloud"}, separators=(",", ":"))
            pods.append(Pod(pod_name, rt, i, containers[rtype], env,
                            volume_keys(pod_name, spec["template"]["spec"])))
    return pods


def indexed_job_pods(job, configmaps, secret_values):
    """The pods of an Indexed Job: container env plus JOB_COMPLETION_INDEX."""
    name = job["metadata"]["name"]
    spec = job["spec"]
    if spec.get("completionMode") != "Indexed":
        raise ManifestError(f"Job {name}: only Indexed Jobs give pods an index")
    pod_spec = spec["template"]["spec"]
    container = pod_spec["containers"][0]
    pods = []
    for i in range(int(spec["completions"])):
        env = env_of(container, configmaps, secret_values, f"Job {name}")
        env["JOB_COMPLETION_INDEX"] = str(i)
        pod_name = f"{name}-{i}"  # The pod's hostname in an Indexed Job.
        pod = Pod(pod_name, env.get("PSRT_JOB", name), i, container, env,
                  volume_keys(pod_name, pod_spec))
        if is_rendezvous(env):
            if "MASTER_PORT" not in env:
                raise ManifestError(f"Job {name}: MASTER_ADDR without MASTER_PORT")
            if "subdomain" not in pod_spec:
                raise ManifestError(f"Job {name}: a rendezvous pod needs a subdomain (a "
                                    "headless Service) for the others to reach it")
            port = container_port(container, "grpc", 2222)
            pod.rendezvous_address = f"{pod_name}.{pod_spec['subdomain']}:{port}"
        pods.append(pod)
    return pods


def is_rendezvous(env):
    return "MASTER_ADDR" in env and "TF_CONFIG" not in env and "PSRT_CLUSTER" not in env


def coordinator_of(env):
    return f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"


def manifest_pods(path, namespace, cluster_domain):
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    configmaps = {d["metadata"]["name"]: d.get("data", {})
                  for d in docs if d.get("kind") == "ConfigMap"}
    secret_values = Secrets(docs)
    pods = []
    for doc in docs:
        if doc.get("kind") == "TFJob":
            pods += tfjob_pods(doc, namespace, cluster_domain, secret_values)
        elif doc.get("kind") == "Job":
            pods += indexed_job_pods(doc, configmaps, secret_values)
    if not pods:
        raise ManifestError(f"{path}: no TFJob and no Job: nothing to run")
    return pods


# The cluster lives in TF_CONFIG's "cluster" or in PSRT_CLUSTER.
def cluster_of(env):
    if "TF_CONFIG" in env:
        return json.loads(env["TF_CONFIG"])["cluster"]
    if "PSRT_CLUSTER" in env:
        return json.loads(env["PSRT_CLUSTER"])
    return {}


def with_addresses(env, mapping):
    """env with every cluster address replaced through `mapping`."""
    env = dict(env)

    def mapped(cluster):
        return {job: [mapping[a] for a in addresses] for job, addresses in cluster.items()}
    if "TF_CONFIG" in env:
        config = json.loads(env["TF_CONFIG"])
        config["cluster"] = mapped(config["cluster"])
        env["TF_CONFIG"] = json.dumps(config, separators=(",", ":"))
    if "PSRT_CLUSTER" in env:
        env["PSRT_CLUSTER"] = json.dumps(mapped(json.loads(env["PSRT_CLUSTER"])))
    if is_rendezvous(env):
        env["MASTER_ADDR"], env["MASTER_PORT"] = mapping[coordinator_of(env)].split(":")
    return env


def free_ports(count):
    """count distinct ports that nothing is bound to on any interface, drawn
    at random below the kernel's ephemeral range: a port from that range (the
    kernel's answer to a bind to port 0) can be taken, between its release
    here and the pod's bind, by any program's outgoing connection or bind to
    port 0 (on a busy host it was). The kernel's choice when that range
    leaves no room below it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    lowest = 10000
    draw = random.SystemRandom()
    sockets = []
    try:
        for _ in range(100 * count):
            if len(sockets) == count:
                break
            s = socket.socket()
            port = draw.randrange(lowest, ephemeral_low) if ephemeral_low > lowest + count else 0
            try:
                s.bind(("", port))
            except OSError:
                s.close()
                continue
            sockets.append(s)
        if len(sockets) < count:
            raise OSError(f"found only {len(sockets)} of {count} free ports")
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def local_addresses(pods):
    """Every cluster address -> 127.0.0.1:free port, one to one."""
    addresses = []
    for pod in pods:
        for job_addresses in cluster_of(pod.env).values():
            addresses += [a for a in job_addresses if a not in addresses]
        if pod.rendezvous_address:
            addresses += [a for a in (coordinator_of(pod.env), pod.rendezvous_address)
                          if a not in addresses]
    return dict(zip(addresses, (f"127.0.0.1:{p}" for p in free_ports(len(addresses)))))


def tf_config_seen_by(pod, env, bin_dir, address=None):
    """The TF_CONFIG the pod's task runs with (the entrypoint's, if it makes
    one), or for a rendezvous pod where it meets the others."""
    if pod.rendezvous_address:
        return (f"(none: a rendezvous at {coordinator_of(env)}, rank "
                f"{env.get('JOB_COMPLETION_INDEX')} of {env.get('WORLD_SIZE', '?')}, "
                f"serving at {address or pod.rendezvous_address})")
    if "TF_CONFIG" in env or pod.container.get("command"):
        return env.get("TF_CONFIG", "")
    out = subprocess.run([ENTRYPOINT], env={**base_env(bin_dir), **env,
                                            "PSRT_ENTRYPOINT_DRY_RUN": "1"},
                         stderr=subprocess.PIPE, text=True, check=False).stderr
    for line in out.splitlines():
        if line.startswith("entrypoint: TF_CONFIG="):
            return line[len("entrypoint: TF_CONFIG="):]
    raise ManifestError(f"pod {pod.name}: deploy/entrypoint.sh makes no TF_CONFIG:\n{out}")


def base_env(bin_dir):
    """This environment without psrt's variables, binaries first on PATH."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CONFIG", "PSRT_CLUSTER", "PSRT_JOB", "JOB_COMPLETION_INDEX",
                        "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env["PSRT_BIN_DIR"] = bin_dir
    return env


def local_args(pod, extra, logdir, mapping):
    """The pod's argv, volume mount paths mapped to LOGDIR/volumes, plus where
    a rendezvous pod serves here, plus extra."""
    mounts = {}
    for mount in pod.container.get("volumeMounts", []):
        key = pod.volumes.get(mount["name"], f"{pod.name}/{mount['name']}")
        mounts[mount["mountPath"].rstrip("/")] = os.path.join(logdir, "volumes", key)

    def local_path(value):
        for path, local in mounts.items():
            if value == path or value.startswith(path + "/"):
                os.makedirs(local, exist_ok=True)
                return local + value[len(path):]
        return value
    argv = []
    for arg in pod.argv():
        if arg.startswith("-") and "=" in arg:
            flag, value = arg.split("=", 1)
            argv.append(flag + "=" + local_path(value))
        else:
            argv.append(local_path(arg))
    if pod.rendezvous_address:
        host, port = mapping[pod.rendezvous_address].split(":")
        argv += [f"--advertise_host={host}", f"--task_port={port}"]
    return argv + extra


def is_chief(pod, pods):
    if pod.rendezvous_address:  # Rank 0 of an allreduce job is worker/0.
        return pod.index == 0
    has_chief = any(p.job == "chief" for p in pods)
    return pod.index == 0 and pod.job == ("chief" if has_chief else "worker")


def stop(running):
    for _, process in running:
        if process.poll() is None:
            process.terminate()
    deadline = time.time() + 10
    for _, process in running:
        try:
            process.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main():
    parser = argparse.ArgumentParser(
        prog="k8s_local.sh", description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifest", default=os.path.join(ROOT, "deploy", "tfjob.yaml"))
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--cluster_domain", default="",
                        help="the operator's CUSTOM_CLUSTER_DOMAIN (empty: none)")
    parser.add_argument("--logdir", default="")
    parser.add_argument("--bin_dir", default=os.environ.get(
        "PSRT_BIN_DIR", os.path.join(ROOT, "build", "bin")))
    parser.add_argument("--ps_args", default="", help="flags appended to ps pods")
    parser.add_argument("--render", action="store_true",
                        help="print each pod's TF_CONFIG, there and here; start nothing")
    parser.add_argument("worker_args", nargs="*", help="flags appended to the other pods")
    args = parser.parse_args()

    try:
        pods = manifest_pods(args.manifest, args.namespace, args.cluster_domain)
        mapping = local_addresses(pods)
        for pod in pods:
            pod.local_env = with_addresses(pod.env, mapping)
            if args.render:
                print(f"pod {pod.name}:")
                print(f"  in Kubernetes: TF_CONFIG={tf_config_seen_by(pod, pod.env, args.bin_dir)}")
                here = mapping.get(pod.rendezvous_address)
                print(f"  here:          TF_CONFIG="
                      f"{tf_config_seen_by(pod, pod.local_env, args.bin_dir, here)}")
    except ManifestError as e:
        sys.exit(f"k8s_local: {e}")
    except KeyError as e:
        sys.exit(f"k8s_local: {args.manifest}: missing field {e}")
    except (TypeError, ValueError, OSError, yaml.YAMLError) as e:
        sys.exit(f"k8s_local: {args.manifest}: {e}")
    if args.render:
        return 0
    for binary in ("psrt_ps", "psrt_worker"):
        if not os.access(os.path.join(args.bin_dir, binary), os.X_OK):
            sys.exit(f"k8s_local: {args.bin_dir}/{binary} not found: run scripts/setup.sh")

    logdir = args.logdir or tempfile.mkdtemp(prefix="psrt_k8s.")
    os.makedirs(logdir, exist_ok=True)
    env = base_env(args.bin_dir)
    running = []
    # Ctrl-C even when started in the background by a shell (which ignores it).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        for pod in sorted(pods, key=lambda p: p.job != "ps"):
            extra = args.ps_args.split() if pod.job == "ps" else args.worker_args
            log = open(os.path.join(logdir, pod.name + ".log"), "w")
            process = subprocess.Popen(local_args(pod, extra, logdir, mapping),
                                       env={**env, **pod.local_env},
                                       stdout=log, stderr=subprocess.STDOUT)
            running.append((pod, process))
            print(f"k8s_local: started pod {pod.name} ({pod.job}/{pod.index}, "
                  f"pid {process.pid}, log {log.name})", flush=True)
        failed = None
        while failed is None and any(p.poll() is None for _, p in running):
            time.sleep(0.2)
            failed = next((pod for pod, p in running if p.poll()), None)
        if failed is None:
            failed = next((pod for pod, p in running if p.returncode), None)
    except (KeyboardInterrupt, SystemExit) as interrupt:
        print("k8s_local: stopping every pod", file=sys.stderr)
        stop(running)
        return 130 if isinstance(interrupt, KeyboardInterrupt) else interrupt.code
    stop(running)
    for pod, process in running:
        print(f"k8s_local: pod {pod.name} exited with code {process.returncode}")
    chief = next((pod for pod in pods if is_chief(pod, pods)), None)
    if chief is not None:
        with open(os.path.join(logdir, chief.name + ".log")) as f:
            lines = f.read().splitlines()
        final = [line for line in lines if line.startswith("final:")] or lines[-1:]
        print(f"k8s_local: chief {chief.name}: {final[-1] if final else '(no output)'}")
    if failed is not None:
        print(f"k8s_local: pod {failed.name} failed; logs in {logdir}", file=sys.stderr)
        return 1
    print(f"k8s_local: every pod exited 0; logs in {logdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
