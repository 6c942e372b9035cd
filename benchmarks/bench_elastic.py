#!/usr/bin/env python3
"""Elastic workers: what losing a worker costs a job, and what elastic costs when nobody leaves.

    python benchmarks/bench_elastic.py --runs 5 --out benchmarks/results/elastic/digits_4x2.json

Each job is the digits demo (examples/train_digits.py, its model, data, shards and learning
rate; ``benchmarks/_elastic_worker.py`` times its steps) on 4 workers x 2 servers under
``launch.py --min-workers 3``, loopback. Three kinds of job, interleaved, ``--runs`` each:

* ``killed``: worker ``--kill-rank`` is killed with SIGKILL as it enters step ``--kill-step``
  (mid-epoch; run i at step ``--kill-step + 13 i``, a point of another epoch); the others
  train on and finish;
* ``restarted``: the same kill under ``--max-restarts 1``: the worker starts again and takes
  its place back at the others' next commit (the demo commits at every epoch's end);
* ``whole``: the same job, nobody killed;
* ``grown``: nobody killed, the job grows: ``--max-workers 5``, and after rank 0's first epoch
  a fifth worker starts by the command the launcher prints, joins at the others' next commit
  and trains with them (its own shard of a fifth of the data);
* ``every-step``: nobody killed, the demo committing after every step (``--commit-every 1``);
* ``off``: nobody killed, without ``--min-workers`` (elastic off).

Run i initialises the parameters with the demo's ``--seed 42 + i`` (the demo is otherwise
deterministic: a killed run and its whole run differ only by the kill).

Reported: rank 0's final test accuracy (mean and range), the job's training time, and for the
killed jobs the time from the death to the next completed round, seen by rank 0 as its
longest step (its step that needed the lost worker's push: from the death, at the start of
that step, until the scheduler declared it lost and the round closed without it), against
the median step; for the restarted jobs, when the restarted worker joined (seconds after it
asked, after its process started). With ``--van auto`` (the default) the scheduler learns of
the death when the worker's connection to it closes; with ``--van zmq``,
``PS_HEARTBEAT_TIMEOUT`` after the worker's last heartbeat. ``whole`` against ``off`` is the
cost of elastic when nobody leaves; ``every-step`` against ``whole``, of a commit a step. A benchmark, never a test: it reports what
it measured with the date, the commit and the load.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from typing import Dict, List, Optional

from bench_pushpull import child_env
from bench_replay import write_results

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "_elastic_worker.py")
LAUNCH = os.path.join(ROOT, "launch.py")
TAG = "ELASTIC_STEPS "
KINDS = ("killed", "restarted", "whole", "grown", "every-step", "off")
JOINED = re.compile(r"joined the job at the other workers' commit \d+ .*?, (\S+) s after "
                    r"asking, (\S+) s after this process started")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--epochs", type=int, default=80,
                   help="the demo's epochs (80: about 11 s; a restarted worker starts in 4-5)")
    p.add_argument("--kill-rank", type=int, default=2)
    p.add_argument("--kill-step", type=int, default=25,
                   help="11 steps an epoch with 4 workers: 25 is in the 3rd epoch")
    p.add_argument("--heartbeat-interval", type=float, default=1.0)
    p.add_argument("--heartbeat-timeout", type=float, default=5.0)
    p.add_argument("--van", default="auto", help="DMLC_PS_VAN_TYPE: auto (the default: "
                   "byteps_tcp between our nodes, a closed connection tells the scheduler at "
                   "once) or zmq (ZeroMQ does not: the heartbeat timeout)")
    p.add_argument("--job-timeout", type=float, default=300.0)
    p.add_argument("--kinds", default=",".join(KINDS),
                   help="the kinds of job to run, comma-separated (default: all)")
    p.add_argument("--out", help="write the results as JSON here")
    return p.parse_args(argv)


def run_job(args, kind: str, run: int) -> Optional[Dict]:
    """One job's accuracy, training time and rank 0's step ends, or None (tail printed)."""
    elastic = [] if kind == "off" else ["--min-workers", "3"]
    if kind == "restarted":
        elastic += ["--max-restarts", "1"]
    if kind == "grown":
        elastic += ["--max-workers", "5"]
    kill = kind in ("killed", "restarted")
    argv = [sys.executable, LAUNCH, "-n", "4", "-s", "2", *elastic,
            "--env", "PS_HEARTBEAT_INTERVAL=%g" % args.heartbeat_interval,
            "--env", "PS_HEARTBEAT_TIMEOUT=%g" % args.heartbeat_timeout,
            "--env", "DMLC_PS_VAN_TYPE=%s" % args.van,
            "--timeout", str(args.job_timeout), sys.executable, WORKER,
            str(args.kill_rank if kill else -1), str(args.kill_step + 13 * run), "--epochs",
            str(args.epochs), "--seed", str(42 + run)]
    if kind == "every-step":
        argv += ["--commit-every", "1"]
    returncode, out = (grow(argv, args.job_timeout) if kind == "grown" else
                       _ran(subprocess.run(argv, env=child_env(), cwd=ROOT,
                                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                           timeout=args.job_timeout + 60)))
    final = re.search(r"final test accuracy (\S+) after \d+ epochs in (\S+) s", out)
    steps = [json.loads(line[line.find(TAG) + len(TAG):]) for line in out.splitlines()
             if TAG in line]
    if returncode != 0 or final is None or len(steps) != 1:
        print("%s failed (exit %d):\n%s" % (kind, returncode,
                                           "\n".join(out.splitlines()[-12:])), flush=True)
        return None
    gaps = [b - a for a, b in zip(steps[0], steps[0][1:])]
    found = {"accuracy": float(final.group(1)), "seconds": float(final.group(2)),
             "longest_step": max(gaps), "median_step": statistics.median(gaps),
             "identical": "parameters identical on all %d workers"
                          % (5 if kind == "grown" else 3 if kind == "killed" else 4) in out}
    joined = JOINED.search(out)
    if kind in ("restarted", "grown"):
        if joined is None:
            print("restarted: the worker did not join\n%s" % "\n".join(out.splitlines()[-12:]))
            return None
        found.update(joined_after_asking=float(joined.group(1)),
                     joined_after_start=float(joined.group(2)))
    return found


def _ran(done) -> tuple:
    return done.returncode, done.stdout.decode(errors="replace")


def grow(argv: List[str], timeout: float) -> tuple:
    """Run the job of ``argv`` (``--max-workers 5``); after rank 0's first epoch, start a fifth
    worker by the command the launcher printed. Returns (the job's status, both outputs)."""
    job = subprocess.Popen(argv, env=child_env(), cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    lines, command, fifth = [], None, None
    try:
        for line in job.stdout:
            lines.append(line)
            if "start one more" in line:
                command = line.split("with: ", 1)[1].strip()
            if command and fifth is None and "] [digits] epoch 1/" in line:
                fifth = subprocess.Popen(["bash", "-c", command], env=child_env(), cwd=ROOT,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         text=True)
        job.wait(timeout=timeout)
        extra = fifth.communicate(timeout=60)[0] if fifth is not None else "no fifth worker\n"
        status = job.returncode or (fifth.returncode if fifth is not None else 1)
        return status, "".join(lines) + extra
    finally:
        for proc in (job, fifth):
            if proc is not None and proc.poll() is None:
                proc.kill()


def summarise(runs: List[Dict]) -> Dict:
    accuracy = [r["accuracy"] for r in runs]
    joined = {key + "_max": max(r[key] for r in runs) for key in
              ("joined_after_asking", "joined_after_start") if key in runs[0]}
    return {"runs": len(runs), "accuracy_mean": statistics.mean(accuracy), **joined,
            "identical": all(r["identical"] for r in runs),
            "accuracy_min": min(accuracy), "accuracy_max": max(accuracy),
            "seconds_mean": statistics.mean(r["seconds"] for r in runs),
            "longest_step_mean": statistics.mean(r["longest_step"] for r in runs),
            "median_step_mean": statistics.mean(r["median_step"] for r in runs)}


def main(argv=None) -> int:
    args = parse_args(argv)
    load_before = os.getloadavg()[0]
    kinds = [kind for kind in args.kinds.split(",") if kind]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise SystemExit("unknown --kinds %s (choose from %s)" % (unknown, ", ".join(KINDS)))
    found: Dict[str, List[Dict]] = {kind: [] for kind in kinds}
    for run in range(args.runs):
        for kind in kinds:
            result = run_job(args, kind, run)
            if result is not None:
                found[kind].append(result)
                print("run %d %s: %s" % (run + 1, kind, result), flush=True)
    summary = {kind: summarise(runs) for kind, runs in found.items() if runs}
    for kind, row in summary.items():
        print("%-10s accuracy %.4f (%.4f-%.4f), training %.2f s, longest step %.2f s, median "
              "step %.4f s, %d runs%s" % (kind, row["accuracy_mean"], row["accuracy_min"],
                                          row["accuracy_max"], row["seconds_mean"],
                                          row["longest_step_mean"], row["median_step_mean"],
                                          row["runs"], "; joined within %.1f s of asking, "
                                          "%.1f s of its start" % (row["joined_after_asking_max"],
                                                                   row["joined_after_start_max"])
                                          if "joined_after_start_max" in row else ""))
    if args.out:
        write_results(args.out, {
            "benchmark": "elastic",
            "command": " ".join(["benchmarks/bench_elastic.py"] + sys.argv[1:]),
            "settings": {k: v for k, v in vars(args).items() if k != "out"},
            "runs": found, "summary": summary}, load_before)
    return 0 if all(len(found[kind]) == args.runs for kind in kinds) else 1


if __name__ == "__main__":
    sys.exit(main())
