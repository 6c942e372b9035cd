"""BYTEPS_AUTH_KEY: only nodes holding the cluster's key join and send (zmq: CURVE; byteps_tcp:
a mutual HMAC proof in the hello). Unit tests, in-process nodes, and a real cluster with rogues."""
import socket
import sys
import threading
import time

import numpy as np
import pytest

from kvstore_byteps.config import Config, Env, Role, VanType
from kvstore_byteps.errors import AuthenticationError, ConfigError
from kvstore_byteps.van import auth
from kvstore_byteps.van.postoffice import Postoffice
from kvstore_byteps.van.tcp_van import exchange_hellos
from tests.cluster import SCHEDULER_OURS, Cluster, app
from tests.conftest import free_port
from tests.kv_nodes import start_all, start_trio

KEY = b"k" * 32
ROLES = (Role.SCHEDULER, Role.SERVER, Role.WORKER)
VANS = [VanType.ZMQ, VanType.BYTEPS_TCP]


# ============================================================================ configuration
def test_the_key_comes_from_the_variable_or_a_file_and_never_shows_in_repr(tmp_path):
    assert Config.from_env({}).auth_key is None and not Config.from_env({}).auth
    cfg = Config.from_env({Env.AUTH_KEY: "s3cret-s3cret-s3cret"})
    assert cfg.auth and cfg.auth_key == b"s3cret-s3cret-s3cret"
    assert "s3cret" not in repr(cfg)
    path = tmp_path / "key"
    path.write_bytes(b"0123456789abcdef0123\n")
    assert Config.from_env({Env.AUTH_KEY_FILE: str(path)}).auth_key == b"0123456789abcdef0123"


def test_bad_keys_are_refused_without_quoting_them(tmp_path):
    with pytest.raises(ConfigError, match="at least 16") as short:
        Config.from_env({Env.AUTH_KEY: "tiny-secret"})
    assert "tiny-secret" not in str(short.value)
    with pytest.raises(ConfigError, match="not both"):
        Config.from_env({Env.AUTH_KEY: "x" * 20, Env.AUTH_KEY_FILE: "/nonexistent"})
    with pytest.raises(ConfigError, match="BYTEPS_AUTH_KEY_FILE=.*cannot be read"):
        Config.from_env({Env.AUTH_KEY_FILE: str(tmp_path / "missing")})


# ============================================================================ proofs
def test_proofs_bind_the_key_both_nonces_and_the_side():
    key, other = auth.hmac_key(KEY), auth.hmac_key(b"o" * 32)
    mine, theirs = auth.new_nonce(), auth.new_nonce()
    proof = auth.tcp_proof(key, auth.CONNECTOR, mine, theirs)
    assert len(proof) == auth.PROOF_BYTES and len(mine) == auth.NONCE_BYTES
    assert auth.tcp_proof_ok(key, auth.CONNECTOR, mine, theirs, proof)
    assert not auth.tcp_proof_ok(other, auth.CONNECTOR, mine, theirs, proof)
    assert not auth.tcp_proof_ok(key, auth.ACCEPTOR, mine, theirs, proof)      # reflected
    assert not auth.tcp_proof_ok(key, auth.CONNECTOR, theirs, mine, proof)     # swapped
    assert auth.curve_secret(KEY) != auth.hmac_key(KEY) and len(auth.curve_secret(KEY)) == 32


