"""BytePS and Horovod scripts as their users launch them: launch.py, and bpslaunch on one host or
by role. The checks themselves run inside the workers (tests/apps/dropin_checks.py)."""
import os
import subprocess
import sys

import pytest

from tests.support.paths import APPS, REPO
from tests.support.procs import free_port

pytestmark = pytest.mark.timeout(150)

CHECKS = os.path.join(APPS, "dropin_checks.py")
LAUNCH = os.path.join(REPO, "launch.py")
BPSLAUNCH = [sys.executable, "-m", "kvstore_byteps.launcher.bpslaunch"]
TIMEOUT = 100


def run(spawn, argv, env):
    """(returncode, output) of ``argv`` with ``env`` added, bounded by TIMEOUT."""
    proc = spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                 env=dict(os.environ, PYTHONPATH=REPO, BYTEPS_START_TIMEOUT="40", **env),
                 cwd=REPO)
    try:
        output, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        raise AssertionError("no exit within %d s:\n%s" % (TIMEOUT, output))
    return proc.returncode, output


def assert_ok(code, output, marker, processes):
    assert code == 0, output
    assert output.count(marker) == processes, output
    noise = [line for line in output.splitlines()
             if "Traceback" in line or " ERROR " in line or "Exception ignored" in line]
    assert not noise, output


@pytest.mark.parametrize("van", ["zmq", "byteps_tcp"])
def test_byteps_api_sums_broadcasts_and_pairs_names_in_any_order(spawn, van):
    code, output = run(spawn, [sys.executable, LAUNCH, "-n", "3", "-s", "2", "--timeout",
                               str(TIMEOUT - 10), sys.executable, CHECKS, "bps"],
                       {"DMLC_PS_VAN_TYPE": van})
    assert_ok(code, output, "BPS OK", 3)


def test_horovod_api_on_one_host_with_bpslaunch_two_processes(spawn):
    """``bpslaunch python train.py`` on one machine: scheduler, server and one process per
    local device (BYTEPS_LOCAL_SIZE=2) started by bpslaunch itself."""
    code, output = run(spawn, BPSLAUNCH + [sys.executable, CHECKS, "hvd"],
                       {"BYTEPS_LOCAL_SIZE": "2", "DMLC_ROLE": "", "DMLC_NUM_WORKER": ""})
    assert_ok(code, output, "HVD OK", 2)
    assert ("[bpslaunch] worker (DMLC_ROLE unset): worker host 0 of 1: 2 processes, ranks 0-1 "
            "of 2, with a scheduler and a server on this machine") in output, output
    assert "dist_byteps: 1 worker," in output, output      # local rank 1 reduced through 0


def test_two_hosts_of_two_processes_train_like_one_process_with_one_flow_per_host(spawn):
    """Scheduler, server and two worker hosts each started with ``bpslaunch`` as BytePS's users
    do, every worker host running 2 processes: local rank 0 is the host's only worker in the
    cluster (2 workers, 4 processes), DistributedTrainer equals one process on the union batch
    (so 4 single-process workers too), and the scripts end without ``shutdown()``."""
    env = {"DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "1", "DMLC_PS_ROOT_URI": "127.0.0.1",
           "DMLC_PS_ROOT_PORT": str(free_port()), "DMLC_NODE_HOST": "127.0.0.1",
           "BYTEPS_LOCAL_SIZE": "2"}
    quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    node = dict(os.environ, PYTHONPATH=REPO, BYTEPS_START_TIMEOUT="40", **env)
    others = [spawn(BPSLAUNCH, env=dict(node, DMLC_ROLE=role), **quiet)
              for role in ("scheduler", "server")]
    others.append(spawn(BPSLAUNCH + [sys.executable, CHECKS, "bps-train"], **quiet,
                        env=dict(node, DMLC_ROLE="worker", DMLC_WORKER_ID="1")))
    code, output = run(spawn, BPSLAUNCH + [sys.executable, CHECKS, "bps-train"],
                       dict(env, DMLC_ROLE="worker", DMLC_WORKER_ID="0"))
    assert_ok(code, output, "BPS TRAIN OK", 2)
    assert "dist_byteps: 2 workers" in output, output
    for proc in others:
        assert proc.wait(timeout=30) == 0


LONG_TRAIN = os.path.join(APPS, "bps_long_train.py")


