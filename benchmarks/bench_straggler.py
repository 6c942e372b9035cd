#!/usr/bin/env python3
"""Training with a straggler: synchronous, with a backup worker, asynchronous; ours and MXNet's.

    python benchmarks/bench_straggler.py --workers 4 --servers 2 --epochs 8 --step-time 0.05
    python benchmarks/bench_straggler.py --out benchmarks/results/straggler/digits_4x2.json
    python benchmarks/bench_straggler.py --network netns --link-rate 500mbit     # (root)

Every job trains the demo's MLP on scikit-learn's digits (``benchmarks/_straggler_worker.py``:
the demo's model, data, shards and learning rate) with each step stretched to ``--step-time``
seconds, the host free meanwhile as while an accelerator computes; with ``--slow-factor`` F,
the last worker's steps take F times as long (a straggler). Systems:

* ``sync``: dist_byteps, synchronous (every round waits for every worker);
* ``backup``: dist_byteps with ``BYTEPS_BACKUP_WORKERS=1`` (each round completes with the first
  W - 1 workers' gradients; the straggler's late ones are dropped; once the W - 1 others
  finished, the job's training is over and the straggler stops at its next step);
* ``async``: dist_byteps with ``BYTEPS_ENABLE_ASYNC=1`` (each worker's change is added as it
  comes);
* ``mxnet_sync``, ``mxnet_async``: MXNet's own ``dist_sync`` / ``dist_async`` (its C++
  scheduler and servers; the optimizer runs on the servers in async mode).

Every worker runs the same ``--epochs`` (the natural script: data sharded by rank, the
straggler too), then ``kvstore_byteps.finish_training`` (``--ending barrier``: a barrier and a
pull of the weights instead). Each system runs without and with the straggler. The table: the job's wall time (from the first worker's start to the last one's
end), with the straggler against its synchronous counterpart's, rank 0's test accuracy of the
final weights (without and with the straggler), the seconds until rank 0 first measured
``--target`` test accuracy (after an epoch), and the share of the samples the workers trained.
A benchmark, never a test: it reports what it measured with the date, the commit and the load.
"""
import argparse
import json
import os
import subprocess
import sys
from typing import Dict, List, Optional

