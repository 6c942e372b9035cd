"""The kind of every test, from its folder, and the fixtures every kind shares.

Kinds (markers; ``pytest -m unit`` gives feedback in seconds, ``.ci/run`` runs all):

* ``tests/unit``: pure, in one process, no sockets and no processes (enforced: a unit test that
  opens a socket or starts a process fails, saying to move it);
* ``tests/loopback``: transports in one process, on 127.0.0.1;
* ``tests/cluster``: several processes (our nodes, upstream MXNet, the launcher, namespaces, ssh).

Helpers live in ``tests/support`` (``procs``: free ports, bounded waits, process trees; ``cluster``:
multi-process clusters; ``paths``; fakes and captured wire vectors). Programs the cluster tests
run as nodes are in ``tests/apps``. Use the ``spawn`` fixture to start processes that are killed
(with everything they started) at teardown.
"""
import os
import socket
import subprocess

import pytest

from tests.support.procs import kill_process_tree

KINDS = ("unit", "loopback", "cluster")


def pytest_configure(config):
    for kind, text in (("unit", "pure: no sockets, no processes (enforced)"),
                       ("loopback", "transports in one process on 127.0.0.1"),
                       ("cluster", "several processes: nodes, upstream MXNet, launcher")):
        config.addinivalue_line("markers", "%s: %s" % (kind, text))


def pytest_collection_modifyitems(config, items):
    for item in items:
        kind = os.path.basename(os.path.dirname(str(item.path)))
        if kind not in KINDS:
            raise pytest.UsageError("%s is not in a kind's folder (tests/unit, tests/loopback or "
                                    "tests/cluster)" % item.path)
        item.add_marker(kind)


@pytest.fixture(autouse=True)
def _unit_tests_stay_pure(request, monkeypatch):
    """A ``unit`` test may not open sockets or start processes."""
    if request.node.get_closest_marker("unit") is None:
        return

    def refuse(*args, **kwargs):
        raise AssertionError("a unit test opened a socket or started a process: move it to "
                             "tests/loopback or tests/cluster")
    for owner, name in ((socket, "socket"), (socket, "socketpair"),
                        (socket, "create_connection"), (subprocess, "Popen"), (os, "fork")):
        monkeypatch.setattr(owner, name, refuse)


@pytest.fixture(scope="session")
def demo_reference(tmp_path_factory):
    """The demo at the defaults under the local launcher, run once for every test that compares
    another launcher, van or setting with it (tests/support/demo.py)."""
    from tests.support.demo import reference_run
    return reference_run(tmp_path_factory.mktemp("demo-reference"))


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
