"""The replay table's row of a results file (benchmarks/results_table.py)."""
import sys

import pytest

from tests.support.benchmarks import load_benchmark
from tests.support.paths import REPO


@pytest.fixture(scope="module")
def tables():
    sys.path.insert(0, REPO + "/benchmarks")
    try:
        yield load_benchmark("results_table")
    finally:
        sys.path.remove(REPO + "/benchmarks")


def system(step, worker_cpu=None, server_cpu=None):
    roles = {} if worker_cpu is None else {"worker": {"cpu_s": worker_cpu},
                                           "server": {"cpu_s": server_cpu}}
    return {"step_s": step, "roles": roles}


def data(**systems):
    return {"model": "resnet50_v1", "dtype": "float32", "compute_s": 1.71,
            "link_bound_s": 1.71, "bound_s": 1.71, "mesh_s": 1.9, "workers": 4,
            "servers": 4, "settings": "dist_byteps zmq", "systems": systems,
            "date": "2026-11-26 12:00", "commit": "abc1234", "load": "1.00 -> 2.00"}


def test_a_row_gives_each_system_its_step_and_ours_against_the_references(tables):
    row = tables.replay_row(data(dist_byteps=system(2.0, 0.6, 0.3),
                                 dist_sync=system(2.8, 0.4, 0.25), gloo=system(3.0),
                                 plain=system(2.2)))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[0] == "ResNet-50 float32, 1.71 s (1 x S / rate)"
    assert cells[1] == "4x4, zmq"
    assert cells[2] == "1.71 s, 1.90 s"
    assert cells[3:7] == ["2.80 s", "3.00 s", "2.20 s", "2.00 s"]
    assert cells[7] == "1.40x, 1.50x"
    assert cells[8] == "86% (95%)"
    assert cells[9] == "0.40 / 0.25 s; 0.60 / 0.30 s"
    assert cells[10] == "2026-11-26 12:00, abc1234, load 1.00 -> 2.00"


def test_a_system_that_did_not_run_is_a_dash(tables):
    cells = [c.strip() for c in tables.replay_row(data(dist_byteps=system(2.0))).split("|")]
    assert cells[4:7] == ["-", "-", "-"]             # dist_sync, gloo, plain
    assert cells[8] == "-, -"


def test_the_partition_size_rank_0_chose_is_read_from_its_start_up_line():
    sys.path.insert(0, REPO + "/benchmarks")
    try:
        replay = load_benchmark("bench_replay")
    finally:
        sys.path.remove(REPO + "/benchmarks")
    line = ("[worker 0] [kvstore_byteps] dist_byteps: 4 workers, 4 BytePS servers; van zmq; "
            "partitions of 768000 bytes (sized for rank 0's link to the servers: 62 MB/s); "
            "credit 6144000 bytes (8 partitions)")
    assert replay.sized_partitions("x\n" + line + "\n") == "768000 bytes for 62 MB/s"
    assert replay.sized_partitions(line.replace(" (sized for rank 0's link to the servers: "
                                                "62 MB/s)", "")) is None


def pushpull_file(upstream_cpu, ours_cpu):
    """A results file as bench_pushpull.py --out writes it, one run of one case."""
    def side(median, cpu):
        return {"median_s": median, "status": "ok",
                **({} if cpu is None else {"worker_cpu_s": cpu})}
    return {"runs": [{"network": "loopback", "van": "auto", "label": "defaults",
                      "date": "2026-11-29 03:55", "commit": "abc1234",
                      "load_before_after": [0.0, 4.4],
                      "runs": [{"case": "small", "workers": 2, "servers": 2,
                                "link_bound_s": None, "upstream": side(0.0868, upstream_cpu),
                                "byteps": side(0.0315, ours_cpu)}]}]}


def test_a_pushpull_row_gives_both_workers_cpu_a_round_where_the_run_measured_it(tables):
    [row] = [tables._line(r) for r in tables._rows_of(pushpull_file(0.056, 0.034))]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "(c) 1000 x 4 KB"
    assert cells[3:6] == ["86.8 ms", "31.5 ms", "2.76x"]
    assert cells[7] == "0.056; 0.034 s"
    [row] = [tables._line(r) for r in tables._rows_of(pushpull_file(0.056, None))]
    assert [c.strip() for c in row.strip("|").split("|")][7] == "-"
