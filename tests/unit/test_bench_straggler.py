"""The straggler benchmark's summary of a job (benchmarks/bench_straggler.py)."""
import sys

import pytest

from tests.support.benchmarks import load_benchmark
from tests.support.paths import REPO


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, REPO + "/benchmarks")     # its sibling modules
    try:
        yield load_benchmark("bench_straggler")
    finally:
        sys.path.remove(REPO + "/benchmarks")


def result(rank, samples, window, accuracy=()):
    return {"rank": rank, "samples": samples, "epochs": 2, "window": list(window),
            "accuracy": [list(a) for a in accuracy]}


def test_samples_per_second_span_every_worker_and_time_to_target_is_rank_0s(bench):
    summary = bench.summarise([result(1, 300, (10.0, 30.0)),
                               result(0, 500, (12.0, 25.0), [(5.0, 0.90), (9.0, 0.96),
                                                             (13.0, 0.97)])], target=0.95)
    assert summary["samples_per_s"] == 800 / 20.0      # first start to last end
    assert summary["time_to_target_s"] == 9.0
    assert summary["final_accuracy"] == 0.97
    assert summary["epochs"] == {"0": 2, "1": 2}


def test_a_target_never_reached_is_said_so(bench):
    summary = bench.summarise([result(0, 100, (0.0, 10.0), [(5.0, 0.5)])], target=0.95)
    assert summary["time_to_target_s"] is None
    args = bench.parse_args(["--workers", "1"])
    rows = bench.table(args, {"sync": {"none": dict(summary, samples_per_s=20.0),
                                       "straggler": dict(summary, samples_per_s=10.0)}})
    assert rows[-1] == "| sync | 20 | 10 | 50% | - | 0.500 | not reached |"


def test_asynchronous_systems_are_compared_with_their_synchronous_counterpart(bench):
    run = {"samples_per_s": 10.0, "final_accuracy": 0.96, "time_to_target_s": 3.0}
    args = bench.parse_args([])
    rows = bench.table(args, {"sync": {"none": run, "straggler": run},
                              "async": {"none": dict(run, samples_per_s=20.0),
                                        "straggler": dict(run, samples_per_s=16.5)}})
    assert rows[-1] == "| async | 20 | 16 | 82% | 1.65x | 0.960 | 3.0 s |"
