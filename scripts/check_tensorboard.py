#!/usr/bin/env python3
"""Lists every scalar in a TensorBoard log directory, as TensorBoard reads it.

    scripts/check_tensorboard.py LOGDIR [--expect_tags loss,accuracy] [--max_points N]

Reads the event files with TensorBoard's own reader (EventAccumulator, from
the `tensorboard` PyPI package: `pip install tensorboard`), so a file that
passes here is a file TensorBoard plots. LOGDIR may hold event files directly
or in run subdirectories (one run per directory, as `tensorboard --logdir`
sees them); a single event file works too. Prints, per run and tag, the
number of points and each (step, value), e.g.

    run . (logs/events.out.tfevents.1700000000.host)
      loss: 3 points
        step 100  value 2.3026  wall_time 1700000003.125
        ...

Exits 1 when there is no scalar at all or an --expect_tags tag is missing.
"""
import argparse
import os
import sys

try:
    from tensorboard.backend.event_processing import event_accumulator
except ImportError:
    sys.exit("check_tensorboard.py: the tensorboard package is missing; "
             "install it with: pip install tensorboard")


def run_dirs(logdir):
    """Every directory under logdir holding an event file (logdir first)."""
    runs = []
    for root, dirs, files in os.walk(logdir):
        dirs.sort()
        if any("tfevents" in f for f in files):
            runs.append(root)
    return runs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logdir", help="log directory or one event file")
    parser.add_argument("--expect_tags", default="",
                        help="comma-separated scalar tags that must be present")
    parser.add_argument("--max_points", type=int, default=0,
                        help="print at most this many points per tag "
                             "(first and last ones); 0: all")
    args = parser.parse_args()

    if os.path.isfile(args.logdir):
        runs = [args.logdir]
    elif os.path.isdir(args.logdir):
        runs = run_dirs(args.logdir)
    else:
        sys.exit("check_tensorboard.py: %s: no such file or directory" % args.logdir)
    if not runs:
        sys.exit("check_tensorboard.py: no event files (*tfevents*) under %s" % args.logdir)

    seen = set()
    total = 0
    for run in runs:
        # size_guidance 0: keep every point (TensorBoard samples by default).
        acc = event_accumulator.EventAccumulator(
            run, size_guidance={event_accumulator.SCALARS: 0})
        acc.Reload()
        if os.path.isdir(run):
            files = sorted(f for f in os.listdir(run) if "tfevents" in f)
            print("run %s (%s)" % (os.path.relpath(run, args.logdir), ", ".join(files)))
        else:
            print("file %s" % run)
        tags = sorted(acc.Tags()[event_accumulator.SCALARS])
        if not tags:
            print("  no scalars")
        for tag in tags:
            points = acc.Scalars(tag)
            seen.add(tag)
            total += len(points)
            print("  %s: %d points" % (tag, len(points)))
            shown = points
            if args.max_points and len(points) > args.max_points:
                half = args.max_points // 2
                shown = points[:half] + [None] + points[-(args.max_points - half):]
            for p in shown:
                if p is None:
                    print("    ...")
                    continue
                print("    step %-8d value %-12.6g wall_time %.3f" %
                      (p.step, p.value, p.wall_time))

    missing = [t for t in args.expect_tags.split(",") if t and t not in seen]
    if missing:
        sys.exit("check_tensorboard.py: missing scalar tags: %s" % ", ".join(missing))
    if total == 0:
        sys.exit("check_tensorboard.py: no scalars in %s" % args.logdir)


if __name__ == "__main__":
    main()
