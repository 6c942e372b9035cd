#!/usr/bin/env python3
"""A replayed accelerator training step: dist_byteps, MXNet's dist_sync, an all-reduce anchor
and a plain-socket ceiling, on the same machine in the same run.

    python benchmarks/bench_replay.py --network netns --link-rate 500mbit --compute-ratio 1
    python benchmarks/bench_replay.py --network loopback --workers 2 --servers 2 --compute 0.5

Every worker runs ``benchmarks/_replay_worker.py``: a model's parameter shapes and per-layer
compute (``benchmarks/data/replay_models.json``, made by ``replay_models.py``) replayed as a
GPU step looks from the host: the compute is time in which the host CPU is free, gradients are
handed to the store in backward order with gluon's priorities, and the next forward waits for
each layer's sum. The step's compute is ``--compute`` seconds, or ``--compute-ratio`` times
S / rate (S: the model's bytes; rate: the emulated link's TCP rate, measured in the same run).

Systems (``--systems``): ``dist_byteps`` (ours, the ``--van``/``--byteps-env`` settings),
``dist_sync`` (MXNet's C++ scheduler and servers), ``gloo`` (torch.distributed's ring
all-reduce with DDP's gradient buckets, ``_gloo_replay.py``; needs torch) and ``plain`` (the
ceiling: the least a Python parameter server can do, on bare sockets, ``_plain_ps.py``).

Bounds: a worker sends and receives S per step (with at least as many servers as workers), so
the step cannot be shorter than S / rate (the link bound) nor than the compute (the overlap
bound is the larger of the two). One flow's rate overstates what a PS step's W x S flows get
from TCP at once: bare sockets exchanging exactly that traffic (``bench_mesh.py``) give a
tighter bound, shown in brackets. The table shows each system's slowest-worker median step,
its fraction of the bounds, its scaling efficiency (compute / step: one worker without
communication takes exactly the compute), dist_sync's and gloo's step over its own (> 1: it
is faster), the median time the forward waited for sums (the communication the step did not
hide), the CPU seconds per step of each role's process (workers, servers and scheduler, read
from ``/proc`` for every system alike: ``_role_usage.py``), how long per step the workers'
training threads were ready to run but waited for a core (the kernel's run-queue wait: what
busy cores add to the step), how busy the machine's CPUs were (near 100%: the CPU, not the
network, bound the step) and how busy the workers' links were each way (bytes moved over
what the link could move in the step). ``--out`` writes the JSON
(``results_table.py replay`` makes the docs' table from those files) and draws the last step
of the slowest worker of each system as a timeline (PNG next to the JSON, with matplotlib).
Systems alternate ``--repeats`` times; each keeps its best median. A benchmark, never a test:
it reports what it measured with the date, the commit and the load.
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional

import bench_mesh
from bench_pushpull import (add_byteps_job_arguments, byteps_launch_options, check_byteps_env,
                            child_env, describe_byteps_jobs, gloo_note, masked, measure_links)
from _role_usage import JOB_MARK, RoleUsage
from replay_models import model_bytes
from results_table import replay_row

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "_replay_worker.py")
LAUNCH = os.path.join(ROOT, "launch.py")
RESULT_TAG = "REPLAY_RESULT "
PLAIN = "%s %s" % (sys.executable, os.path.join(HERE, "_plain_ps.py"))
GLOO = "%s %s" % (sys.executable, os.path.join(HERE, "_gloo_replay.py"))
SYSTEMS = {
    # label: (kvstore, launch.py options)
    "dist_byteps": ("dist_byteps", ["--scheduler", "byteps", "--server", "byteps"]),
    "dist_sync": ("dist_sync", ["--scheduler", "mxnet", "--server", "mxnet"]),
    # the ceiling: a bare Python parameter server on plain sockets (_plain_ps.py)
    "plain": ("plain", ["--scheduler-cmd", PLAIN + " scheduler",
                        "--server-cmd", PLAIN + " server"]),
    # the all-reduce anchor: torch gloo with DDP's gradient buckets (_gloo_replay.py)
    "gloo": ("gloo", ["--scheduler-cmd", GLOO + " rendezvous", "--server-cmd", GLOO + " idle"]),
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
    p.add_argument("--systems", default="dist_byteps,dist_sync,gloo,plain",
                   help="of: " + ", ".join(SYSTEMS))
    p.add_argument("--plain-partition-bytes", type=int, default=384000,
                   help="the plain-socket ceiling's partition size (its best here: 384000 "
                        "beat 768000, 1536000 and 4096000 at 4x4 on 500 Mbit/s links)")
    p.add_argument("--job-timeout", type=float, default=600)
    p.add_argument("--out", help="results JSON (e.g. benchmarks/results/replay_....json)")
    p.add_argument("--optimizer", choices=["none", "momentum", "adam"], default="none",
                   help="the servers' optimizer for dist_byteps and dist_sync (set_optimizer, "
                   "as update_on_kvstore=True); none: the servers sum, the workers' device "
                   "would update")
    add_byteps_job_arguments(p, "BYTEPS_PARTITION_BYTES=768000")
    args = p.parse_args(argv)
    check_byteps_env(p, args.byteps_env)
    unknown = set(args.systems.split(",")) - set(SYSTEMS)
    if unknown:
        p.error("unknown systems: %s (of %s)" % (", ".join(sorted(unknown)), ", ".join(SYSTEMS)))
    if args.optimizer != "none" and set(args.systems.split(",")) - {"dist_byteps", "dist_sync"}:
        p.error("--optimizer runs on MXNet stores' servers: --systems dist_byteps,dist_sync")
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
    elif kvstore == "plain":
        options = ["--env", "PLAIN_PARTITION_BYTES=%d" % args.plain_partition_bytes] + options
    network = ["--launcher", "netns", "--link-rate", args.link_rate] \
        if args.network == "netns" else []
    argv = [sys.executable, LAUNCH, "-n", str(args.workers), "-s", str(args.servers),
            *network, *options, "--timeout", str(args.job_timeout), "--grace", "20",
            sys.executable, WORKER, "--kvstore", kvstore, "--model", args.model,
            "--dtype", args.dtype, "--compute", "%.4f" % compute, "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--optimizer", args.optimizer]
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
            "worker_threads_s": slowest.get("threads_s"),   # CPU per step, by thread
            # every role's CPU and link bytes per step, as seen from outside
            "roles": usage.per_step(*window, steps=args.steps,
                                    nodes={"worker": args.workers, "server": args.servers,
                                           "scheduler": 1}),
            "machine_busy": usage.machine_busy(*window),
            "wrong_sums": sum(r["wrong_sums"] for r in results),
            "sized_partitions": sized_partitions(out), "van": chosen_van(out)}


def sized_partitions(out: str) -> Optional[str]:
    """The partition size dist_byteps' rank 0 chose from its link, as its start-up line says
    (e.g. "768000 bytes for 62 MB/s"); None when it was set (or the job was not ours)."""
    found = re.search(r"partitions of (\d+) bytes \(sized for rank 0's link to the servers: "
                      r"(\d+) MB/s\)", out)
    return found and "%s bytes for %s MB/s" % found.groups()


def chosen_van(out: str) -> Optional[str]:
    """The transport dist_byteps' rank 0 names in its start-up line (the default van says
    which one it chose, e.g. "byteps_tcp (auto: every peer is ours)")."""
    found = re.search(r"; van (.+?); partitions of", out)
    return found and found.group(1)


def write_results(path: str, data: dict, load_before: float) -> None:
    """``data`` as a results file at ``path``, with the date, the commit and the load."""
    data = dict(data, date=datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
                commit=git_commit(), load="%.2f -> %.2f" % (load_before, os.getloadavg()[0]))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
    print("wrote", path)


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
    # what TCP gets for a PS step's W x S flows at once: a tighter bound than one flow's rate
    mesh = measure_mesh(args, size) if args.network == "netns" else None
    tight = max(compute, mesh) if mesh else None
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    gloo = gloo_note() if "gloo" in systems else "run"
    if gloo != "run":
        print("gloo all-reduce anchor %s" % gloo, flush=True)
        systems.remove("gloo")
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
    rows = table(args, best, size, compute, link_bound, bound, tight)
    print("\n".join(rows))
    if args.out:
        write_json(args, best, size, compute, link_bound, bound, mesh,
                   (load_before, load_after))
    return 0 if best and all(r["wrong_sums"] == 0 for r in best.values()) else 1


def measure_mesh(args, size: int) -> float:
    """Seconds that bare sockets take to move one step's traffic (``bench_mesh.py``: each worker
    S / servers to every server and back, all at once) on a fresh emulated network; the better
    of two (it is a bound; single runs moved by 6% between hours)."""
    from kvstore_byteps.launcher.netns import EmulatedNetwork, parse_rate
    with EmulatedNetwork(args.workers + args.servers, parse_rate(args.link_rate)) as net:
        seconds = min(bench_mesh.run_once(net, args.workers, args.servers,
                                          size // args.servers, args.job_timeout)
                      for _ in range(2))
    print("one step's traffic on bare sockets: %.2f s" % seconds, flush=True)
    return seconds


def table(args, best, size, compute, link_bound, bound, tight) -> List[str]:
    head = ("%s, %s, %d workers x %d servers, %s; S = %.1f MB, compute %.2f s per step%s; "
            "bound %.2f s%s" % (args.model, args.dtype, args.workers, args.servers,
                                "emulated %s links" % args.link_rate if args.network == "netns"
                                else "loopback", size / 1e6, compute,
                                ", link bound %.2f s" % link_bound if link_bound else "", bound,
                                " (%.2f s with bare sockets' rate for a step's traffic)" % tight
                                if tight else ""))
    rows = [head, "| system | step | of the bound (of TCP's) | efficiency | vs dist_sync "
            "| vs gloo | exposed | CPU/step: worker, server, scheduler "
            "| training thread waited for a core | machine CPU busy | worker link busy |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for system, result in best.items():
        busy = result.get("machine_busy")
        cells = (system, result["step_s"], 100 * bound / result["step_s"],
                 " (%.0f%%)" % (100 * tight / result["step_s"]) if tight else "",
                 100 * compute / result["step_s"], _ratio(best.get("dist_sync"), result),
                 _ratio(best.get("gloo"), result), result["exposed_s"], cpu_per_role(result),
                 training_wait(result), "%.0f%%" % (100 * busy) if busy is not None else "?",
                 link_busy(result, size, link_bound))
        rows.append("| %s | %.3f s | %.0f%%%s | %.0f%% | %s | %s | %.3f s | %s | %s | %s | %s |"
                    % cells)
    return rows


def _ratio(reference: Optional[Dict], result: Dict) -> str:
    """reference's step over result's (> 1: result is faster)."""
    return "%.2fx" % (reference["step_s"] / result["step_s"]) if reference else "-"


def cpu_per_role(result) -> str:
    """The CPU seconds per step of a node of each role, and the kernel's share of a worker's
    and a server's."""
    roles = result.get("roles", {})
    parts = []
    for role in ("worker", "server", "scheduler"):
        usage = roles.get(role)
        if usage is None:
            parts.append("?")
        elif role != "scheduler" and usage.get("kernel_s") is not None and usage["cpu_s"] > 0:
            parts.append("%.2f s (%.0f%% kernel)" % (usage["cpu_s"],
                                                     100 * usage["kernel_s"] / usage["cpu_s"]))
        else:
            parts.append("%.2f s" % usage["cpu_s"])
    return ", ".join(parts)


