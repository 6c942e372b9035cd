"""The sparse embedding benchmark's pure parts (benchmarks/bench_sparse.py)."""
import json

import pytest

from tests.support.benchmarks import benchmark_with_siblings


@pytest.fixture(scope="module")
def bench():
    with benchmark_with_siblings("bench_sparse") as module:
        yield module


def test_results_are_read_from_the_launchers_prefixed_lines(bench):
    line = bench.RESULT_TAG + json.dumps({"rank": 1, "times_s": [0.1]})
    output = "[worker 1] noise\n[worker 1] %s\n[server 0] done\n" % line
    assert bench.results_of(output) == [{"rank": 1, "times_s": [0.1]}]


def test_a_jobs_step_is_the_median_of_the_slowest_workers_steps(bench):
    results = [{"times_s": [0.1, 0.5, 0.2]}, {"times_s": [0.3, 0.1, 0.2]}]
    assert bench.step_of(results) == pytest.approx(0.3)      # median of 0.3, 0.5, 0.2


def test_the_summary_takes_medians_per_side_and_the_ratio_ours_over_mxnets(bench):
    cpu = {"server": 0.2, "worker": 0.1, "scheduler": 0.0}
    jobs = [{"side": side, "step_s": step, "cpu_s": cpu}
            for side, step in (("mxnet", 0.08), ("ours", 0.3), ("mxnet", 0.1), ("ours", 0.2),
                               ("mxnet", 0.09), ("ours", 0.1))]
    summary = bench.summarise(jobs)
    assert summary["sides"]["mxnet"]["step_s"] == pytest.approx(0.09)
    assert summary["sides"]["ours"]["steps_s"] == [0.3, 0.2, 0.1]
    assert summary["ratio"] == pytest.approx(0.2 / 0.09)
    assert summary["sides"]["ours"]["cpu_s"] == pytest.approx(cpu)
    rows = bench.table(summary)
    assert rows[2] == ("| dist_sync, MXNet's C++ servers | 0.090 s | 0.080, 0.100, 0.090 | "
                       "0.200 s | 0.100 s | 0.000 s |")
    assert rows[-1] == "ours / MXNet's step: 2.22x"


def test_one_side_alone_has_no_ratio(bench):
    summary = bench.summarise([{"side": "ours", "step_s": 0.1, "cpu_s": {}}])
    assert "ratio" not in summary and list(summary["sides"]) == ["ours"]
    assert bench.table(summary)[2] == "| dist_sync, our servers | 0.100 s | 0.100 | - | - | - |"


def test_both_sides_run_mxnets_scheduler_and_differ_only_in_the_servers(bench):
    args = bench.parse_args(["--repeats", "1", "--steps", "5"])
    assert args.repeats == 1 and args.worker_args == ["--steps", "5"]
    mxnet, ours = bench.job_argv("mxnet", args), bench.job_argv("ours", args)
    assert [a for a, b in zip(mxnet, ours) if a != b] == ["mxnet"]
    assert mxnet[mxnet.index("--scheduler") + 1] == "mxnet"
    assert ours[ours.index("--server") + 1] == "byteps" and ours[-2:] == ["--steps", "5"]


def test_dist_byteps_sides_run_our_scheduler_and_servers_and_say_their_step_over_the_first(bench):
    args = bench.parse_args(["--sides", "mxnet,byteps,byteps-dense", "--steps", "5"])
    assert args.sides == ["mxnet", "byteps", "byteps-dense"]
    byteps, dense = bench.job_argv("byteps", args), bench.job_argv("byteps-dense", args)
    assert byteps[byteps.index("--scheduler") + 1] == "byteps"
    assert byteps[-4:] == ["--kvstore", "dist_byteps", "--steps", "5"]
    assert dense[-5:] == ["--kvstore", "dist_byteps", "--dense", "--steps", "5"]
    jobs = [{"side": side, "step_s": step, "cpu_s": {}}
            for side, step in (("mxnet", 0.1), ("byteps", 0.05), ("byteps-dense", 0.4))]
    summary = bench.summarise(jobs, args.sides)
    assert summary["ratios"] == pytest.approx({"mxnet": 1.0, "byteps": 0.5, "byteps-dense": 4.0})
    assert bench.table(summary)[-1] == ("dist_byteps, sent dense / dist_sync, MXNet's C++ "
                                        "servers step: 4.00x")
