"""Shared test helpers: free ports, bounded waits, processes that cannot outlive a test, and
the kind of every test.

Import the plain helpers with ``from tests.conftest import free_port, wait_until, pid_alive``; use the
``spawn`` fixture to start processes that are killed (with everything they started) at teardown.

Kinds (markers; ``pytest -m unit`` gives feedback in seconds, ``.ci/run`` runs all):

* ``unit``: pure, in one process, no sockets and no processes (enforced: a unit test that opens
  a socket or starts a process fails, saying to mark it otherwise);
* ``loopback``: transports in one process, on 127.0.0.1;
* ``cluster``: several processes (our nodes, upstream MXNet, the launcher, namespaces, ssh).

A module's kind is its ``KIND`` below; a test marked with a kind itself keeps that one.
"""
import os
import signal
import socket
import subprocess
import time

import pytest

from kvstore_byteps.launcher.procs import pid_alive  # noqa: F401  (tests import it from here)

KILL_GRACE_S = 3.0
KINDS = ("unit", "loopback", "cluster")
KIND = {
    "test_batching": "unit", "test_codec": "unit", "test_config": "unit",
    "test_engine_partition": "unit", "test_engine_reduce": "unit",
    "test_engine_credit": "unit", "test_engine_stages": "unit", "test_engine_trace": "unit",
    "test_kv_keys": "unit", "test_layers": "unit", "test_loopback": "unit",
    "test_memory": "loopback",
    "test_membership": "unit", "test_mxnet_patch_engine_async": "unit",
    "test_mxnet_patch_views": "unit", "test_resend": "unit", "test_server_byteps": "unit", "test_server_pacing": "unit",
    "test_server_dist": "unit", "test_server_pickle": "unit", "test_server_protocol": "unit",
    "test_auth": "unit", "test_tcp_van": "unit", "test_cuda_libs": "unit",
    "test_compress": "unit", "test_bench_pushpull": "unit",
    "test_van_failures": "loopback",
    "test_demo": "cluster", "test_gpu": "cluster", "test_interop": "cluster",
    "test_launch": "cluster", "test_mxnet_patch_hook": "cluster", "test_netns": "cluster",
    "test_server_cluster": "cluster", "test_ssh_launcher": "cluster",
    "test_worker_behaviour": "cluster", "test_worker_training": "cluster",
    "test_recovery_cluster": "cluster", "test_recovery": "unit", "test_job_end": "cluster", "test_claims": "unit", "test_server_profiler": "unit", "test_docs": "unit", "test_p3_van": "loopback",
}


def pytest_configure(config):
    for kind, text in (("unit", "pure: no sockets, no processes (enforced)"),
                       ("loopback", "transports in one process on 127.0.0.1"),
                       ("cluster", "several processes: nodes, upstream MXNet, launcher")):
        config.addinivalue_line("markers", "%s: %s" % (kind, text))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if not any(item.get_closest_marker(kind) for kind in KINDS):
            module = item.module.__name__.rsplit(".", 1)[-1]
            if module not in KIND:
                raise pytest.UsageError("%s has no kind: add it to KIND in tests/conftest.py"
                                        % module)
            item.add_marker(KIND[module])


@pytest.fixture(autouse=True)
def _unit_tests_stay_pure(request, monkeypatch):
    """A ``unit`` test may not open sockets or start processes."""
    if request.node.get_closest_marker("unit") is None:
        return

    def refuse(*args, **kwargs):
        raise AssertionError("a unit test opened a socket or started a process: mark it "
                             "@pytest.mark.loopback or @pytest.mark.cluster")
    for owner, name in ((socket, "socket"), (socket, "socketpair"),
                        (socket, "create_connection"), (subprocess, "Popen"), (os, "fork")):
        monkeypatch.setattr(owner, name, refuse)


def free_port(host="127.0.0.1"):
    """A TCP port on ``host`` that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def wait_until(predicate, timeout, what):
    """Poll ``predicate`` until it is true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail("timed out after %g s waiting for %s" % (timeout, what))
        time.sleep(0.02)


def descendants(pid):
    """Pids of every live descendant of ``pid`` (Linux /proc), children before grandchildren."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as stat:
                    parents[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue  # exited while we looked
    found, frontier = [], [pid]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def kill_process_tree(proc, grace=KILL_GRACE_S):
    """SIGTERM ``proc`` and all its descendants (their process groups too), SIGKILL after ``grace``."""
    pids = [proc.pid] + descendants(proc.pid)  # before signalling: orphans lose their parent link
    _signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(pid_alive(p) for p in pids[1:]) or proc.poll() is None:
        if time.monotonic() > deadline:
            _signal_all(pids, signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait(timeout=grace)


def _signal_all(pids, signum):
    own_group = os.getpgrp()
    for pid in pids:
        try:
            group = os.getpgid(pid)
            if group != own_group:  # never signal pytest's own group
                os.killpg(group, signum)
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


@pytest.fixture
def spawn():
    """``spawn(argv, **popen_kwargs)`` starts a process in a new session; teardown kills its tree."""
    procs = []

    def start(argv, **kwargs):
        kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(argv, **kwargs)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        kill_process_tree(proc)
