#!/usr/bin/env python3
"""A sparse embedding step of MXNet's own ``dist_sync`` workers: our servers against MXNet's.

    python benchmarks/bench_sparse.py                      # 2 workers x 2 servers, 3 repeats
    python benchmarks/bench_sparse.py --repeats 5 --out /tmp/sparse.json
    python benchmarks/bench_sparse.py --rows 3000 --touched 400 --steps 5 --repeats 1  # a look
    python benchmarks/bench_sparse.py --sides mxnet,byteps,byteps-dense \
        --out benchmarks/results/sparse/dist_byteps_loopback_2x2.json       # dist_byteps
    python benchmarks/bench_sparse.py --network netns --workers 4 --servers 4 \
        --sides mxnet,byteps --out /tmp/sparse_netns.json     # emulated 500 Mbit/s links (root)

(Options this script does not know go to every worker: ``--rows``, ``--dim``, ``--touched``,
``--warmup``, ``--steps``; see benchmarks/_sparse_worker.py.)

Runs ``benchmarks/_sparse_worker.py`` (unmodified MXNet 1.9.1 ``dist_sync`` workers: a
``row_sparse`` 30,522 x 768 float32 embedding, SGD with momentum and lazy updates on the
servers, each step a ``row_sparse`` push of 4,096 random rows and a ``row_sparse_pull`` of
them) through ``launch.py`` on 127.0.0.1, MXNet's scheduler in both, alternately with MXNet's
C++ servers (``--server mxnet``) and ours (``--server byteps``), ``--repeats`` times each, so
both see the same background load. A job's step is the median over its timed steps of the
slowest worker's step; a side's step is the median of its jobs'. The ratio is ours / MXNet's
(> 1: ours are slower). CPU seconds per step and node of every role (servers, workers,
scheduler; the launcher's guards included) are sampled from ``/proc`` over the timed steps, as
bench_cost does. The workers' checksums of the rows they pulled last should agree between the
sides to float rounding. Prints the table and writes JSON (every job, the summary, date,
commit, load) to ``--out``.

``--sides`` picks the sides (default ``mxnet,ours``): ``mxnet`` (``dist_sync`` workers,
MXNet's servers), ``ours`` (``dist_sync`` workers, our servers), ``byteps`` (``dist_byteps``
workers, our scheduler and servers), ``byteps-dense`` (the same model sent dense through
``dist_byteps``: every row pushed and pulled; give it fewer ``--steps``, its steps are long).
Each side's ratio is its step over the first side's.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import uuid
from typing import List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from _role_usage import JOB_MARK, RoleUsage  # noqa: E402
from bench_cost import LAUNCH, child_env, write_results  # noqa: E402

WORKER = os.path.join(HERE, "_sparse_worker.py")
RESULT_TAG = "SPARSE_RESULT "
#: side -> (launch.py's scheduler and server, the workers' extra arguments)
SIDES = {"mxnet": (["--scheduler", "mxnet", "--server", "mxnet"], []),
         "ours": (["--scheduler", "mxnet", "--server", "byteps"], []),
         "byteps": (["--scheduler", "byteps", "--server", "byteps"], ["--kvstore", "dist_byteps"]),
         "byteps-dense": (["--scheduler", "byteps", "--server", "byteps"],
                          ["--kvstore", "dist_byteps", "--dense"])}
ROLES = ("server", "worker", "scheduler")
_NAMES = {"mxnet": "dist_sync, MXNet's C++ servers", "ours": "dist_sync, our servers",
          "byteps": "dist_byteps, our servers", "byteps-dense": "dist_byteps, sent dense"}


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3, help="jobs per side, alternating")
    p.add_argument("--sides", default="mxnet,ours", type=lambda text: text.split(","),
                   help="comma-separated, of %s" % ", ".join(SIDES))
    p.add_argument("--timeout", type=float, default=300, help="launch.py --timeout of a job")
    p.add_argument("--network", choices=["loopback", "netns"], default="loopback",
                   help="loopback: 127.0.0.1 (default); netns: the launcher's emulated network, "
                        "a host per node (root)")
    p.add_argument("--link-rate", default="500mbit",
                   help="netns: every host's link rate in each direction (default 500mbit)")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "sparse",
                                                 "loopback_2x2.json"))
    args, args.worker_args = p.parse_known_args(argv)
    return args


def job_argv(side: str, args) -> List[str]:
    launch, worker = SIDES[side]
    network = (["--launcher", "netns", "--link-rate", args.link_rate]
               if args.network == "netns" else [])
    return [sys.executable, LAUNCH, "-n", str(args.workers), "-s", str(args.servers), *launch,
            *network, "--timeout", str(args.timeout), "--grace", "20", sys.executable, WORKER,
            *worker, *args.worker_args]


def results_of(output: str) -> List[dict]:
    """The workers' ``SPARSE_RESULT`` lines (launch.py prefixes each line with its node)."""
    return [json.loads(line[line.index(RESULT_TAG) + len(RESULT_TAG):])
            for line in output.splitlines() if RESULT_TAG in line]


