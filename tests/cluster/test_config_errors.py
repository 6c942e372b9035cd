"""Configuration errors end a node with one line and a non-zero exit, no traceback: a worker
whose training mode differs from the servers' (the server probe refuses it), and a worker with a
bad variable. Launched as users launch (launch.py), each worker only creating the store. And
a node of another byteps_tcp version among nodes started one by one (as bpslaunch starts
them) ends every node's start at once, naming it."""
import os
import subprocess
import sys

import pytest
from tests.support.paths import REPO

pytestmark = pytest.mark.timeout(120)

CREATE_STORE = [sys.executable, "-c", "import mxnet as mx; mx.kv.create('dist_byteps')"]


def launch(spawn, *options):
    argv = [sys.executable, os.path.join(REPO, "launch.py"), "-n", "2", "-s", "1",
            "--timeout", "80", "--env", "BYTEPS_START_TIMEOUT=40", *options, *CREATE_STORE]
    proc = spawn(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate(timeout=100)
    return proc.returncode, out


def lines_with(out, text):
    return [line for line in out.splitlines() if text in line]


@pytest.mark.parametrize("variable", ["BYTEPS_ENABLE_ASYNC=1", "BYTEPS_BACKUP_WORKERS=1"])
def test_a_worker_that_trains_otherwise_than_the_servers_says_so_once(spawn, variable):
    code, out = launch(spawn, "--env-worker", variable)
    assert code != 0, out
    assert "Traceback" not in out, out
    said = lines_with(out, "set BYTEPS_ENABLE_ASYNC and BYTEPS_BACKUP_WORKERS alike on every node")
    workers = [line for line in said if "[kvstore_byteps] configuration error: " in line]
    assert sorted(line.split("]")[0] for line in workers) == ["[worker 0", "[worker 1"], out
    assert len(lines_with("\n".join(said), "[server 0]")) == 1, out


def test_a_worker_with_a_bad_variable_says_so_in_one_line(spawn):
    code, out = launch(spawn, "--env-worker", "BYTEPS_LOG_LEVEL=loud")
    assert code != 0, out
    assert "Traceback" not in out, out
    said = lines_with(out, "configuration error: BYTEPS_LOG_LEVEL='loud' is invalid")
    assert 1 <= len(said) <= 2 and all(line.startswith("[worker ") for line in said), out


#: a worker of an older install: its byteps_tcp hello says version 2
OLDER_WORKER = [sys.executable, "-c",
                "import kvstore_byteps.van.tcp.frame as f; f.VERSION = 2; "
                "import mxnet as mx; mx.kv.create('dist_byteps')"]


def test_nodes_started_one_by_one_stop_at_once_when_the_scheduler_cannot_reach_one():
    """As bpslaunch starts a job (every node on its own, no launcher to stop the rest): the
    scheduler cannot talk byteps_tcp to a node of another version, and every node stops
    within seconds naming it, not after BYTEPS_START_TIMEOUT with "the scheduler did not
    answer"."""
    import time
    from tests.support.cluster import SCHEDULER_OURS, SERVER_OURS, Cluster
    with Cluster(num_workers=2, num_servers=1, env={"BYTEPS_START_TIMEOUT": "60"}) as cluster:
        started = time.monotonic()
        cluster.start("scheduler", SCHEDULER_OURS)
        cluster.start("server", SERVER_OURS)
        cluster.start("worker", CREATE_STORE)
        cluster.start("worker", OLDER_WORKER)
        results = cluster.wait_all(timeout=50)
        took = time.monotonic() - started
    assert took < 30, "the nodes took %.0f s to stop" % took
    assert all(code != 0 for code, _ in results.values()), results
    why = "speaks byteps_tcp version 2, this node version 3"
    assert why in results["scheduler0"][1], results["scheduler0"][1]
    for name in ("server0", "worker0", "worker1"):
        out = results[name][1]
        assert "the job cannot start: the scheduler could not connect to worker rank" in out, out
        assert "speaks byteps_tcp version 2, the scheduler version 3" in out, out
        assert "did not answer" not in out, out
