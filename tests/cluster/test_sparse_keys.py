"""row_sparse arrays through ``dist_byteps`` (2 workers x 2 servers), on our servers and on
MXNet's: the store's init, push, ``row_sparse_pull`` and ``pull`` of row_sparse keys with SGD on
the servers give the steps computed from every worker's gradients; gluon's ``SparseEmbedding``
(a row_sparse weight) ends with the parameters ``dist_sync`` gives on our servers, and
``Embedding(sparse_grad=True)`` (a dense weight, which MXNet 1.9.1's dist_sync cannot train:
its servers abort) with the same ones."""
import numpy as np
import pytest

from tests.support.cluster import PY, SCHEDULER_OURS, UPSTREAM, Cluster, app, assert_all_ok

pytestmark = pytest.mark.timeout(240)

SERVERS = {"mxnet": UPSTREAM, "ours": [PY, "-m", "kvstore_byteps.server"]}
_REFERENCE = {}


def run_job(case, out_dir, kvstore, scheduler, server, env):
    out_dir.mkdir()
    # the big key (50 x 3) is split over both servers by row ranges
    env = dict(env, MXNET_KVSTORE_BIGARRAY_BOUND="64")
    with Cluster(num_workers=2, num_servers=2, env=env) as cluster:
        cluster.start("scheduler", scheduler)
        for _ in range(2):
            cluster.start("server", server)
        for _ in range(2):
            cluster.start("worker", app("sparse_checks.py", case, out_dir, "--kvstore", kvstore))
        results = cluster.wait_all(180)
        assert_all_ok(results, cluster)
    return results["worker0"][1] + results["worker1"][1]


@pytest.mark.parametrize("server", ["ours", "mxnet"])
def test_row_sparse_keys_push_and_pull_only_their_rows_with_the_servers_sgd(server, tmp_path):
    env = {"MXNET_KVSTORE_SERVER": "byteps" if server == "ours" else "mxnet"}
    if server == "ours":       # partitions of a slow link: a key in ranges of ~4 MB
        env["BYTEPS_PARTITION_BYTES"] = "768000"
    said = run_job("store", tmp_path / "job", "dist_byteps", SCHEDULER_OURS, SERVERS[server],
                   env)
    assert said.count("STORE OK") == 2, said
    # a pull into a row_sparse array, skipped (ignore_sparse), says so once a key and worker
    assert said.count("pull of key 3 into a row_sparse array was ignored") == 2, said


def params(out_dir):
    ranks = [np.load(out_dir / ("rank%d.npz" % rank)) for rank in range(2)]
    for name in ranks[0].files:          # every worker holds the same weights
        np.testing.assert_array_equal(ranks[0][name], ranks[1][name], err_msg=name)
    return dict(ranks[0])


def reference(tmp_path):
    """``dist_sync`` on MXNet's own stack, gluon's SparseEmbedding."""
    if not _REFERENCE:
        said = run_job("gluon-rsp", tmp_path / "dist_sync", "dist_sync", UPSTREAM, UPSTREAM,
                       {})
        assert "update_on_kvstore=True type=dist_sync" in said, said
        _REFERENCE.update(params(tmp_path / "dist_sync"))
    return _REFERENCE


# MXNet's servers with dist_byteps workers: the store test above (suite time: 5 jobs, not 6)
@pytest.mark.parametrize("case,server", [("gluon-rsp", "ours"), ("gluon-dense", "ours")])
def test_gluon_sparse_embeddings_train_to_dist_syncs_parameters(case, server, tmp_path):
    expected = reference(tmp_path)
    env = {"MXNET_KVSTORE_SERVER": "byteps" if server == "ours" else "mxnet"}
    said = run_job(case, tmp_path / "dist_byteps", "dist_byteps", SCHEDULER_OURS,
                   SERVERS[server], env)
    assert "update_on_kvstore=True type=dist_sync_byteps" in said, said
    got = params(tmp_path / "dist_byteps")
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
