"""A server killed (-9) during dist_byteps training and restarted with the same environment
rejoins, the workers recover its rounds, and every sum stays exact (BYTEPS_SERVER_RECOVERY)."""
import os
import re
import signal

import pytest

from tests.support.vans import van_env
from tests.support.cluster import SCHEDULER_OURS, UPSTREAM, Cluster, app

SERVER_KNOB = UPSTREAM      # MXNet's server process; MXNET_KVSTORE_SERVER picks ours
ENV = {"MXNET_KVSTORE_SERVER": "byteps", "BYTEPS_SERVER_RECOVERY": "1",
       "PS_HEARTBEAT_INTERVAL": "1", "PS_HEARTBEAT_TIMEOUT": "20",
       "BYTEPS_PARTITION_BYTES": "400000"}


def _train_kill_and_restart_a_server(env, same_port=False, restarted_env=None, timeout=150):
    """2 workers x 2 servers, 150 varied rounds; server1 is killed (-9) after round 20 and
    started again with the same environment (and, if ``same_port``, on its PORT again)."""
    with Cluster(num_workers=2, num_servers=2, env=env) as cluster:
        ports = cluster.ports(2) if same_port else None
        cluster.start("scheduler", SCHEDULER_OURS)
        for rank in range(2):
            cluster.start("server", SERVER_KNOB, env={"PORT": str(ports[rank])} if ports else None)
        for _ in range(2):
            cluster.start("worker", app("byteps_checks.py", "varied", 150))
        cluster.wait_for("worker0", "round 20", 90)
        victim = cluster.procs["server1"][0]
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(10)
        again = dict({"PORT": str(ports[1])} if ports else {}, **(restarted_env or {}))
        cluster.start("server", SERVER_KNOB, name="server1-restarted", env=again)
        return cluster.wait_all(timeout), cluster.dump()


# auto: byteps_tcp between our nodes, its claims on the reused port and the new tcp_port
# announced by the restarted server
@pytest.mark.parametrize("van,same_port", [("zmq", False), ("auto", True),
                                           ("byteps_rdma", True)])
def test_a_restarted_server_is_restored_and_the_sums_stay_exact(van, same_port):
    results, dump = _train_kill_and_restart_a_server(
        dict(ENV, **van_env(van)), same_port)
    for name, (code, out) in results.items():
        if name == "server1":
            assert code == -signal.SIGKILL
            continue
        assert code == 0, "%s exited %s\n%s" % (name, code, dump)
    for name in ("worker0", "worker1"):
        assert "VARIED OK after 150 rounds" in results[name][1], results[name][1]
        assert "sent the restarted server rank" in results[name][1], results[name][1]
    assert "rebuilt the rounds of" in results["server1-restarted"][1]


def test_without_server_recovery_a_restarted_server_ends_the_job_saying_what_to_set():
    """Workers that did not keep their pushes cannot restore the restarted server: they fail
    naming BYTEPS_SERVER_RECOVERY, the restarted server stops waiting for their reports (at its
    deadline, or when the workers that left are declared dead), and every process exits
    non-zero in bounded time instead of summing wrong."""
    results, dump = _train_kill_and_restart_a_server(
        dict(ENV, BYTEPS_SERVER_RECOVERY="0", PS_HEARTBEAT_TIMEOUT="5"),
        restarted_env={"BYTEPS_START_TIMEOUT": "8"}, timeout=60)
    for name, (code, out) in results.items():
        assert code != 0, "%s exited 0\n%s" % (name, dump)
    for name in ("worker0", "worker1"):
        out = results[name][1]
        assert "cannot restore it" in out and "BYTEPS_SERVER_RECOVERY=1" in out, out
        assert "VARIED OK" not in out and "WRONG SUM" not in out, out
    # it learns the workers are gone one of three ways: its wait for their reports ends, the
    # scheduler declares them dead, or they left before it could connect to them
    restarted = results["server1-restarted"][1]
    assert ("lacks the recovery reports" in restarted or "is dead" in restarted
            or re.search(r"cannot connect to worker \d+ .* within 8 s", restarted)), restarted
