#!/usr/bin/env python3
"""TensorFlow's own parameter servers, the peer of psrt's sync step benchmark
(scripts/bench_step.sh --peer tf): 1 ps task + W worker tasks on 127.0.0.1,
TensorFlow's classic distributed runtime (tf.distribute.Server over gRPC,
replica_device_setter placing the variables on the ps,
SyncReplicasOptimizer aggregating W gradients a step, MonitoredTrainingSession),
training psrt's LeNet (models/lenet.cc: conv 5x5x32 SAME + ReLU, max pool 2,
conv 5x5x64 SAME + ReLU, max pool 2, dense 512 + ReLU, dense 10; softmax
cross-entropy; plain SGD) on Fashion-MNIST batches drawn from memory, as
psrt's workers do. Prints one line:
    tf_ps: model=lenet workers=W batch=B threads=T steps=N job_eps=X
job_eps: examples/sec of all workers together (global steps x W x batch),
timed by the chief from its --warmup-th global step to the last.

    tf_ps_train.py --workers 2 --steps 600 --batch_size 100 --threads 1

launches every task itself (subprocesses of this script); --job_name and
--task_index run one task of a cluster given by --ps_hosts/--worker_hosts.
--local times one process alone, no ps (TensorFlow's compute bound of a
worker, as psrt's step_bench is psrt's), the same graph, feed and threads:
    tf_local: model=lenet batch=B threads=T examples_per_sec=X
Workers run TensorFlow's intra- and inter-op pools on --threads threads;
the ps task on its defaults, as psrt's ps runs on its own.
Needs tensorflow-cpu (scripts/keras_venv.sh).
"""
import argparse
import gzip
import os
import socket
import struct
import subprocess
import sys
import time

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def read_idx(path):
    """An IDX file (gzip or plain) as a numpy array."""
    import numpy as np
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        sys.exit(f"tf_ps_train.py: {path}: not an IDX file of bytes")
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def lenet_loss(tf, x, y, batch_size):
    """psrt's LeNet (models/lenet.cc) on images x and labels y: the mean loss."""
    tf1 = tf.compat.v1

    def weights(name, shape):
        return tf1.get_variable(name, shape, initializer=tf1.initializers.he_normal())

    def bias(name, size):
        return tf1.get_variable(name, [size], initializer=tf1.zeros_initializer())

    def conv_pool(h, name, in_channels, out_channels):
        h = tf.nn.conv2d(h, weights(name + "/weights", [5, 5, in_channels, out_channels]),
                         strides=1, padding="SAME")
        h = tf.nn.relu(tf.nn.bias_add(h, bias(name + "/biases", out_channels)))
        return tf.nn.max_pool2d(h, 2, 2, padding="SAME")

    h = conv_pool(x, "conv1", 1, 32)
    h = conv_pool(h, "conv2", 32, 64)
    h = tf.reshape(h, [batch_size, 7 * 7 * 64])
    h = tf.nn.relu(tf.matmul(h, weights("fc1/weights", [7 * 7 * 64, 512])) +
                   bias("fc1/biases", 512))
    logits = tf.matmul(h, weights("fc2/weights", [512, 10])) + bias("fc2/biases", 10)
    loss = tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    return loss


def launch(args):
    """Runs 1 ps and --workers workers; returns the chief's exit status."""
    ps_port, *worker_ports = free_ports(1 + args.workers)
    common = [sys.executable, os.path.abspath(__file__),
              "--ps_hosts", f"127.0.0.1:{ps_port}",
              "--worker_hosts", ",".join(f"127.0.0.1:{p}" for p in worker_ports),
              "--steps", str(args.steps), "--batch_size", str(args.batch_size),
              "--threads", str(args.threads), "--warmup", str(args.warmup),
              "--data_dir", args.data_dir] + (["--verbose"] if args.verbose else [])
    ps = subprocess.Popen(common + ["--job_name", "ps", "--task_index", "0"])
    workers = [subprocess.Popen(common + ["--job_name", "worker", "--task_index", str(i)])
               for i in range(args.workers)]
    try:
        # The chief ends the job; the other workers may stay blocked on the
        # sync token queue after the last step, as in TensorFlow's own jobs.
        code = workers[0].wait()
    finally:
        for task in workers + [ps]:
            if task.poll() is None:
                task.kill()
            task.wait()
    return code