def test_every_role_under_bpslaunch_outlives_the_grace_with_local_groups(spawn, tmp_path):
    """BytePS's documented launch, every role under ``bpslaunch``: a scheduler, two servers
    and two worker hosts (127.0.0.1, DMLC_WORKER_ID 0 and 1) of two processes each, training
    well past the launcher's grace (``--grace 2``). The scheduler's and servers' bpslaunch
    started no workers, so the grace is not theirs to apply: all five exit 0 and the four
    processes end with the same weights."""
    env = dict(os.environ, PYTHONPATH=REPO, BYTEPS_START_TIMEOUT="40", DMLC_NUM_WORKER="2",
               DMLC_NUM_SERVER="2", DMLC_PS_ROOT_URI="127.0.0.1",
               DMLC_PS_ROOT_PORT=str(free_port()), DMLC_NODE_HOST="127.0.0.1")
    roles = [("scheduler", {}, []), ("server", {}, []), ("server", {}, [])]
    roles += [("worker", {"DMLC_WORKER_ID": str(host), "BYTEPS_LOCAL_SIZE": "2"},
               [sys.executable, LONG_TRAIN, "6"]) for host in (0, 1)]
    nodes = []
    for index, (role, extra, command) in enumerate(roles):
        log = open(tmp_path / ("%d-%s.log" % (index, role)), "w+")
        nodes.append((spawn(BPSLAUNCH + ["--grace", "2"] + command, stdout=log,
                            stderr=subprocess.STDOUT, cwd=REPO,
                            env=dict(env, DMLC_ROLE=role, **extra)), log))
    outputs = []
    for proc, log in nodes:
        try:
            code = proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            code = None
        log.seek(0)
        outputs.append((code, log.read()))
    everything = "\n\n".join(out for _, out in outputs)
    assert [code for code, _ in outputs] == [0] * 5, everything
    assert "did not exit within" not in everything, everything
    finals = sorted(line.split("] ", 1)[1] for line in everything.splitlines()
                    if " PARAMS " in line)
    assert [line.split(" STEPS")[0] for line in finals] == [
        "RANK %d/4 LOCAL %d/2" % (rank, rank % 2) for rank in range(4)], everything
    assert len({line.split(" STEPS ")[1] for line in finals}) == 1, finals


LOCAL_RANKS = os.path.join(APPS, "local_ranks.py")


def launch_local(spawn, mode, *options, workers=4):
    return run(spawn, [sys.executable, LAUNCH, "-n", str(workers), "-s", "1", "--timeout",
                       str(TIMEOUT - 10)] + list(options) + [sys.executable, LOCAL_RANKS, mode],
               {})


def lines_of(output, marker):
    return sorted(line.split("] ", 1)[1] for line in output.splitlines()
                  if line.split("] ", 1)[-1].startswith(marker))


def test_launch_n4_on_one_host_gives_each_process_its_local_rank(spawn):
    """``launch.py -n 4`` on one machine: the Horovod API's local_rank() is 0-3 of
    local_size() 4 (so ``mx.gpu(hvd.local_rank())`` picks four devices), and a plain
    dist_byteps script still sees MXNet's meaning: kv.rank 0-3 of num_workers 4."""
    code, output = launch_local(spawn, "hvd")
    assert code == 0, output
    assert lines_of(output, "HVD ") == ["HVD rank %d size 4 local_rank %d local_size 4"
                                        % (rank, rank) for rank in range(4)], output
    code, output = launch_local(spawn, "kv")
    assert code == 0, output
    assert lines_of(output, "KV ") == ["KV rank %d num_workers 4" % r for r in range(4)], output


def test_launch_local_groups_is_one_worker_host_of_four_processes(spawn):
    """``--local-groups``: as bpslaunch, the host is one worker of the cluster whose local
    rank 0 reduces for all four processes; a script's own dist_byteps store on local rank 1
    is refused with a message saying what to do."""
    code, output = launch_local(spawn, "hvd", "--local-groups")
    assert code == 0, output
    assert lines_of(output, "HVD ") == ["HVD rank %d size 4 local_rank %d local_size 4"
                                        % (rank, rank) for rank in range(4)], output
    assert "dist_byteps: 1 worker," in output, output
    assert "1 worker host x 4 processes = 4 processes (size())" in output, output
    code, output = launch_local(spawn, "kv", "--local-groups", workers=2)
    assert code != 0, output
    assert [line for line in output.splitlines() if line.startswith("[worker 1] ")
            and "BYTEPS_LOCAL_RANK=1 of a local group" in line], output
    assert "(launch.py) without --local-groups" in output, output
