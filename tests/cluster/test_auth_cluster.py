"""Real clusters and rogues: with BYTEPS_AUTH_KEY strangers cannot join or send; without one, a
spoofed node id cannot stop the servers; upstream MXNet nodes are refused with a clear error."""
import time

import pytest

from tests.support.cluster import SCHEDULER_OURS, SERVER_OURS, UPSTREAM, Cluster, app
from tests.support.vans import van_env


@pytest.mark.timeout(180)
@pytest.mark.parametrize("van", ["zmq", "byteps_tcp", "byteps_rdma"])
def test_with_auth_on_strangers_cannot_join_or_send_and_training_stays_exact(van, tmp_path):
    """2 dist_byteps workers train with a key while a fuzzer without it fires frames at the
    scheduler and the server, a worker without the key and one with another key try to join:
    the rogues get nothing in, the job's sums stay exact, the refusals are logged."""
    env = dict(van_env(van), MXNET_KVSTORE_SERVER="byteps",
               BYTEPS_AUTH_KEY="cluster-key-" + "9" * 20)
    with Cluster(num_workers=2, num_servers=1, env=env) as cluster:
        server_port, = cluster.ports(1)
        scheduler_port = cluster.base_env["DMLC_PS_ROOT_PORT"]
        cluster.start("scheduler", SCHEDULER_OURS)
        cluster.start("server", SERVER_OURS, env={"PORT": str(server_port)})
        stop_file = tmp_path / "stop"
        for _ in range(2):   # train until the rogues are done
            cluster.start("worker", app("byteps_checks.py", "until", stop_file))
        cluster.wait_for("worker0", "round 20")
        cluster.start("fuzzer", app("fuzzer.py", "127.0.0.1:%s,127.0.0.1:%d"
                                    % (scheduler_port, server_port), 300, 3))
        rogue_env = {"BYTEPS_START_TIMEOUT": "8"}
        cluster.start("worker", app("byteps_checks.py", "rounds", 1), name="keyless",
                      env=dict(rogue_env, BYTEPS_AUTH_KEY=""))
        cluster.start("worker", app("byteps_checks.py", "rounds", 1), name="otherkey",
                      env=dict(rogue_env, BYTEPS_AUTH_KEY="another-key-" + "1" * 20))
        for name in ("keyless", "otherkey", "fuzzer0"):
            cluster.procs[name][0].wait(60)
        rogues = {name: (cluster.procs[name][0].returncode, cluster.output(name))
                  for name in ("keyless", "otherkey")}
        for name in ("keyless", "otherkey"):
            del cluster.procs[name]
        results = cluster.stop_training(stop_file, 120)
    for name, (code, out) in rogues.items():
        assert code != 0 and "ROUNDS OK" not in out, (name, out)
    assert "different BYTEPS_AUTH_KEY" in rogues["otherkey"][1], rogues["otherkey"][1][-6000:]
    assert "requires authentication (it has BYTEPS_AUTH_KEY) but this node has no key" in \
        rogues["keyless"][1], rogues["keyless"][1][-6000:]
    for name in ("scheduler0", "server0"):
        out = results[name][1]
        assert "refused a connection" in out, out
        lines = [line for line in out.splitlines()
                 if " WARNING " in line or " ERROR " in line or "Traceback" in line]
        assert len(lines) < 40, "%s logged %d lines:\n%s" % (name, len(lines), "\n".join(lines))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("van", ["zmq", "byteps_tcp"])
def test_without_a_key_a_spoofed_worker_id_cannot_stop_the_servers(van, tmp_path):
    """No BYTEPS_AUTH_KEY: a process claims worker rank 0's node id and sends kStopServer to
    the server while the workers train. The claim holds no weight while the real worker's
    connection is open: training goes on exact and the job ends normally. (On byteps_tcp the
    server used to stop every round; the workers failed only at their request deadline.)"""
    env = {"MXNET_KVSTORE_SERVER": "byteps", "DMLC_PS_VAN_TYPE": van,
           "BYTEPS_REQUEST_TIMEOUT": "20"}
    with Cluster(num_workers=2, num_servers=1, env=env) as cluster:
        server_port, = cluster.ports(1)
        cluster.start("scheduler", SCHEDULER_OURS)
        cluster.start("server", SERVER_OURS, env={"PORT": str(server_port)})
        stop_file = tmp_path / "stop"
        for _ in range(2):
            cluster.start("worker", app("byteps_checks.py", "until", stop_file))
        cluster.wait_for("worker0", "round 20")
        cluster.start("spoof", app("spoof_stop.py", van, "127.0.0.1:%d" % server_port))
        cluster.procs["spoof0"][0].wait(30)
        rounds = cluster.output("worker0").count("round ")
        time.sleep(2)                           # training goes on after the spoofed stop
        assert cluster.output("worker0").count("round ") > rounds, cluster.dump()
        results = cluster.stop_training(stop_file, 60)
    assert "SPOOF SENT" in results["spoof0"][1]


@pytest.mark.timeout(120)
def test_an_upstream_mxnet_node_is_refused_with_a_clear_error():
    """Upstream MXNet cannot authenticate: with a key on our scheduler, an upstream server
    is refused, the scheduler says why, and its start fails at the deadline."""
    env = {"BYTEPS_AUTH_KEY": "cluster-key-" + "9" * 20, "BYTEPS_START_TIMEOUT": "6"}
    with Cluster(num_workers=1, num_servers=1, env=env) as cluster:
        cluster.start("scheduler", SCHEDULER_OURS)
        cluster.start("server", UPSTREAM,
                      env={"MXNET_KVSTORE_SERVER": "mxnet"})
        proc = cluster.procs["scheduler0"][0]
        proc.wait(60)
        out = cluster.output("scheduler0")
        cluster.kill_all()
    assert proc.returncode != 0, out
    assert "upstream MXNet node, which cannot authenticate" in out, out
