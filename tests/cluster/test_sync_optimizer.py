"""Synchronous training with the servers' optimizer: ``dist_byteps`` is optimizer-capable as
``dist_sync`` is, so gluon's Trainer and Module.fit pick ``update_on_kvstore`` by MXNet's own
rules, and 2 workers x 2 servers end with the parameters ``dist_sync`` gives (within float
rounding), on MXNet's servers and on ours; ``MXNET_UPDATE_ON_KVSTORE=0`` keeps the updates on
the workers, with the same parameters."""
import numpy as np
import pytest

from tests.support.cluster import PY, SCHEDULER_OURS, UPSTREAM, Cluster, app, assert_all_ok

pytestmark = pytest.mark.timeout(240)

#: the servers a dist_byteps job runs on: MXNet's C++ servers, or ours
SERVERS = {"mxnet": UPSTREAM, "ours": [PY, "-m", "kvstore_byteps.server"]}
_REFERENCES = {}      # case -> dist_sync's parameters on MXNet's own stack


def run_job(case, out_dir, kvstore, scheduler, server, env=None):
    """Two workers and two servers running ``sync_optimizer.py case``; rank 0's parameters and
    every worker's output."""
    out_dir.mkdir()
    with Cluster(num_workers=2, num_servers=2, env=env) as cluster:
        cluster.start("scheduler", scheduler)
        for _ in range(2):
            cluster.start("server", server)
        for _ in range(2):
            cluster.start("worker", app("sync_optimizer.py", case, out_dir, "--kvstore", kvstore))
        results = cluster.wait_all(180)
        assert_all_ok(results, cluster)
    params = [np.load(out_dir / ("rank%d.npz" % rank)) for rank in range(2)]
    for name in params[0].files:         # every worker holds the same weights
        np.testing.assert_array_equal(params[0][name], params[1][name], err_msg=name)
    return dict(params[0]), results["worker0"][1] + results["worker1"][1]


def reference(case, tmp_path):
    """``dist_sync`` with MXNet's scheduler, servers and workers (updates on the servers)."""
    if case not in _REFERENCES:
        _REFERENCES[case], said = run_job(case, tmp_path / "dist_sync", "dist_sync", UPSTREAM,
                                          UPSTREAM)
        assert "update_on_kvstore=True capable=True type=dist_sync" in said, said
    return _REFERENCES[case]


# each optimizer and front end on our servers, and on MXNet's where the worker's side differs
# (gluon, Module with the workers updating, multi-precision); suite time: 7 jobs, not 10
@pytest.mark.parametrize("case,server,on_workers", [
    ("gluon-sgd", "mxnet", False), ("gluon-sgd", "ours", False), ("gluon-adam", "ours", False),
    ("module", "ours", False), ("module", "mxnet", True),
    ("store-mp16", "ours", False), ("store-mp16", "mxnet", False),
    ("store-2bit", "ours", False), ("store-2bit", "mxnet", False)])
def test_dist_byteps_trains_to_dist_syncs_parameters(case, server, on_workers, tmp_path):
    expected = None if case.startswith("store") else reference(case, tmp_path)
    env = {"MXNET_KVSTORE_SERVER": "byteps" if server == "ours" else "mxnet"}
    if on_workers:
        env["MXNET_UPDATE_ON_KVSTORE"] = "0"
    if case.endswith("2bit"):    # its big key (15,000 values) split over both servers
        env["MXNET_KVSTORE_BIGARRAY_BOUND"] = "1000"
    got, said = run_job(case, tmp_path / "dist_byteps", "dist_byteps", SCHEDULER_OURS,
                        SERVERS[server], env)
    assert ("update_on_kvstore=%s capable=True type=dist_sync_byteps" % (not on_workers)) in said
    if expected is None:      # the app's own reference: MXNet's optimizer in its process
        expected = {name: got.pop("want_" + name) for name in list(got)
                    if not name.startswith("want_")}
    assert sorted(got) == sorted(expected)
    # float16 weights: MXNet's servers add the pushes into float32, ours round the sum once
    rtol, atol = (2e-3, 2e-3) if case.endswith("16") else (1e-5, 1e-6)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=rtol, atol=atol, err_msg=name)
