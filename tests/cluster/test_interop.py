"""Cluster tests mixing our nodes with real MXNet 1.9.1 nodes on 127.0.0.1 (sums checked)."""
import pytest

from tests.support.cluster import SCHEDULER_OURS, UPSTREAM, Cluster, app, assert_all_ok

pytestmark = pytest.mark.timeout(150)


def _ok_rounds(results, name, rounds=3):
    out = results[name][1]
    assert sum(" ok sum " in line for line in out.splitlines()) >= rounds, out


@pytest.mark.parametrize("env", [{}, {"PS_HEARTBEAT_INTERVAL": "1", "BYTEPS_LOG_LEVEL": "DEBUG"},
                                 {"PS_RESEND": "1", "BYTEPS_LOG_LEVEL": "DEBUG"}],
                         ids=["plain", "heartbeat", "resend"])
def test_a_our_scheduler_upstream_server_and_workers(env):
    with Cluster(num_workers=2, num_servers=1, env=env) as cluster:
        cluster.start("scheduler", SCHEDULER_OURS)
        cluster.start("server", UPSTREAM)
        for _ in range(2):
            pause = 1.0 if "PS_HEARTBEAT_INTERVAL" in env else 0
            cluster.start("worker", app("upstream_worker.py", "3,4", 100, pause))
        results = cluster.wait_all(120)
        assert_all_ok(results, cluster)
        _ok_rounds(results, "worker0")
        _ok_rounds(results, "worker1")
        if "PS_HEARTBEAT_INTERVAL" in env:   # upstream nodes heartbeat to our scheduler
            assert "control HEARTBEAT from node 9" in results["scheduler0"][1]
        if "PS_RESEND" in env:               # upstream nodes acknowledge our messages
            assert "control ACK from node 9" in results["scheduler0"][1]


@pytest.mark.parametrize("ours_rank", [0, 1])
def test_b_our_kv_worker_beside_upstream_nodes(ours_rank):
    with Cluster(num_workers=2, num_servers=1) as cluster:
        low, high = sorted(cluster.ports(2))
        ours_port, theirs_port = (low, high) if ours_rank == 0 else (high, low)
        cluster.start("scheduler", UPSTREAM)
        cluster.start("server", UPSTREAM)
        # Our worker also asks for the other rank (DMLC_WORKER_ID, a BytePS extension field of
        # the ADD_NODE): upstream's scheduler must skip the field and keep its own order.
        cluster.start("worker", app("kv_worker.py", "--keys", "3"), name="ours",
                      env={"PORT": str(ours_port), "DMLC_WORKER_ID": str(1 - ours_rank)})
        cluster.start("worker", app("upstream_worker.py", "3"), name="upstream",
                      env={"PORT": str(theirs_port)})
        results = cluster.wait_all(120)
        assert_all_ok(results, cluster)
        _ok_rounds(results, "ours")
        _ok_rounds(results, "upstream")
        assert "rank %d round" % ours_rank in results["ours"][1]


@pytest.mark.parametrize("env", [{}, {"PS_RESEND": "1"}], ids=["plain", "resend"])
def test_c_our_scheduler_sum_servers_and_workers_two_ranges(env):
    with Cluster(num_workers=2, num_servers=2, env=env) as cluster:
        cluster.start("scheduler", SCHEDULER_OURS)
        for _ in range(2):
            cluster.start("server", app("sum_server.py"))
        for _ in range(2):
            cluster.start("worker", app("kv_worker.py", "--keys", "0,1,2,3", "--multi"))
        results = cluster.wait_all(120)
        assert_all_ok(results, cluster)
        _ok_rounds(results, "worker0")
        _ok_rounds(results, "worker1")


def test_d_an_upstream_node_joining_a_byteps_tcp_cluster_stops_it_with_a_clear_error():
    """Upstream MXNet speaks only zmq: our byteps_tcp scheduler recognises its greeting and
    stops at once with an error saying so (instead of waiting for it until the deadline)."""
    with Cluster(num_workers=1, num_servers=1, env={"BYTEPS_START_TIMEOUT": "60"}) as cluster:
        cluster.start("scheduler", SCHEDULER_OURS, env={"DMLC_PS_VAN_TYPE": "byteps_tcp"})
        cluster.start("worker", app("upstream_worker.py", "3"))
        proc = cluster.procs["scheduler0"][0]
        proc.wait(30)
        out = cluster.output("scheduler0")
        assert proc.returncode != 0, out
        assert "speaks ZeroMQ" in out and "DMLC_PS_VAN_TYPE=byteps_tcp" in out, out


def test_e_an_upstream_node_told_to_use_byteps_tcp_fails_at_once():
    """The other way round: upstream ps-lite refuses a van it does not know, by name."""
    with Cluster(num_workers=1, num_servers=1) as cluster:
        cluster.start("scheduler", UPSTREAM, env={"DMLC_PS_VAN_TYPE": "byteps_tcp"})
        proc = cluster.procs["scheduler0"][0]
        proc.wait(30)
        out = cluster.output("scheduler0")
        assert proc.returncode != 0 and "byteps_tcp" in out, out
