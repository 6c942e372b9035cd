#!/usr/bin/env python3
"""End-to-end training speed: gluon resnet18_v1 with dist_byteps, dist_sync and one process.

    python benchmarks/bench_training.py                    # emulated 1 Gbit/s links (root)
    python benchmarks/bench_training.py --network loopback --workers 2 --servers 2

Each job runs ``benchmarks/_train_worker.py`` (synthetic 32x32 images, a small batch per
worker, so communication and not the 2 cores' compute dominates) through ``launch.py``:

* ``dist_byteps`` with our scheduler and servers, with priority scheduling on and off
  (``--no-priority``: every gradient at priority 0), on the van of ``--van`` and with the
  settings of ``--byteps-env`` (as in ``bench_pushpull.py``);
* ``dist_sync`` with MXNet's scheduler and C++ servers;
* one process without a store and without a cluster (the compute-only anchor: the whole
  machine's 2 cores for one worker's batch).

``--updates workers,servers`` runs each store's jobs with the optimizer (``--optimizer``) on
the workers (``update_on_kvstore=False``, the default) and on the store's servers
(``update_on_kvstore=True``: MXNet's C++ servers for ``dist_sync``, ours for ``dist_byteps``).

Steps/s are the slowest worker's (``--steps`` timed steps after ``--warmup``). Each side runs
``--repeats`` times, alternating; the table keeps each side's best. A benchmark, not a test:
it reports what it measured, with the date, the load and the link rate.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time
from typing import Dict, List, Optional

# the same environment, link check and dist_byteps job options as the push/pull benchmark
from bench_pushpull import (add_byteps_job_arguments, byteps_launch_options, check_byteps_env,
                            child_env, describe_byteps_jobs, masked, measure_links)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "_train_worker.py")
LAUNCH = os.path.join(ROOT, "launch.py")
RESULT_RE = re.compile(r"^\[worker \d+\] TRAIN_RESULT (\{.*\})$")

#: (label, kvstore, launch.py options, worker options)
SIDES = [
    ("dist_byteps, priority on", "dist_byteps", [], []),
    ("dist_byteps, priority off", "dist_byteps", [], ["--no-priority"]),
    ("dist_sync (MXNet)", "dist_sync", ["--scheduler", "mxnet", "--server", "mxnet"], []),
]


def sides(args) -> List[tuple]:
    """The runs of one repeat: each side of :data:`SIDES` for each ``--updates`` placement."""
    runs = []
    for where in args.updates:
        for label, kvstore, launch_opts, worker_opts in SIDES:
            if args.no_priority_run and "--no-priority" in worker_opts:
                continue
            suffix = "" if args.updates == ["workers"] else ", updates on the %s" % where
            runs.append((label + suffix, kvstore, launch_opts, worker_opts + [
                "--update-on", where, "--optimizer", args.optimizer]))
    return runs


def run_job(args, kvstore: str, launch_opts: List[str], worker_opts: List[str],
            workers: int, servers: int) -> Optional[float]:
    """Steps/s of the slowest worker, or None (the output's tail is printed)."""
    network = ["--launcher", "netns", "--link-rate", args.link_rate] \
        if args.network == "netns" else []
    if kvstore == "dist_byteps":
        launch_opts = byteps_launch_options(args.van, args.byteps_env) + launch_opts
    worker = [sys.executable, WORKER, "--kvstore", kvstore, "--steps", str(args.steps),
              "--warmup", str(args.warmup), "--batch-size", str(args.batch_size), *worker_opts]
    # the single process needs no cluster: run it alone (a prefix as if launched)
    argv = (["sh", "-c", '"$@" 2>&1 | sed "s/^/[worker 0] /"', "sh", *worker]
            if kvstore == "none" else
            [sys.executable, LAUNCH, "-n", str(workers), "-s", str(servers), *network,
             *launch_opts, "--timeout", str(args.job_timeout), *worker])
    done = subprocess.run(argv, env=child_env(), cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=args.job_timeout + 30)
    out = done.stdout.decode(errors="replace")
    results = [json.loads(m.group(1)) for m in map(RESULT_RE.match, out.splitlines()) if m]
    if done.returncode != 0 or len(results) != workers:
        print("job failed (exit %d):\n%s" % (done.returncode, "\n".join(out.splitlines()[-10:])))
        return None
    args.grad_bytes = results[0]["grad_bytes"]   # what the workers report they send per step
    return args.steps / max(r["seconds"] for r in results)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--network", choices=["netns", "loopback"], default="netns")
    p.add_argument("--link-rate", default="1gbit")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--servers", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--job-timeout", type=float, default=400.0)
    p.add_argument("--out", default=os.path.join("bench_out", "training.json"))
    p.add_argument("--updates", default="workers", type=lambda text: text.split(","),
                   help="where the optimizer runs, a comma-separated list of: workers, servers")
    p.add_argument("--optimizer", default="sgd", help="sgd, momentum or adam")
    p.add_argument("--no-priority-run", action="store_true",
                   help="leave out dist_byteps with priority scheduling off")
    add_byteps_job_arguments(p, "BYTEPS_PARTITION_BYTES=768000")
    args = p.parse_args(argv)
    check_byteps_env(p, args.byteps_env)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    load_before = os.getloadavg()[0]
    link_rate = measure_links(args.link_rate) if args.network == "netns" else None
    best: Dict[str, Optional[float]] = {}
    single = None
    for _ in range(args.repeats):
        for label, kvstore, launch_opts, worker_opts in sides(args):
            rate = run_job(args, kvstore, launch_opts, worker_opts, args.workers, args.servers)
            print("%-28s %s steps/s" % (label, "failed" if rate is None else "%.2f" % rate),
                  flush=True)
            if rate is not None:
                best[label] = max(rate, best.get(label) or 0.0)
            else:
                best.setdefault(label, None)
        # the compute-only anchor: one process, no store, no network
        rate = run_job(args, "none", [], [], 1, 0)
        print("%-28s %s steps/s" % ("one process, no store", "failed" if rate is None
                                     else "%.2f" % rate), flush=True)
        single = max(single or 0.0, rate or 0.0) or None
    # the link bound of a parameter server: each worker sends and receives the gradients
    grad_bytes = getattr(args, "grad_bytes", None)
    bound = (link_rate / (grad_bytes * max(1.0, args.workers / args.servers))
             if link_rate and grad_bytes else None)
    print("\n| run | steps/s | vs dist_sync | of the link bound |\n|---|---|---|---|")
    for label, speed in list(best.items()) + [("one process, no store", single)]:
        placement = label[label.find(", updates on"):] if ", updates on" in label else ""
        sync = best.get("dist_sync (MXNet)" + placement)
        print("| %s | %s | %s | %s |" % (
            label, "failed" if speed is None else "%.2f" % speed,
            "%.2fx" % (speed / sync) if speed and sync else "-",
            "%.0f%%" % (100 * speed / bound) if speed and bound and "store" not in label
            else "-"))
    if bound:
        print("link bound: %.2f steps/s (%.1f MB of gradients at %.1f MB/s measured)"
              % (bound, grad_bytes / 1e6, link_rate / 1e6))
    print("\n%d workers x %d servers, %s, resnet18_v1 batch %d per worker, %d timed steps; "
          "load %.2f -> %.2f; %s" % (args.workers, args.servers,
                                     "emulated %s links" % args.link_rate
                                     if args.network == "netns" else "loopback",
                                     args.batch_size, args.steps, load_before,
                                     os.getloadavg()[0], time.strftime("%Y-%m-%d %H:%M")))
    print(describe_byteps_jobs(args.van, args.byteps_env))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"args": dict(vars(args), byteps_env=masked(args.byteps_env)),
                   "steps_per_s": best, "single_process": single,
                   "link_rate_bytes_per_s": link_rate, "link_bound_steps_per_s": bound,
                   "load_before_after": [load_before, os.getloadavg()[0]]}, f, indent=1)
    return 0 if all(best.values()) and single else 1


if __name__ == "__main__":
    sys.exit(main())
