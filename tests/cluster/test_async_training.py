"""Asynchronous training (BYTEPS_ENABLE_ASYNC=1) through the store's API, gluon.Trainer,
Module.fit and BytePS's API (DistributedOptimizer, DistributedTrainer), on two workers and two
of our servers: the servers' final weights are exactly the initial weights plus every worker's
changes (tests/apps/async_train.py checks them)."""
import re
import sys

import pytest

from tests.support.cluster import SCHEDULER_OURS, UPSTREAM, Cluster, app, assert_all_ok

pytestmark = pytest.mark.timeout(120)

STEPS = 6
SERVER = [sys.executable, "-c", "import mxnet"]      # with MXNET_KVSTORE_SERVER=byteps


@pytest.mark.parametrize("path", ["kv", "gluon", "module", "bps-optimizer", "bps-trainer"])
def test_async_training_adds_every_workers_changes(tmp_path, path):
    env = {"MXNET_KVSTORE_SERVER": "byteps", "BYTEPS_ENABLE_ASYNC": "1"}
    with Cluster(num_workers=2, num_servers=2, env=env) as cluster:
        cluster.start("scheduler", SCHEDULER_OURS)
        for _ in range(2):
            cluster.start("server", SERVER)
        for _ in range(2):
            cluster.start("worker", app("async_train.py", path, STEPS))
        results = cluster.wait_all(100)
        assert_all_ok(results, cluster)
    output = "".join(results["worker%d" % n][1] for n in range(2))   # ranks: the scheduler's
    for rank in range(2):
        found = re.findall(r"ASYNC_RESULT %s %d (\S+) (\S+)" % (path, rank), output)
        assert found and found[0][0] == found[0][1], output


def test_async_against_mxnets_own_servers_is_refused(tmp_path):
    """MXNet's servers keep a push instead of adding it: every update would be silently wrong."""
    env = {"MXNET_KVSTORE_SERVER": "mxnet", "BYTEPS_ENABLE_ASYNC": "1"}
    with Cluster(num_workers=1, num_servers=1, env=env) as cluster:
        cluster.start("scheduler", SCHEDULER_OURS)
        cluster.start("server", UPSTREAM)
        cluster.start("worker", app("async_train.py", "kv", 1))
        results = cluster.wait_all(60)
    code, output = results["worker0"]
    assert code != 0 and "BYTEPS_ENABLE_ASYNC needs kvstore-byteps servers" in output, output
