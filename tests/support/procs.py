"""Processes and ports for tests: free ports, bounded waits, and killing a process tree."""
import contextlib
import os
import signal
import socket
import time

import pytest

from kvstore_byteps.launcher.procs import pid_alive  # noqa: F401  (tests import it from here)
from kvstore_byteps.ports import free_port  # noqa: F401  (tests import it from here)

KILL_GRACE_S = 3.0


def free_ports(count, exclude=()):
    """``count`` distinct free ports on 127.0.0.1, none of them in ``exclude``. All are held
    bound while choosing, so two calls of ``free_port()`` cannot hand out the same port twice
    (the OS may reuse a port as soon as its throw-away socket closes)."""
    with contextlib.ExitStack() as held:
        ports = []
        while len(ports) < count:
            sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            if port not in exclude:
                ports.append(port)
        return ports


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
