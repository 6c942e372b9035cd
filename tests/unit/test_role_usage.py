"""The replay benchmark's per-role accounting (benchmarks/_role_usage.py): sums per role over
its processes (a node may be a guard and its program), per node and step; bytes per namespace."""
import os

import pytest
from tests.support.benchmarks import load_benchmark

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def usage_module():
    return load_benchmark("_role_usage")


def test_cpu_is_summed_per_role_and_divided_by_nodes_and_steps(usage_module):
    usage = usage_module.RoleUsage("job")
    sample = usage_module.ProcessSample
    usage.samples = [
        (10.0, {"1": sample("worker", 5.0, ("net:[1]", 100, 1000), 0.5, 1.0),   # worker 0's guard
                "2": sample("worker", 7.0, ("net:[1]", 100, 1000), 1.0, 2.0),   # its program
                "3": sample("worker", 1.0, ("net:[2]", 0, 0), 2.0, 0.5),
                "4": sample("server", 2.0, None, None, 1.0)}),      # no scheduler statistics
        (20.0, {"1": sample("worker", 5.5, ("net:[1]", 4100, 9000), 0.5, 1.0),
                "2": sample("worker", 13.0, ("net:[1]", 4100, 9000), 1.6, 4.0),
                "3": sample("worker", 5.5, ("net:[2]", 2000, 3000), 3.0, 1.5),
                "4": sample("server", 4.0, None, None, 1.5),
                "5": sample("server", 9.0, None, 1.0, 3.0)}),   # started later: left out
    ]
    got = usage.per_step(10.1, 19.9, steps=4, nodes={"worker": 2, "server": 1})
    assert got["worker"]["cpu_s"] == pytest.approx((0.5 + 6.0 + 4.5) / 2 / 4)
    assert got["worker"]["kernel_s"] == pytest.approx((0.0 + 2.0 + 1.0) / 2 / 4)
    # the main threads' waits for a core, summed per role as the CPU is
    assert got["worker"]["main_wait_s"] == pytest.approx((0.0 + 0.6 + 1.0) / 2 / 4)
    # one namespace counted once however many of the node's processes live in it
    assert got["worker"]["rx_mb"] == pytest.approx((4000 + 2000) / 2 / 4 / 1e6)
    assert got["worker"]["tx_mb"] == pytest.approx((8000 + 3000) / 2 / 4 / 1e6)
    assert got["server"] == {"cpu_s": pytest.approx(2.0 / 4), "kernel_s": pytest.approx(0.5 / 4)}


def test_a_main_thread_wait_is_read_from_schedstat_and_none_without_it(usage_module):
    if not os.path.exists("/proc/self/schedstat"):
        pytest.skip("this kernel keeps no scheduler statistics")
    wait = usage_module._main_thread_wait(str(os.getpid()))
    assert isinstance(wait, float) and wait >= 0.0
    assert usage_module._main_thread_wait("999999999") is None     # no such process


def test_machine_busy_is_the_busy_share_of_all_ticks_in_the_window(usage_module):
    usage = usage_module.RoleUsage("job")
    usage.machine = [(10.0, (100, 400)), (15.0, (250, 600)), (20.0, (650, 1000))]
    assert usage.machine_busy(10.1, 19.9) == pytest.approx(550 / 600)
    assert usage.machine_busy(14.9, 20.0) == pytest.approx(400 / 400)
    assert usage_module.RoleUsage("job").machine_busy(0.0, 1.0) is None
