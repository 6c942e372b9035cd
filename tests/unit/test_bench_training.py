"""bench_training.py's runs (pure): each store's side once per update placement, the worker told
where the optimizer runs; the default keeps the published runs (updates on the workers)."""
import pytest

from tests.support.benchmarks import benchmark_with_siblings


@pytest.fixture(scope="module")
def bench_training():
    with benchmark_with_siblings("bench_training") as module:
        yield module


def test_each_side_runs_once_per_placement_and_says_where_the_optimizer_runs(bench_training):
    args = bench_training.parse_args(["--network", "loopback", "--updates", "workers,servers",
                                      "--optimizer", "momentum", "--no-priority-run"])
    runs = [(label, kvstore, worker[-4:]) for label, kvstore, _, worker in
            bench_training.sides(args)]
    assert runs == [
        ("dist_byteps, priority on, updates on the workers", "dist_byteps",
         ["--update-on", "workers", "--optimizer", "momentum"]),
        ("dist_sync (MXNet), updates on the workers", "dist_sync",
         ["--update-on", "workers", "--optimizer", "momentum"]),
        ("dist_byteps, priority on, updates on the servers", "dist_byteps",
         ["--update-on", "servers", "--optimizer", "momentum"]),
        ("dist_sync (MXNet), updates on the servers", "dist_sync",
         ["--update-on", "servers", "--optimizer", "momentum"])]


def test_by_default_the_labels_are_the_published_ones(bench_training):
    args = bench_training.parse_args(["--network", "loopback"])
    assert [label for label, *_ in bench_training.sides(args)] == [
        label for label, *_ in bench_training.SIDES]
