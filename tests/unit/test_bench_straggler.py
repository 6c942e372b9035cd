"""The straggler benchmark's summary of a job (benchmarks/bench_straggler.py)."""
import pytest

from tests.support.benchmarks import benchmark_with_siblings


@pytest.fixture(scope="module")
def bench():
    with benchmark_with_siblings("bench_straggler") as module:
        yield module


def result(rank, samples, window, accuracy=(), final=None, ended=False):
    return {"rank": rank, "samples": samples, "ended": ended, "window": list(window),
            "accuracy": [list(a) for a in accuracy], "final_accuracy": final}


def test_the_wall_time_spans_every_worker_and_the_accuracies_are_rank_0s(bench):
    summary = bench.summarise([result(1, 300, (10.0, 30.0), ended=True),
                               result(0, 500, (12.0, 25.0), [(5.0, 0.90), (9.0, 0.96),
                                                             (13.0, 0.97)], final=0.98)],
                              target=0.95)
    assert summary["seconds"] == 20.0                   # first start to last end
    assert summary["samples_per_s"] == 800 / 20.0
    assert summary["time_to_target_s"] == 9.0
    assert summary["final_accuracy"] == 0.98            # of the final weights
    assert summary["samples_by_rank"] == {"0": 500, "1": 300}
    assert summary["ended_early"] == [1]


def test_a_target_never_reached_is_said_so(bench):
    summary = bench.summarise([result(0, 100, (0.0, 10.0), [(5.0, 0.5)], final=0.5)],
                              target=0.95)
    assert summary["time_to_target_s"] is None
    args = bench.parse_args(["--workers", "1"])
    rows = bench.table(args, {"sync": {"none": dict(summary, seconds=5.0),
                                       "straggler": summary}})
    assert rows[-1] == "| sync | 5.0 s | 10.0 s | - | 0.500 | 0.500 | not reached | 100% |"


def test_other_systems_are_compared_with_their_synchronous_counterpart(bench):
    run = {"seconds": 10.0, "samples": 1000, "final_accuracy": 0.96, "time_to_target_s": 3.0}
    args = bench.parse_args([])
    rows = bench.table(args, {"sync": {"none": dict(run, seconds=5.0), "straggler": run},
                              "backup": {"none": dict(run, seconds=5.0),
                                         "straggler": dict(run, seconds=5.5, samples=760)}})
    assert rows[-1] == "| backup | 5.0 s | 5.5 s | 0.55x | 0.960 | 0.960 | 3.0 s | 76% |"