def read_training_set(data_dir):
    import numpy as np
    images = read_idx(os.path.join(data_dir, "train-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, "train-labels-idx1-ubyte.gz"))
    return (images.astype(np.float32) / 255.0).reshape(-1, 28, 28, 1), labels.astype(np.int64)


def run_local(args):
    """TensorFlow's compute bound: one process, no ps, the same graph, feed
    and threads, plain SGD applied in place."""
    import numpy as np
    import tensorflow as tf
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    images, labels = read_training_set(args.data_dir)
    x = tf1.placeholder(tf.float32, [args.batch_size, 28, 28, 1])
    y = tf1.placeholder(tf.int64, [args.batch_size])
    train_op = tf1.train.GradientDescentOptimizer(0.01).minimize(
        lenet_loss(tf, x, y, args.batch_size))
    config = tf1.ConfigProto(intra_op_parallelism_threads=args.threads,
                             inter_op_parallelism_threads=args.threads)
    rng = np.random.default_rng(0)
    with tf1.Session(config=config) as session:
        session.run(tf1.global_variables_initializer())
        for step in range(args.steps):
            if step == args.warmup:
                started = time.perf_counter()
            pick = rng.integers(0, len(images), args.batch_size)
            session.run(train_op, feed_dict={x: images[pick], y: labels[pick]})
        seconds = time.perf_counter() - started
    print(f"tf_local: model=lenet batch={args.batch_size} threads={args.threads} "
          f"examples_per_sec={(args.steps - args.warmup) * args.batch_size / seconds:.0f} "
          f"tf={tf.__version__}", flush=True)
    return 0


def run_task(args):
    import numpy as np
    import tensorflow as tf
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    worker_hosts = args.worker_hosts.split(",")
    cluster = tf.train.ClusterSpec({"ps": [args.ps_hosts], "worker": worker_hosts})
    config = tf1.ConfigProto()
    if args.job_name == "worker":
        config.intra_op_parallelism_threads = args.threads
        config.inter_op_parallelism_threads = args.threads
    # A worker that is not the chief polls for the chief's initialized
    # model every 30 s by default (SessionManager's recovery_wait_secs),
    # which would leave the chief training alone at first.
    from tensorflow.python.training import session_manager
    manager_init = session_manager.SessionManager.__init__

    def init_polling_fast(self, *positional, **named):
        named.setdefault("recovery_wait_secs", 0.2)
        manager_init(self, *positional, **named)

    session_manager.SessionManager.__init__ = init_polling_fast
    server = tf.distribute.Server(cluster, job_name=args.job_name,
                                  task_index=args.task_index, config=config)
    if args.job_name == "ps":
        server.join()
        return 0

    images, labels = read_training_set(args.data_dir)
    num_workers = len(worker_hosts)
    is_chief = args.task_index == 0
    with tf1.device(tf1.train.replica_device_setter(
            worker_device=f"/job:worker/task:{args.task_index}", cluster=cluster)):
        x = tf1.placeholder(tf.float32, [args.batch_size, 28, 28, 1])
        y = tf1.placeholder(tf.int64, [args.batch_size])
        loss = lenet_loss(tf, x, y, args.batch_size)
        global_step = tf1.train.get_or_create_global_step()
        optimizer = tf1.train.SyncReplicasOptimizer(
            tf1.train.GradientDescentOptimizer(0.01),
            replicas_to_aggregate=num_workers, total_num_replicas=num_workers)
        train_op = optimizer.minimize(loss, global_step=global_step)
    hooks = [optimizer.make_session_run_hook(is_chief),
             tf1.train.StopAtStepHook(last_step=args.steps)]
    rng = np.random.default_rng(args.task_index)
    started = ended = None
    start_step = step = 0
    with tf1.train.MonitoredTrainingSession(master=server.target, is_chief=is_chief,
                                            hooks=hooks, config=config,
                                            save_checkpoint_secs=None,
                                            save_summaries_steps=None,
                                            log_step_count_steps=None) as session:
        while not session.should_stop():
            pick = rng.integers(0, len(images), args.batch_size)
            _, step = session.run([train_op, global_step],
                                  feed_dict={x: images[pick], y: labels[pick]})
            ended = time.perf_counter()
            if started is None and step >= args.warmup:
                started, start_step = ended, step
            if args.verbose and step % 10 == 0:
                print(f"task {args.task_index} step {step} {ended:.2f}", flush=True)
        if is_chief and started is not None and step > start_step:
            job_eps = (step - start_step) * num_workers * args.batch_size / (ended - started)
            print(f"tf_ps: model=lenet workers={num_workers} batch={args.batch_size} "
                  f"threads={args.threads} steps={args.steps} job_eps={job_eps:.0f} "
                  f"tf={tf.__version__}", flush=True)
        # Closing the session waits on the sync queues the other workers
        # still block on (minutes); the launcher ends every task instead.
        os._exit(0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--batch_size", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--local", action="store_true",
                        help="one process, no ps: TensorFlow's compute bound")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--job_name", choices=["ps", "worker"])
    parser.add_argument("--task_index", type=int, default=0)
    parser.add_argument("--ps_hosts")
    parser.add_argument("--worker_hosts")
    args = parser.parse_args()
    if args.steps <= args.warmup:
        parser.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    if args.local:
        return run_local(args)
    if args.job_name is None:
        return launch(args)
    return run_task(args)


if __name__ == "__main__":
    sys.exit(main())
