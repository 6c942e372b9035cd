"""The cost model: CPU per round of a worker and of the servers, ours and MXNet's dist_sync.

    python benchmarks/bench_cost.py                       # 2 workers x 2 servers, loopback
    python benchmarks/bench_cost.py --repeat 2 --out /tmp/cost.json
    python benchmarks/bench_cost.py --repeat 1 --max-round-mb 8 --seconds 1   # a first look

(``--out benchmarks/results/cost/loopback_2x2.json`` replaces docs/performance.md's cost table,
which the test suite compares with that file.)

Runs ``benchmarks/_cost_worker.py`` through ``launch.py`` on 127.0.0.1, alternately with
upstream MXNet 1.9.1 (``dist_sync``: its scheduler, servers and workers) and with ours
(``dist_byteps``, our servers, the van ``auto`` picks), ``--repeat`` times each. Every job runs
a grid of key counts x tensor sizes, one pushpull of every key per round; per cell it measures a
worker's CPU per round (user and system apart, per thread, context switches), the servers' CPU
per round (all of them, sampled from ``/proc``) and what the kernel carried per round (the
machine's TCP segments and loopback bytes sent: the whole job's). Cells whose round would move
more than ``--max-round-mb`` are left out (4000 keys of 4 MB would be 16 GB).

Then, per system and role, a least-squares fit over the cells (each job's cells, all repeats):

    CPU per round = a x keys + b x bytes + c

``a`` is the cost of one key (one tensor through the store, all its messages), ``b`` of one
byte, ``c`` of a round. The table gives them side by side; which term dominates a model's step
follows from its keys and bytes (ResNet-50: 161 tensors, 102 MB). Prints the table and writes
JSON with every cell, the fits, date, commit and load.
"""
import argparse
import datetime
import itertools
import json
import os
import subprocess
import sys
import uuid
from typing import Dict, List, Optional, Sequence

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from _role_usage import JOB_MARK, RoleUsage  # noqa: E402

LAUNCH = os.path.join(ROOT, "launch.py")
WORKER = os.path.join(HERE, "_cost_worker.py")
RESULT_TAG = "COST_RESULT "
KEYS = (10, 100, 1000, 4000)
SIZES = (4 << 10, 64 << 10, 768 << 10, 4 << 20)
SYSTEMS = {"dist_sync": ("dist_sync", "mxnet"), "dist_byteps": ("dist_byteps", "byteps")}


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=1, help="jobs per system, interleaved")
    p.add_argument("--max-round-mb", type=float, default=80.0,
                   help="leave out cells moving more than this per round (default 80)")
    p.add_argument("--seconds", type=float, default=2.5, help="about how long each cell runs")
    p.add_argument("--timeout", type=float, default=600, help="launch.py --timeout of a job")
    p.add_argument("--out", help="results JSON, e.g. benchmarks/results/cost/loopback_2x2.json")
    return p.parse_args(argv)


def grid(max_round_mb: float) -> List[List[int]]:
    return [[keys, size] for keys, size in itertools.product(KEYS, SIZES)
            if keys * size <= max_round_mb * 1e6]