def training_wait(result) -> str:
    """Seconds per step a worker's training thread waited for a core ("?" where the kernel
    keeps no scheduler statistics)."""
    wait = result.get("roles", {}).get("worker", {}).get("main_wait_s")
    return "?" if wait is None else "%.2f s" % wait


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


def write_json(args, best, size, compute, link_bound, bound, mesh, load) -> None:
    chosen = best.get("dist_byteps", {}).get("van") if args.van == "auto" else None
    settings = describe_byteps_jobs(chosen or args.van, args.byteps_env)
    sized = best.get("dist_byteps", {}).get("sized_partitions")
    if sized:
        settings += ", partitions sized from the link: %s" % sized
    data = {
        "benchmark": "replay",
        "network": ("emulated %s links" % args.link_rate if args.network == "netns"
                    else "loopback"),
        "command": " ".join(["benchmarks/bench_replay.py"] + masked(sys.argv[1:])),
        "settings": settings, "plain_partition_bytes": args.plain_partition_bytes,
        "model": args.model, "dtype": args.dtype, "optimizer": args.optimizer,
        "workers": args.workers, "servers": args.servers,
        "bytes": size, "compute_s": compute, "link_bound_s": link_bound, "bound_s": bound,
        "mesh_s": mesh, "systems": best,
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "commit": git_commit(), "load": "%.2f -> %.2f" % load,
    }
    with open(args.out, "w") as f:
        json.dump(data, f, indent=1)
    print("wrote", args.out, "; its row of docs/performance.md's replay table:")
    print(replay_row(data))
    plot(best, os.path.splitext(args.out)[0] + ".png",
         "%s step (%s), compute %.2f s, %s" % (args.model, args.dtype, compute, data["network"]))


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
