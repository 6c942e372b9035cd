"""Configuration errors end a node with one line and a non-zero exit, no traceback: a worker
whose training mode differs from the servers' (the server probe refuses it), and a worker with a
bad variable. Launched as users launch (launch.py), each worker only creating the store."""
import os
import subprocess
import sys

import pytest
from tests.support.paths import REPO

pytestmark = pytest.mark.timeout(120)

CREATE_STORE = [sys.executable, "-c", "import mxnet as mx; mx.kv.create('dist_byteps')"]


def launch(spawn, *options):
    argv = [sys.executable, os.path.join(REPO, "launch.py"), "-n", "2", "-s", "1",
            "--timeout", "80", "--env", "BYTEPS_START_TIMEOUT=40", *options, *CREATE_STORE]
    proc = spawn(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate(timeout=100)
    return proc.returncode, out


def lines_with(out, text):
    return [line for line in out.splitlines() if text in line]


@pytest.mark.parametrize("variable", ["BYTEPS_ENABLE_ASYNC=1", "BYTEPS_BACKUP_WORKERS=1"])
def test_a_worker_that_trains_otherwise_than_the_servers_says_so_once(spawn, variable):
    code, out = launch(spawn, "--env-worker", variable)
    assert code != 0, out
    assert "Traceback" not in out, out
    said = lines_with(out, "set BYTEPS_ENABLE_ASYNC and BYTEPS_BACKUP_WORKERS alike on every node")
    workers = [line for line in said if "[kvstore_byteps] configuration error: " in line]
    assert sorted(line.split("]")[0] for line in workers) == ["[worker 0", "[worker 1"], out
    assert len(lines_with("\n".join(said), "[server 0]")) == 1, out


def test_a_worker_with_a_bad_variable_says_so_in_one_line(spawn):
    code, out = launch(spawn, "--env-worker", "BYTEPS_LOG_LEVEL=loud")
    assert code != 0, out
    assert "Traceback" not in out, out
    said = lines_with(out, "configuration error: BYTEPS_LOG_LEVEL='loud' is invalid")
    assert 1 <= len(said) <= 2 and all(line.startswith("[worker ") for line in said), out
