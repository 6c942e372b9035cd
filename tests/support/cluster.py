"""Multi-process cluster harness for tests: every process is bounded in time and killed at exit.

    with Cluster(num_workers=2, num_servers=1) as cluster:
        cluster.start("scheduler", SCHEDULER_OURS)
        cluster.start("server", SERVER_MXNET)
        cluster.start("worker", [sys.executable, script], rank=0)
        results = cluster.wait_all(timeout=90)     # {name: (returncode, output)}
"""
import os
import subprocess
import sys
import tempfile

from tests.support.paths import APPS, REPO  # noqa: F401  (tests import them from here)
from tests.support.procs import free_port, free_ports, kill_process_tree
PY = sys.executable
SCHEDULER_OURS = [PY, "-m", "kvstore_byteps.scheduler"]
# Our server as launch.py starts it by default: no MXNet import (2.5-3.5 s of CPU per process
# here). Tests of the MXNET_KVSTORE_SERVER knob start UPSTREAM's command with the knob set.
SERVER_OURS = [PY, "-m", "kvstore_byteps.server"]
UPSTREAM = [PY, "-c", "import mxnet"]      # scheduler or server, by DMLC_ROLE


def app(name, *args):
    """Command running tests/apps/<name>."""
    return [PY, os.path.join(APPS, name)] + [str(a) for a in args]


class Cluster:
    """Starts scheduler/server/worker processes on 127.0.0.1 with the DMLC environment."""

    def __init__(self, num_workers, num_servers, env=None):
        self.base_env = dict(os.environ)
        self.base_env.update({
            "DMLC_NUM_WORKER": str(num_workers), "DMLC_NUM_SERVER": str(num_servers),
            "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(free_port()),
            "DMLC_NODE_HOST": "127.0.0.1", "PYTHONPATH": REPO, "PYTHONUNBUFFERED": "1",
            "BYTEPS_START_TIMEOUT": "40", "BYTEPS_REQUEST_TIMEOUT": "60",
        })
        self.base_env.update(env or {})
        self.procs = {}

    def ports(self, count):
        """``count`` distinct free ports for nodes started with a fixed PORT: never the
        scheduler's root port (a port chosen before it was taken would collide)."""
        return free_ports(count, exclude={int(self.base_env["DMLC_PS_ROOT_PORT"])})

    def start(self, role, argv, name=None, env=None, cwd=REPO):
        name = name or "%s%d" % (role, sum(1 for n in self.procs if n.startswith(role)))
        child_env = dict(self.base_env, DMLC_ROLE=role, **(env or {}))
        log = tempfile.TemporaryFile(mode="w+")
        proc = subprocess.Popen(argv, env=child_env, cwd=cwd, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = (proc, log)
        return name

    def output(self, name):
        log = self.procs[name][1]
        log.seek(0)
        return log.read()

    def wait_for(self, name, text, timeout=60):
        """Wait until ``text`` is in the output of ``name``; fail with everyone's output."""
        import time
        deadline = time.monotonic() + timeout
        while text not in self.output(name):
            if time.monotonic() > deadline:
                raise AssertionError("no %r from %s within %d s\n%s"
                                     % (text, name, timeout, self.dump()))
            time.sleep(0.2)

    def stop_training(self, stop_file, timeout, workers=("worker0", "worker1")):
        """Workers running ``byteps_checks.py until STOP_FILE`` are still training: stop them,
        wait for every process, check that all exited 0 and every worker's sums were exact;
        return ``wait_all``'s results."""
        assert all(self.procs[w][0].poll() is None for w in workers), self.dump()
        stop_file.write_text("")
        results = self.wait_all(timeout)
        assert_all_ok(results, self)
        for name in workers:
            assert "ROUNDS OK" in results[name][1], results[name][1]
        return results

    def wait_all(self, timeout):
        """Wait for every process; on timeout kill all and raise with everyone's output."""
        import time
        deadline = time.monotonic() + timeout
        for name, (proc, _) in self.procs.items():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill_all()
                raise AssertionError("%s did not exit within %d s\n%s"
                                     % (name, timeout, self.dump()))
        return {name: (proc.returncode, self.output(name))
                for name, (proc, _) in self.procs.items()}

    def dump(self):
        return "\n".join("---- %s (rc=%s)\n%s" % (n, p.poll(), self.output(n)[-3000:])
                         for n, (p, _) in self.procs.items())

    def kill_all(self):
        for proc, _ in self.procs.values():
            if proc.poll() is None:
                kill_process_tree(proc)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill_all()
        for _, log in self.procs.values():
            log.close()


def assert_all_ok(results, cluster):
    bad = {n: rc for n, (rc, _) in results.items() if rc != 0}
    assert not bad, "non-zero exit codes %s\n%s" % (bad, cluster.dump())