def step_of(results: List[dict]) -> float:
    """A job's step: the median over steps of the slowest worker's time."""
    return statistics.median(max(times) for times in zip(*(r["times_s"] for r in results)))


def run_job(side: str, args) -> dict:
    """One job through launch.py: its step, checksums and CPU per role, node and step."""
    mark = uuid.uuid4().hex
    with RoleUsage(mark, period=0.1) as usage:
        done = subprocess.run(job_argv(side, args), env={**child_env(), JOB_MARK: mark},
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=args.timeout + 60)
    output = done.stdout.decode(errors="replace")
    results = results_of(output)
    if done.returncode != 0 or len(results) != args.workers:
        raise SystemExit("%s job failed (exit %d):\n%s" % (side, done.returncode,
                                                           output[-3000:]))
    start, end = max(r["start"] for r in results), min(r["end"] for r in results)
    roles = usage.per_step(start, end, len(results[0]["times_s"]), {"server": args.servers,
                                                    "worker": args.workers, "scheduler": 1})
    return {"side": side, "step_s": step_of(results),
            "checksums": [r["checksum"] for r in sorted(results, key=lambda r: r["rank"])],
            "worker_cpu_s": statistics.mean(r["cpu_s"] for r in results),
            "cpu_s": {role: roles[role]["cpu_s"] for role in ROLES if role in roles}}


def summarise(jobs: List[dict], order: Sequence[str] = ("mxnet", "ours")) -> dict:
    """Per side: the median of its jobs' steps, each job's step, the mean CPU per role; each
    side's step over the first side's (``ratios``; ``ratio``: ours / MXNet's)."""
    sides = {}
    for side in order:
        mine = [j for j in jobs if j["side"] == side]
        if not mine:
            continue
        cpu = {role: statistics.mean(j["cpu_s"][role] for j in mine)
               for role in ROLES if all(role in j["cpu_s"] for j in mine)}
        sides[side] = {"step_s": statistics.median(j["step_s"] for j in mine),
                       "steps_s": [j["step_s"] for j in mine], "cpu_s": cpu}
    out = {"sides": sides}
    if "ours" in sides and "mxnet" in sides:
        out["ratio"] = sides["ours"]["step_s"] / sides["mxnet"]["step_s"]
    if sides:
        first = next(iter(sides.values()))["step_s"]
        out["ratios"] = {side: found["step_s"] / first for side, found in sides.items()}
    return out


def table(summary: dict) -> List[str]:
    rows = ["| side | step (median) | jobs' steps | CPU a step: server | worker | scheduler |",
            "|---|---|---|---|---|---|"]
    for side, found in summary["sides"].items():
        cpu = ["%.3f s" % found["cpu_s"][role] if role in found["cpu_s"] else "-"
               for role in ROLES]
        rows.append("| %s | %.3f s | %s | %s |" % (
            _NAMES[side], found["step_s"],
            ", ".join("%.3f" % s for s in found["steps_s"]), " | ".join(cpu)))
    if "ratio" in summary:
        rows.append("")
        rows.append("ours / MXNet's step: %.2fx" % summary["ratio"])
    first = next(iter(summary["sides"]), None)
    for side, ratio in summary.get("ratios", {}).items():
        if side != first and side != "ours":
            rows.append("%s / %s step: %.2fx" % (_NAMES[side], _NAMES[first], ratio))
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    load = [os.getloadavg()[0]]
    jobs: List[dict] = []
    for repeat in range(args.repeats):
        for side in args.sides:   # alternating, so every side sees the same background load
            print("%s, job %d of %d ..." % (side, repeat + 1, args.repeats), flush=True)
            jobs.append(run_job(side, args))
            print("  step %.3f s, checksums %s" % (jobs[-1]["step_s"], jobs[-1]["checksums"]),
                  flush=True)
    load.append(os.getloadavg()[0])
    summary = summarise(jobs, args.sides)
    lines = table(summary)
    print("\n".join(lines))
    write_results(args.out, "sparse", argv, settings=vars(args), jobs=jobs, summary=summary,
                  table=lines, load=load, cpus=os.cpu_count())
    return 0


if __name__ == "__main__":
    sys.exit(main())