from bench_pushpull import child_env
from bench_replay import write_results
from kvstore_byteps.words import count

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "_straggler_worker.py")
LAUNCH = os.path.join(ROOT, "launch.py")
RESULT_TAG = "STRAGGLER_RESULT "
SYSTEMS = {
    # label: (kvstore, environment, launch.py options)
    "sync": ("dist_byteps", {}, ["--scheduler", "byteps", "--server", "byteps"]),
    "backup": ("dist_byteps", {"BYTEPS_BACKUP_WORKERS": "1"},
               ["--scheduler", "byteps", "--server", "byteps"]),
    "async": ("dist_byteps", {"BYTEPS_ENABLE_ASYNC": "1"},
              ["--scheduler", "byteps", "--server", "byteps"]),
    "mxnet_sync": ("dist_sync", {}, ["--scheduler", "mxnet", "--server", "mxnet"]),
    "mxnet_async": ("dist_async", {}, ["--scheduler", "mxnet", "--server", "mxnet"]),
}
#: the plain synchronous system each other one is compared with
SYNC_OF = {"backup": "sync", "async": "sync", "mxnet_async": "mxnet_sync"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--step-time", type=float, default=0.05, help="seconds per step")
    p.add_argument("--slow-factor", type=float, default=2.0, help="the straggler's slowdown")
    p.add_argument("--slow-rank", type=int, default=-1,
                   help="the straggler's rank (default: the last; 0: the rank that evaluates)")
    p.add_argument("--target", type=float, default=0.95, help="test accuracy to reach")
    p.add_argument("--systems", default="sync,backup,async,mxnet_sync,mxnet_async")
    p.add_argument("--network", choices=["loopback", "netns"], default="loopback",
                   help="loopback: 127.0.0.1 (default); netns: every node on an emulated host "
                        "of its own (launch.py --launcher netns; root)")
    p.add_argument("--link-rate", default="500mbit",
                   help="netns: each host's link rate in each direction (default 500mbit)")
    p.add_argument("--ending", choices=["finish", "barrier"], default="finish",
                   help="what every worker does after its loop: kvstore_byteps.finish_training,"
                   " or a barrier and a pull of the weights (_straggler_worker.py)")
    p.add_argument("--seeds", default="0",
                   help="comma-separated seeds (the initial weights' and the shards' order): each "
                   "system runs once per seed, in turn; the table gives means, and with several "
                   "seeds each accuracy's range (sync's varies with the seed too)")
    p.add_argument("--job-timeout", type=int, default=600)
    p.add_argument("--out", help="results JSON (e.g. benchmarks/results/straggler/....json)")
    return p.parse_args(argv)


def run_job(args, system: str, slow: bool, seed: int = 0) -> Optional[Dict]:
    """The summary of one job, or None (the output's tail is printed)."""
    kvstore, env, options = SYSTEMS[system]
    network = (["--launcher", "netns", "--link-rate", args.link_rate]
               if args.network == "netns" else [])
    argv = [sys.executable, LAUNCH, "-n", str(args.workers), "-s", str(args.servers), *options,
            *network,
            "--timeout", str(args.job_timeout), "--grace", "20",
            sys.executable, WORKER, "--kvstore", kvstore, "--epochs", str(args.epochs),
            "--step-time", str(args.step_time), "--ending", args.ending, "--seed", str(seed)]
    if slow:
        argv += ["--slow-rank", str(_slow_rank(args)), "--slow-factor", str(args.slow_factor)]
    done = subprocess.run(argv, env={**child_env(), **env}, cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=args.job_timeout + 60)
    out = done.stdout.decode(errors="replace")
    results = [json.loads(line[line.find(RESULT_TAG) + len(RESULT_TAG):])
               for line in out.splitlines() if RESULT_TAG in line]
    if done.returncode != 0 or len(results) != args.workers:
        print("%s failed (exit %d):\n%s" % (system, done.returncode,
                                           "\n".join(out.splitlines()[-12:])), flush=True)
        return None
    return summarise(results, args.target)


def _slow_rank(args) -> int:
    return args.workers - 1 if args.slow_rank < 0 else args.slow_rank


def summarise(results: List[Dict], target: float) -> Dict:
    """Samples per second over the job, rank 0's final accuracy and time to ``target``."""
    start = min(r["window"][0] for r in results)
    end = max(r["window"][1] for r in results)
    samples = sum(r["samples"] for r in results)
    rank0 = next(r for r in results if r["rank"] == 0)
    reached = [seconds for seconds, acc in rank0["accuracy"] if acc >= target]
    return {"samples_per_s": samples / (end - start), "seconds": end - start,
            "samples": samples, "final_accuracy": rank0["final_accuracy"],
            "time_to_target_s": reached[0] if reached else None,
            "samples_by_rank": {str(r["rank"]): r["samples"] for r in results},
            "ended_early": sorted(r["rank"] for r in results if r["ended"])}


def combine(runs: List[Dict]) -> Dict:
    """One system's runs over the seeds: their means, and every run (``runs``)."""
    def mean(field):
        values = [run[field] for run in runs]
        return None if None in values else sum(values) / len(values)
    return {"samples_per_s": mean("samples_per_s"), "seconds": mean("seconds"),
            "samples": mean("samples"), "final_accuracy": mean("final_accuracy"),
            "time_to_target_s": mean("time_to_target_s"),
            "samples_by_rank": runs[0]["samples_by_rank"],
            "ended_early": sorted({rank for run in runs for rank in run["ended_early"]}),
            "runs": runs}


def table(args, found: Dict[str, Dict[str, Dict]]) -> List[str]:
    where = ("emulated network, %s links" % args.link_rate if args.network == "netns"
             else "loopback")
    rows = ["digits MLP, %s x %s, %s; %.0f ms per step, straggler: rank %d "
            "%.1fx slower; time to %.0f%% test accuracy (rank 0)"
            % (count(args.workers, "worker"), count(args.servers, "server"), where,
               1000 * args.step_time, _slow_rank(args),
               args.slow_factor, 100 * args.target),
            "| system | wall time, no straggler | wall time, straggler | vs its sync "
            "(straggler) | final accuracy, no straggler | final accuracy, straggler | time to "
            "target (straggler) | samples trained (straggler) |",
            "|---|---|---|---|---|---|---|---|"]
    for system, runs in found.items():
        base, slow = runs.get("none"), runs.get("straggler")
        sync = found.get(SYNC_OF.get(system, ""), {}).get("straggler")
        ratio = "%.2fx" % (slow["seconds"] / sync["seconds"]) if slow and sync else "-"
        rows.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
            system, _seconds(base), _seconds(slow), ratio, _accuracy(base), _accuracy(slow),
            "%.1f s" % slow["time_to_target_s"] if slow and slow["time_to_target_s"]
            else "not reached" if slow else "-",
            "%.0f%%" % (100 * slow["samples"] / base["samples"]) if slow and base else "-"))
    return rows


def _seconds(run: Optional[Dict]) -> str:
    return "%.1f s" % run["seconds"] if run else "failed"


def _accuracy(run: Optional[Dict]) -> str:
    if not run or not run["final_accuracy"]:
        return "-"
    each = [one["final_accuracy"] for one in run.get("runs", [])]
    spread = " (%.3f-%.3f)" % (min(each), max(each)) if len(each) > 1 else ""
    return "%.3f%s" % (run["final_accuracy"], spread)


def main(argv=None) -> int:
    args = parse_args(argv)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        raise SystemExit("unknown systems %s (known: %s)" % (sorted(unknown), sorted(SYSTEMS)))
    load_before = os.getloadavg()[0]
    seeds = [int(seed) for seed in args.seeds.split(",") if seed.strip()]
    runs: Dict[str, Dict[str, List[Dict]]] = {}
    from tqdm import tqdm
    jobs = [(seed, system, slow) for seed in seeds for system in systems
            for slow in (False, True)]
    with tqdm(total=len(jobs), unit="job", dynamic_ncols=True) as bar:
        for seed, system, slow in jobs:
            bar.set_description("seed %d: %s, %s" % (seed, system,
                                                     "straggler" if slow else "no straggler"))
            result = run_job(args, system, slow, seed)
            if result is not None:
                runs.setdefault(system, {}).setdefault(
                    "straggler" if slow else "none", []).append(dict(result, seed=seed))
            bar.update(1)
    found = {system: {case: combine(done) for case, done in cases.items()
                      if len(done) == len(seeds)}
             for system, cases in runs.items()}
    rows = table(args, found)
    print("\n".join(rows))
    if args.out:
        write_results(args.out, {
            "benchmark": "straggler",
            "command": " ".join(["benchmarks/bench_straggler.py"] + sys.argv[1:]),
            "settings": {k: v for k, v in vars(args).items() if k != "out"},
            "systems": found, "table": rows}, load_before)
    return 0 if all(len(runs) == 2 for runs in found.values()) and len(found) == len(systems) \
        else 1


if __name__ == "__main__":
    sys.exit(main())