def child_env() -> Dict[str, str]:
    """Our environment minus anything that would change the job's layout or van."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DMLC_", "PS_", "BYTEPS_", "MXNET_KVSTORE"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    return env


def run_job(system: str, cells: List[List[int]], args) -> List[dict]:
    """One job through launch.py; per cell, the workers' results and the servers' CPU."""
    kvstore, server = SYSTEMS[system]
    argv = [sys.executable, LAUNCH, "-n", str(args.workers), "-s", str(args.servers),
            "--scheduler", server, "--server", server, "--timeout", str(args.timeout),
            "--grace", "20", sys.executable, WORKER, "--kvstore", kvstore,
            "--grid", json.dumps(cells), "--seconds", str(args.seconds)]
    mark = uuid.uuid4().hex
    with RoleUsage(mark, period=0.1) as usage:
        done = subprocess.run(argv, env={**child_env(), JOB_MARK: mark}, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=args.timeout + 60)
    output = done.stdout.decode(errors="replace")
    if done.returncode != 0:
        raise SystemExit("%s job failed (exit %d):\n%s" % (system, done.returncode,
                                                           output[-3000:]))
    results = [json.loads(line[line.index(RESULT_TAG) + len(RESULT_TAG):])
               for line in output.splitlines() if RESULT_TAG in line]
    found = []
    for keys, size in cells:
        ranks = [r for r in results if r["keys"] == keys and r["bytes"] == size]
        first = min(ranks, key=lambda r: r["rank"])
        start, end = max(r["start"] for r in ranks), min(r["end"] for r in ranks)
        roles = usage.per_step(start, end, first["rounds"] * (end - start)
                               / (first["end"] - first["start"]),
                               {"server": args.servers, "worker": args.workers})
        worker_cpu = [r["user_s"] + r["system_s"] for r in ranks]
        found.append({
            "system": system, "keys": keys, "bytes": size, "rounds": first["rounds"],
            "wall_s": max(r["wall_s"] for r in ranks),
            "worker_cpu_s": float(np.mean(worker_cpu)),
            "worker_user_s": float(np.mean([r["user_s"] for r in ranks])),
            "worker_system_s": float(np.mean([r["system_s"] for r in ranks])),
            "worker_threads_s": first["threads_s"],
            "worker_switches": float(np.mean([r["voluntary_switches"] + r["involuntary_switches"]
                                              for r in ranks])),
            "worker_gc_s": float(np.mean([r["gc_s"] for r in ranks])),
            "worker_gc_collections": first["gc_collections"],
            "servers_cpu_s": roles.get("server", {}).get("cpu_s", float("nan")) * args.servers,
            "servers_kernel_s": roles.get("server", {}).get("kernel_s", float("nan"))
            * args.servers,
            "tcp_segments": first.get("tcp_segments"), "lo_bytes": first.get("lo_bytes")})
    return found


def fit(cells: List[dict], field: str) -> Dict[str, float]:
    """Least squares ``field = a x keys + b x bytes + c`` over ``cells``; a in seconds per key,
    b in seconds per byte, c in seconds; ``worst`` the largest relative residual."""
    rows = [c for c in cells if np.isfinite(c[field])]
    x = np.array([[c["keys"], c["keys"] * c["bytes"], 1.0] for c in rows])
    y = np.array([c[field] for c in rows])
    # relative errors matter (cells span four orders of magnitude): weight by 1 / y
    w = 1.0 / np.maximum(y, 1e-6)
    coef, *_ = np.linalg.lstsq(x * w[:, None], y * w, rcond=None)
    worst = float(np.max(np.abs(x @ coef - y) / np.maximum(y, 1e-6)))
    return {"a_s_per_key": float(coef[0]), "b_s_per_byte": float(coef[1]),
            "c_s": float(coef[2]), "worst_relative_residual": worst}


def table(fits: Dict[str, Dict[str, Dict[str, float]]]) -> List[str]:
    rows = ["| role, system | a: us per key | b: ms per MB | c: ms per round | worst residual |",
            "|---|---|---|---|---|"]
    for role in ("worker_cpu_s", "servers_cpu_s"):
        for system in SYSTEMS:
            f = fits[system][role]
            rows.append("| %s, %s | %.1f | %.2f | %.2f | %.0f%% |" % (
                "worker" if role == "worker_cpu_s" else "all servers", system,
                f["a_s_per_key"] * 1e6, f["b_s_per_byte"] * 1e9, f["c_s"] * 1e3,
                f["worst_relative_residual"] * 100))
    return rows


def cell_table(cells: List[dict]) -> List[str]:
    """Per cell: worker and servers' CPU per round, ours over dist_sync (means of repeats)."""
    rows = ["| keys x size | worker CPU, dist_sync | worker CPU, ours | ratio | servers CPU, "
            "dist_sync | servers CPU, ours | ratio |", "|---|---|---|---|---|---|---|"]
    key = lambda c: (c["keys"], c["bytes"])     # noqa: E731
    for (keys, size), group in itertools.groupby(sorted(cells, key=key), key=key):
        group = list(group)

        def mean(system, field):
            return float(np.mean([c[field] for c in group if c["system"] == system]))
        w0, w1 = mean("dist_sync", "worker_cpu_s"), mean("dist_byteps", "worker_cpu_s")
        s0, s1 = mean("dist_sync", "servers_cpu_s"), mean("dist_byteps", "servers_cpu_s")
        rows.append("| %d x %s | %.2f ms | %.2f ms | %.2fx | %.2f ms | %.2f ms | %.2fx |" % (
            keys, "%d KB" % (size >> 10) if size < 1 << 20 else "%d MB" % (size >> 20),
            w0 * 1e3, w1 * 1e3, w1 / w0, s0 * 1e3, s1 * 1e3, s1 / s0))
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    cells = grid(args.max_round_mb)
    load = [os.getloadavg()[0]]
    found: List[dict] = []
    for repeat in range(args.repeat):
        for system in SYSTEMS:
            print("%s, job %d of %d ..." % (system, repeat + 1, args.repeat), flush=True)
            found += run_job(system, cells, args)
    load.append(os.getloadavg()[0])
    fits = {system: {role: fit([c for c in found if c["system"] == system], role)
                     for role in ("worker_cpu_s", "servers_cpu_s")} for system in SYSTEMS}
    lines = table(fits) + [""] + cell_table(found)
    print("\n".join(lines))
    if args.out:
        write_results(args.out, "cost", argv, settings=vars(args), cells=found, fits=fits,
                      table=lines, load=load)
    return 0


def write_results(path: str, benchmark: str, argv: Optional[Sequence[str]], **fields) -> None:
    """``fields`` as JSON at ``path``, with the benchmark's name, its command line, the commit
    measured and the date."""
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True).stdout.strip()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    command = " ".join(["benchmarks/bench_%s.py" % benchmark] + list(argv or sys.argv[1:]))
    with open(path, "w") as f:
        json.dump({"benchmark": benchmark, "command": command, **fields, "commit": commit,
                   "date": datetime.datetime.now().isoformat(timespec="minutes")}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
