"""gluon training over dist_byteps equals single-process training on the union of the batches."""
import sys

import numpy as np
import pytest

from tests.support.vans import van_env
from tests.support.cluster import SCHEDULER_OURS, UPSTREAM, Cluster, app, assert_all_ok
from tests.support.paths import APPS

pytestmark = pytest.mark.timeout(180)

sys.path.insert(0, APPS)


def reference_params(steps, num_workers):
    import mxnet as mx
    from mxnet import gluon
    import gluon_train as g
    net = g.build_net([mx.cpu(0)])
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05, "momentum": 0.9},
                            kvstore=None)
    for x, y in g.batches(steps, num_workers):
        g.train_step(net, trainer, gluon.loss.L2Loss(), x, y, [mx.cpu(0)])
    return g.params_of(net)


SERVERS = {
    "byteps": [sys.executable, "-c", "import mxnet"],   # with MXNET_KVSTORE_SERVER=byteps
    "upstream": UPSTREAM,
}


#: what rank 0's start-up line names: with MXNet's servers the default van reaches them over
#: ZeroMQ and the scheduler and itself over byteps_tcp
TRANSPORT = {("byteps", "auto"): "van byteps_tcp (auto: every peer is ours)",
             ("upstream", "auto"): "van auto: byteps_tcp to nodes 1,9, zmq to nodes 8,10 "
                                   "(upstream MXNet)"}


@pytest.mark.parametrize("server,contexts,van", [("byteps", 2, "auto"), ("byteps", 2, "zmq"),
                                                ("upstream", 1, "auto"),
                                                ("byteps", 2, "byteps_rdma")])
def test_two_workers_two_servers_match_single_process(tmp_path, server, contexts, van):
    steps = 5
    env = {"MXNET_KVSTORE_SERVER": "byteps" if server == "byteps" else "mxnet",
           **van_env(van)}
    with Cluster(num_workers=2, num_servers=2, env=env) as cluster:
        cluster.start("scheduler", SCHEDULER_OURS)
        for _ in range(2):
            cluster.start("server", SERVERS[server])
        for _ in range(2):
            cluster.start("worker", app("gluon_train.py", tmp_path, "--contexts", contexts,
                                        "--steps", steps))
        results = cluster.wait_all(150)
        assert_all_ok(results, cluster)
        assert "update_on_kvstore=True" in results["worker0"][1]   # the servers update
        said = results["worker0"][1] + results["worker1"][1]     # rank 0 says it
        assert TRANSPORT.get((server, van), "van %s;" % van) in said
    expected = reference_params(steps, 2)
    for rank in range(2):
        got = np.load(tmp_path / ("rank%d.npz" % rank))
        assert sorted(got.files) == sorted(expected)
        for name, value in expected.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5, err_msg=name)