def handshake(key_a, key_b):
    """Both ends of the byteps_tcp hello over a socket pair: each end's result or error."""
    a, b = socket.socketpair()
    results = {}

    def side(name, sock, key, label):
        try:
            results[name] = exchange_hellos(sock, 7 if name == "a" else 8,
                                            key and auth.hmac_key(key), label, "peer " + name)
        except Exception as exc:
            results[name] = exc
        finally:
            sock.close()   # a refusing side hangs up, as the van does
    threads = [threading.Thread(target=side, args=("a", a, key_a, auth.CONNECTOR)),
               threading.Thread(target=side, args=("b", b, key_b, auth.ACCEPTOR))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return results["a"], results["b"]


@pytest.mark.loopback
def test_tcp_hello_with_the_same_key_passes_and_returns_the_ids():
    assert handshake(KEY, KEY) == (8, 7)
    assert handshake(None, None) == (8, 7)


@pytest.mark.loopback
def test_tcp_hello_with_another_key_or_none_fails_on_both_sides_with_the_cause():
    a, b = handshake(KEY, b"o" * 32)
    assert isinstance(a, AuthenticationError) and "different BYTEPS_AUTH_KEY" in str(a)
    assert isinstance(b, AuthenticationError) and "different BYTEPS_AUTH_KEY" in str(b)
    a, b = handshake(None, KEY)
    assert isinstance(a, AuthenticationError) and "requires authentication" in str(a)
    assert isinstance(b, AuthenticationError) and "does not authenticate" in str(b)


# ============================================================================ in-process nodes
def config(role, port, van, key, timeout=20.0):
    return Config(role=role, num_workers=1, num_servers=1, root_uri="127.0.0.1",
                  root_port=port, node_host="127.0.0.1", start_timeout=timeout,
                  request_timeout=10.0, van_type=van, auth_key=key)


def echo_double(req, server):
    if req.meta.push:
        server.respond(req)
    else:
        server.respond(req, req.keys, np.full(2, 2, np.float32), req.lens)


@pytest.mark.loopback
@pytest.mark.timeout(60)
@pytest.mark.parametrize("van", VANS, ids=lambda v: v.value)
def test_nodes_holding_the_key_form_a_cluster_and_exchange_data(van):
    port = free_port()
    nodes, worker = start_trio([config(role, port, van, KEY) for role in ROLES], echo_double)
    try:
        worker.wait(worker.push([1], np.ones(2, np.float32), [8]))
        assert np.array_equal(np.frombuffer(worker.wait(worker.pull([1])).vals, np.float32),
                              [2, 2])
    finally:
        for po in reversed(nodes):
            po.stop()


@pytest.mark.loopback
@pytest.mark.timeout(60)
@pytest.mark.parametrize("van", VANS, ids=lambda v: v.value)
def test_a_node_with_another_key_stops_at_once_naming_the_scheduler(van):
    port = free_port()
    scheduler = Postoffice(config(Role.SCHEDULER, port, van, KEY))
    intruder = Postoffice(config(Role.SERVER, port, van, b"o" * 32))
    forming = threading.Thread(target=start_all, args=([scheduler], 25), daemon=True)
    forming.start()
    started = time.monotonic()
    try:
        with pytest.raises(AuthenticationError, match="scheduler.*different BYTEPS_AUTH_KEY"):
            intruder.start()
        assert time.monotonic() - started < 15        # at once, not at the deadline (20 s)
        assert forming.is_alive() and not scheduler.stopped   # the scheduler still waits
    finally:
        scheduler.stop()
        intruder.stop()


# ============================================================================ real clusters
SERVER_KNOB = [sys.executable, "-c", "import mxnet"]


@pytest.mark.cluster
@pytest.mark.timeout(180)
@pytest.mark.parametrize("van", ["zmq", "byteps_tcp"])
def test_with_auth_on_strangers_cannot_join_or_send_and_training_stays_exact(van, tmp_path):
    """2 dist_byteps workers train with a key while a fuzzer without it fires frames at the
    scheduler and the server, a worker without the key and one with another key try to join:
    the rogues get nothing in, the job's sums stay exact, the refusals are logged."""
    server_port = free_port()
    env = {"MXNET_KVSTORE_SERVER": "byteps", "DMLC_PS_VAN_TYPE": van,
           "BYTEPS_AUTH_KEY": "cluster-key-" + "9" * 20}
    with Cluster(num_workers=2, num_servers=1, env=env) as cluster:
        scheduler_port = cluster.base_env["DMLC_PS_ROOT_PORT"]
        cluster.start("scheduler", SCHEDULER_OURS)
        cluster.start("server", SERVER_KNOB, env={"PORT": str(server_port)})
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
    for name in ("scheduler0", "server0"):
        out = results[name][1]
        assert "refused a connection" in out, out
        lines = [line for line in out.splitlines()
                 if " WARNING " in line or " ERROR " in line or "Traceback" in line]
        assert len(lines) < 40, "%s logged %d lines:\n%s" % (name, len(lines), "\n".join(lines))


@pytest.mark.cluster
@pytest.mark.timeout(120)
@pytest.mark.parametrize("van", ["zmq", "byteps_tcp"])
def test_without_a_key_a_spoofed_worker_id_cannot_stop_the_servers(van, tmp_path):
    """No BYTEPS_AUTH_KEY: a process claims worker rank 0's node id and sends kStopServer to
    the server while the workers train. The claim holds no weight while the real worker's
    connection is open: training goes on exact and the job ends normally. (On byteps_tcp the
    server used to stop every round; the workers failed only at their request deadline.)"""
    server_port = free_port()
    env = {"MXNET_KVSTORE_SERVER": "byteps", "DMLC_PS_VAN_TYPE": van,
           "BYTEPS_REQUEST_TIMEOUT": "20"}
    with Cluster(num_workers=2, num_servers=1, env=env) as cluster:
        cluster.start("scheduler", SCHEDULER_OURS)
        cluster.start("server", SERVER_KNOB, env={"PORT": str(server_port)})
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


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_an_upstream_mxnet_node_is_refused_with_a_clear_error():
    """Upstream MXNet cannot authenticate: with a key on our scheduler, an upstream server
    is refused, the scheduler says why, and its start fails at the deadline."""
    env = {"BYTEPS_AUTH_KEY": "cluster-key-" + "9" * 20, "BYTEPS_START_TIMEOUT": "10"}
    with Cluster(num_workers=1, num_servers=1, env=env) as cluster:
        cluster.start("scheduler", SCHEDULER_OURS)
        cluster.start("server", [sys.executable, "-c", "import mxnet"],
                      env={"MXNET_KVSTORE_SERVER": "mxnet"})
        proc = cluster.procs["scheduler0"][0]
        proc.wait(60)
        out = cluster.output("scheduler0")
        cluster.kill_all()
    assert proc.returncode != 0, out
    assert "upstream MXNet node, which cannot authenticate" in out, out


# ============================================================================ launcher
def test_the_launcher_refuses_mxnets_scheduler_or_server_with_a_key(capsys):
    from kvstore_byteps.launcher.cli import parse_args
    environ = {"BYTEPS_AUTH_KEY": "x" * 20}
    for option in (["--server", "mxnet"], ["--scheduler", "mxnet"]):
        with pytest.raises(SystemExit):
            parse_args(["-n", "1"] + option + ["python", "t.py"], environ)
        assert "cannot authenticate" in capsys.readouterr().err
    assert parse_args(["-n", "1", "python", "t.py"], environ).server == "byteps"
    with pytest.raises(SystemExit):       # also when the key is passed with --env
        parse_args(["-n", "1", "--server", "mxnet", "--env", "BYTEPS_AUTH_KEY=" + "y" * 20,
                    "python", "t.py"], {})


def test_the_launcher_warns_that_a_key_on_the_ssh_command_line_is_visible(tmp_path, capsys):
    from kvstore_byteps.launcher.cli import parse_args
    hostfile = tmp_path / "hosts"
    hostfile.write_text("h1\n")
    parse_args(["-n", "1", "--launcher", "ssh", "-H", str(hostfile), "--env",
                "BYTEPS_AUTH_KEY=" + "y" * 20, "python", "t.py"], {})
    assert "prefer BYTEPS_AUTH_KEY_FILE" in capsys.readouterr().err
