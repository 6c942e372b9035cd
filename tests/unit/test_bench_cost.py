"""The cost-model benchmark's grid and fit (benchmarks/bench_cost.py)."""
import pytest

from tests.support.benchmarks import benchmark_with_siblings


@pytest.fixture(scope="module")
def bench():
    with benchmark_with_siblings("bench_cost") as module:
        yield module


def test_the_grid_leaves_out_rounds_over_the_limit(bench):
    cells = bench.grid(80)
    assert [4000, 4096] in cells and [100, 768 << 10] in cells
    assert [4000, 64 << 10] not in cells and [1000, 4 << 20] not in cells
    assert all(keys * size <= 80e6 for keys, size in cells)


def test_the_fit_finds_the_cost_per_key_per_byte_and_per_round(bench):
    a, b, c = 30e-6, 2e-9, 1e-3                 # 30 us a key, 2 ms a MB, 1 ms a round
    cells = [{"keys": k, "bytes": s, "worker_cpu_s": a * k + b * k * s + c}
             for k, s in bench.grid(80)]
    found = bench.fit(cells, "worker_cpu_s")
    assert found["a_s_per_key"] == pytest.approx(a, rel=1e-6)
    assert found["b_s_per_byte"] == pytest.approx(b, rel=1e-6)
    assert found["c_s"] == pytest.approx(c, rel=1e-6)
    assert found["worst_relative_residual"] < 1e-6


def test_the_table_puts_the_systems_side_by_side(bench):
    fit = {"a_s_per_key": 40e-6, "b_s_per_byte": 1e-9, "c_s": 2e-3,
           "worst_relative_residual": 0.1}
    rows = bench.table({s: {"worker_cpu_s": fit, "servers_cpu_s": fit} for s in bench.SYSTEMS})
    assert rows[2] == "| worker, dist_sync | 40.0 | 1.00 | 2.00 | 10% |"
    assert len(rows) == 2 + 4
