#!/usr/bin/env python3
"""A replayed accelerator training step: dist_byteps against MXNet's dist_sync, same machine.

    python benchmarks/bench_replay.py --network netns --link-rate 500mbit --compute-ratio 1
    python benchmarks/bench_replay.py --network loopback --workers 2 --servers 2 --compute 0.5

Every worker runs ``benchmarks/_replay_worker.py``: a model's parameter shapes and per-layer
compute (``benchmarks/data/replay_models.json``, made by ``replay_models.py``) replayed as a
GPU step looks from the host: the compute is time in which the host CPU is free, gradients are
handed to the store in backward order with gluon's priorities, and the next forward waits for
each layer's sum. The step's compute is ``--compute`` seconds, or ``--compute-ratio`` times
S / rate (S: the model's bytes; rate: the emulated link's TCP rate, measured in the same run).

Bounds: a worker sends and receives S per step (with at least as many servers as workers), so
the step cannot be shorter than S / rate (the link bound) nor than the compute (the overlap
bound is the larger of the two). The table shows each system's slowest-worker median step, its
fraction of the bound, its scaling efficiency (compute / step: one worker without
communication takes exactly the compute), the ratio dist_sync / dist_byteps (> 1: we are
faster), the median time the forward waited for sums (the communication the step did not
hide), the CPU seconds per step of each role's process (workers, servers and scheduler, ours
and MXNet's alike, read from ``/proc``: ``_role_usage.py``), how busy the machine's CPUs were
(near 100%: the CPU, not the network, bound the step) and how busy the workers' links were
each way (bytes moved over what the link could move in the step); ``--out`` also draws
the last step of the slowest worker of each system as a timeline (PNG next to the JSON, with
matplotlib). Systems alternate ``--repeats`` times; each keeps its best median. A benchmark,
never a test: it reports what it measured with the date, the commit and the load.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional

from bench_pushpull import (add_byteps_job_arguments, byteps_launch_options, check_byteps_env,
                            child_env, describe_byteps_jobs, masked, measure_links)
from _role_usage import JOB_MARK, RoleUsage
from replay_models import model_bytes

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "_replay_worker.py")
LAUNCH = os.path.join(ROOT, "launch.py")
RESULT_TAG = "REPLAY_RESULT "
SYSTEMS = {
    # label: (kvstore, launch.py options)
    "dist_byteps": ("dist_byteps", ["--scheduler", "byteps", "--server", "byteps"]),
    "dist_sync": ("dist_sync", ["--scheduler", "mxnet", "--server", "mxnet"]),
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet50_v1", help="resnet50_v1, vgg16 or bert_base")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    p.add_argument("--network", choices=["loopback", "netns"], default="netns")
    p.add_argument("--link-rate", default="500mbit", help="emulated link rate (netns)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--servers", type=int, default=4)
    p.add_argument("--compute", type=float, help="compute seconds per step")
    p.add_argument("--compute-ratio", type=float,
                   help="compute per step as a multiple of S / rate (netns)")
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--systems", default="dist_byteps,dist_sync")
    p.add_argument("--job-timeout", type=float, default=600)
    p.add_argument("--out", help="results JSON (e.g. benchmarks/results/replay_....json)")
    add_byteps_job_arguments(p, "BYTEPS_PARTITION_BYTES=768000")
    args = p.parse_args(argv)
    check_byteps_env(p, args.byteps_env)
    if (args.compute is None) == (args.compute_ratio is None):
        p.error("give either --compute or --compute-ratio")
    if args.compute_ratio is not None and args.network != "netns":
        p.error("--compute-ratio needs the emulated network's measured rate (--network netns)")
    return args


def run_job(args, system: str, compute: float) -> Optional[Dict]:
    """The workers' results of one job, or None (the output's tail is printed)."""
    kvstore, options = SYSTEMS[system]
    if kvstore == "dist_byteps":
        options = byteps_launch_options(args.van, args.byteps_env) + options
    network = ["--launcher", "netns", "--link-rate", args.link_rate] \
        if args.network == "netns" else []
    argv = [sys.executable, LAUNCH, "-n", str(args.workers), "-s", str(args.servers),
            *network, *options, "--timeout", str(args.job_timeout), "--grace", "20",
            sys.executable, WORKER, "--kvstore", kvstore, "--model", args.model,
            "--dtype", args.dtype, "--compute", "%.4f" % compute, "--steps", str(args.steps),
            "--warmup", str(args.warmup)]
    mark = "%s-%d-%d" % (system, os.getpid(), time.monotonic_ns())
    with RoleUsage(mark) as usage:
        done = subprocess.run(argv, env={**child_env(), JOB_MARK: mark}, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=args.job_timeout + 60)
    out = done.stdout.decode(errors="replace")
    results = []
    for line in out.splitlines():
        at = line.find(RESULT_TAG)
        if at >= 0:
            results.append(json.loads(line[at + len(RESULT_TAG):]))
    if done.returncode != 0 or len(results) != args.workers:
        print("%s failed (exit %d):\n%s" % (system, done.returncode,
                                           "\n".join(out.splitlines()[-12:])), flush=True)
        return None
    # a step ends when the slowest worker's does: the slowest worker's median
    slowest = max(results, key=lambda r: statistics.median(r["steps"]))
    window = (min(r["window"][0] for r in results), max(r["window"][1] for r in results))
    return {"step_s": statistics.median(slowest["steps"]), "timeline": slowest["timeline"],
            "exposed_s": max(statistics.median(r["waits"]) for r in results),
            # every role's CPU and link bytes per step, as seen from outside
            "roles": usage.per_step(*window, steps=args.steps,
                                    nodes={"worker": args.workers, "server": args.servers,
                                           "scheduler": 1}),
            "machine_busy": usage.machine_busy(*window),
            "wrong_sums": sum(r["wrong_sums"] for r in results)}


def git_commit() -> str:
    """The commit measured; "-dirty" if the code differed from it (results files aside: a
    benchmark run writes them)."""
    def git(*argv):
        return subprocess.run(["git", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                              check=True).stdout.decode().strip()
    try:
        changed = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                      ":(exclude)benchmarks/results")
        return git("rev-parse", "--short", "HEAD") + ("-dirty" if changed else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv=None) -> int:
    args = parse_args(argv)
    size = model_bytes(args.model, args.dtype)
    rate = measure_links(args.link_rate) if args.network == "netns" else None
    link_bound = size / rate if rate else None
    compute = args.compute if args.compute is not None else args.compute_ratio * link_bound
    bound = max(compute, link_bound or 0.0)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    load_before = os.getloadavg()[0]
    best: Dict[str, Dict] = {}
    from tqdm import tqdm
    total = args.repeats * len(systems)
    with tqdm(total=total, unit="job", dynamic_ncols=True) as bar:
        for n in range(total):
            system = systems[n % len(systems)]
            bar.set_description("%s %s, compute %.2f s" % (system, args.model, compute))
            result = run_job(args, system, compute)
            if result is not None and (system not in best
                                       or result["step_s"] < best[system]["step_s"]):
                best[system] = result
            bar.update(1)
    load_after = os.getloadavg()[0]
    rows = table(args, best, size, compute, link_bound, bound)
    print("\n".join(rows))
    if args.out:
        write_json(args, best, size, compute, link_bound, bound, (load_before, load_after))
    return 0 if best and all(r["wrong_sums"] == 0 for r in best.values()) else 1


def table(args, best, size, compute, link_bound, bound) -> List[str]:
    head = ("%s, %s, %d workers x %d servers, %s; S = %.1f MB, compute %.2f s per step%s; "
            "bound %.2f s" % (args.model, args.dtype, args.workers, args.servers,
                              "emulated %s links" % args.link_rate if args.network == "netns"
                              else "loopback", size / 1e6, compute,
                              ", link bound %.2f s" % link_bound if link_bound else "", bound))
    rows = [head, "| system | step | of the bound | efficiency | vs dist_sync | exposed "
            "| CPU/step: worker, server, scheduler | machine CPU busy | worker link busy |",
            "|---|---|---|---|---|---|---|---|---|"]
    upstream = best.get("dist_sync")
    for system, result in best.items():
        ratio = ("%.2fx" % (upstream["step_s"] / result["step_s"]) if upstream else "-")
        busy = result.get("machine_busy")
        rows.append("| %s | %.3f s | %.0f%% | %.0f%% | %s | %.3f s | %s | %s | %s |" % (
            system, result["step_s"], 100 * bound / result["step_s"],
            100 * compute / result["step_s"], ratio, result["exposed_s"],
            cpu_per_role(result), "%.0f%%" % (100 * busy) if busy is not None else "?",
            link_busy(result, size, link_bound)))
    return rows


def cpu_per_role(result) -> str:
    """The CPU seconds per step of a node of each role."""
    roles = result.get("roles", {})
    return ", ".join("%.2f s" % roles[role]["cpu_s"] if role in roles else "?"
                     for role in ("worker", "server", "scheduler"))


def link_busy(result, size, link_bound) -> str:
    """How much of the step the workers' links were busy, each way: bytes moved over what the
    link could have moved in the step (at the rate measured at start); "-" on loopback."""
    worker = result.get("roles", {}).get("worker", {})
    if link_bound is None or "tx_mb" not in worker:
        return "-"
    rate = size / link_bound / 1e6                      # MB/s
    capacity = rate * result["step_s"]
    return "out %.0f%%, in %.0f%%" % (100 * worker["tx_mb"] / capacity,
                                      100 * worker["rx_mb"] / capacity)


def write_json(args, best, size, compute, link_bound, bound, load) -> None:
    ours, upstream = best.get("dist_byteps"), best.get("dist_sync")
    data = {
        "benchmark": "replay",
        "network": ("emulated %s links" % args.link_rate if args.network == "netns"
                    else "loopback"),
        "command": " ".join(["benchmarks/bench_replay.py"] + masked(sys.argv[1:])),
        "settings": describe_byteps_jobs(args.van, args.byteps_env),
        "bytes": size, "compute_s": compute, "link_bound_s": link_bound, "bound_s": bound,
        "systems": best,
        "rows": [{
            "case": "%s step (%s), compute %.2f s" % (args.model, args.dtype, compute),
            "topology": "%dx%d" % (args.workers, args.servers),
            "van": describe_byteps_jobs(args.van, args.byteps_env).replace("dist_byteps ", ""),
            "upstream_ms": upstream["step_s"] * 1000 if upstream else None,
            "byteps_ms": ours["step_s"] * 1000 if ours else None,
            "byteps_bound_pct": round(100 * bound / ours["step_s"]) if ours else None,
            "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
            "commit": git_commit(), "load": "%.2f -> %.2f" % load}],
    }
    with open(args.out, "w") as f:
        json.dump(data, f, indent=1)
    print("wrote", args.out)
    plot(best, os.path.splitext(args.out)[0] + ".png", data["rows"][0]["case"])


def plot(best: Dict[str, Dict], path: str, title: str) -> None:
    """One step of each system's slowest worker: compute (forward, backward) and the forward's
    waits for sums, on one time axis."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plot: pip install matplotlib (the bench extra)")
        return
    colours = {"forward": "#4c72b0", "backward": "#55a868", "wait": "#c44e52"}
    fig, ax = plt.subplots(figsize=(10, 1 + 0.6 * len(best)))
    for row, (system, result) in enumerate(best.items()):
        for kind, start, end in result["timeline"]:
            ax.barh(row, end - start, left=start, color=colours[kind], height=0.6)
    ax.set_yticks(range(len(best)))
    ax.set_yticklabels(list(best))
    ax.set_xlabel("seconds from the step's start (blue forward, green backward, red waiting "
                  "for sums)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print("wrote", path)


if __name__ == "__main__":
    sys.exit(main())
