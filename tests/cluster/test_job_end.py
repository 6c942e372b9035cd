"""Jobs run as users run them (``launch.py``), to their end: message loss with PS_RESEND, and
scripts that end with work still queued. What counts is the job's exit status, its output and
how long it took."""
import os
import subprocess
import sys
import time

import pytest
from tests.support.paths import REPO

LAUNCH = os.path.join(REPO, "launch.py")
ENDING = os.path.join(REPO, "tests", "apps", "ending.py")
FAULTS = os.path.join(REPO, "tests", "apps", "faults")

pytestmark = pytest.mark.timeout(150)


def launch(spawn, args, options=(), env=None, timeout=120):
    """Run ``launch.py -n 2 ... python ending.py ARGS``; (returncode, output, seconds)."""
    argv = [sys.executable, LAUNCH, "-n", "2", "--timeout", str(timeout), *options,
            sys.executable, ENDING, *[str(a) for a in args]]
    started = time.monotonic()
    proc = spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                 env=dict(os.environ, **(env or {})), cwd=REPO)
    output, _ = proc.communicate(timeout=timeout + 20)
    return proc.returncode, output, time.monotonic() - started


def assert_clean(code, output, mode):
    assert code == 0, output
    for rank in (0, 1):
        assert "ENDING %s rank %d" % (mode, rank) in output, output
    noise = [line for line in output.splitlines()
             if "Traceback" in line or " ERROR " in line or "Exception ignored" in line]
    assert not noise, output


# -- scripts that end with work in flight ---------------------------------------------------
# Before the store closed ahead of pyzmq's exit handler, such a job hung until the heartbeat
# timeout (set long here, so a hang shows as a failed deadline, not as a slower pass).
LONG_HEARTBEAT = ["--env", "PS_HEARTBEAT_TIMEOUT=90"]


@pytest.mark.parametrize("mode,options", [
    ("pushpull", ["-s", "2"]),
    ("pushpull", ["-s", "2", "--env", "DMLC_PS_VAN_TYPE=byteps_tcp"]),
    ("pushpull", ["-s", "2", "--env", "DMLC_PS_VAN_TYPE=byteps_rdma",
                  "--env", "BYTEPS_RDMA_DEVICE=soft"]),
    ("pushpull", ["-s", "2", "--server", "mxnet"]),
    ("fit", ["-s", "1"]),
], ids=["default-van", "byteps_tcp", "byteps_rdma", "mxnet-servers", "module-fit"])
def test_a_script_ending_with_work_in_flight_completes_it_and_exits_0_in_seconds(
        spawn, mode, options):
    code, output, took = launch(spawn, [mode], options + LONG_HEARTBEAT)
    assert_clean(code, output, mode)
    assert took < 40, "the job took %.0f s:\n%s" % (took, output)


WAITS_FOR_RANK_1 = ("worker rank 1 waits %s while worker rank 0 waits at the servers for its "
                    "push of key 0 partition 0 round ")


@pytest.mark.parametrize("mode,status,said", [
    # rank 1 raises while rank 0 waits for its next push: its shutdown barrier sees rank 0
    # waiting for it (engine/stuck.py) and ends the job, not BYTEPS_REQUEST_TIMEOUT (300 s)
    ("crash", 1, WAITS_FOR_RANK_1 % "in the shutdown barrier"),
    # sys.exit(3): the job ends at once for every node, and its status is the job's (it was 1,
    # after 300 s)
    ("exit", 3, "worker rank 1 (node 11) at 127.0.0.1:"),
    # rank 1's program ends normally, a step early: the others wait for its pushes
    ("early", 1, WAITS_FOR_RANK_1 % "in the shutdown barrier"),
    # rank 1 declares a key more (it waits in that key's barrier; rank 0 pushes): it was a
    # silent wait of 300 s
    ("extra", 1, "worker rank 1 waits declaring key 2 (its key number 3) while worker rank 0 "
                 "waits at the servers for its push of key 0 partition 0 round 0: the workers' "
                 "programs differ"),
], ids=["raises", "sys-exit-3", "ends-early", "declares-more"])
def test_a_worker_that_fails_exits_or_differs_ends_the_job_within_seconds_naming_it(
        spawn, mode, status, said):
    code, output, took = launch(spawn, [mode], ["-s", "1"] + LONG_HEARTBEAT)
    assert code == status, output
    assert said in output, output
    if mode == "exit":
        assert "ended the job: its program exited with status 3 (sys.exit)" in output, output
    # the node that ended the job exits first (the others 1 s after its notice): named
    assert "[launch] worker 1 (on this machine) exited with code %d; stopping all processes" \
        % status in output, output
    assert took < 20, "the job took %.0f s:\n%s" % (took, output)


# -- PS_RESEND under loss ----------------------------------------------------------------------
# auto: byteps_tcp between our nodes (this job's), the same sending path as byteps_tcp alone
@pytest.mark.parametrize("van", ["auto", "zmq", "byteps_rdma"])
def test_lost_acks_never_make_a_resend_read_freed_arrays(spawn, van):
    """30% of ACKs lost. The script pushes 40 MB arrays made fresh every step and drops them at
    once: MXNet frees them when the operation completes, and the allocator unmaps blocks that
    large. A resend made of such an array read unmapped memory: the worker died of SIGSEGV
    every run (before a message kept for resending owned its arrays, and before an answer
    counted as the acknowledgement of its request)."""
    env = {"PYTHONPATH": os.pathsep.join([FAULTS, REPO]), "KVSTORE_TEST_DROP_ACKS": "30"}
    code, output, _ = launch(spawn, ["fresh", 10, 40],
                             ["-s", "2", "--env", "PS_RESEND=1",
                              "--env", "BYTEPS_KEEP_FREED_MEMORY=0",
                              "--env", "DMLC_PS_VAN_TYPE=%s" % van,
                              "--env", "BYTEPS_RDMA_DEVICE=soft"], env=env)
    assert_clean(code, output, "fresh")
    assert output.count("step 10 exact") == 2, output


def test_loss_of_data_and_acks_costs_round_trips_not_seconds(spawn):
    """10% of data messages and 10% of ACKs lost, the retransmission timeout adaptive (the
    default): exact sums, a clean exit, and resends wait about a round trip (PS_RESEND logs
    each measured peer's timeout at shutdown; a backed-off one may still be long), not
    ps-lite's fixed second."""
    env = {"PYTHONPATH": os.pathsep.join([FAULTS, REPO]), "KVSTORE_TEST_DROP_ACKS": "10"}
    code, output, _ = launch(spawn, ["fresh", 30, 4],
                             ["-s", "2", "--env", "PS_RESEND=1", "--env", "PS_DROP_MSG=10",
                              "--env", "BYTEPS_LOG_LEVEL=INFO"], env=env)
    assert_clean(code, output, "fresh")
    summaries = [line for line in output.splitlines() if "PS_RESEND:" in line]
    assert len(summaries) >= 4, output          # the workers and servers resent something
    timeouts = sorted(int(part.split()[-2]) for line in summaries
                      for part in line.split("by peer: ")[1].split(", "))
    assert timeouts and timeouts[len(timeouts) // 2] < 500, summaries


# -- the scheduler lost before the job ends ----------------------------------------------------
def test_workers_whose_scheduler_died_exit_1_with_one_line_and_no_traceback(tmp_path):
    """Started by hand: the scheduler is killed while the workers train; they finish, and
    their shutdown barrier cannot complete. Each must exit 1 within the heartbeat timeout with
    one line saying why (it used to exit 0 after an 'Exception ignored in atexit' traceback)."""
    import signal
    from tests.support.cluster import SCHEDULER_OURS, Cluster, app
    stop = tmp_path / "stop"
    env = {"MXNET_KVSTORE_SERVER": "byteps", "PS_HEARTBEAT_INTERVAL": "1",
           "PS_HEARTBEAT_TIMEOUT": "5"}
    with Cluster(num_workers=2, num_servers=1, env=env) as cluster:
        cluster.start("scheduler", SCHEDULER_OURS)
        cluster.start("server", [sys.executable, "-c", "import mxnet"])
        workers = [cluster.start("worker", app("byteps_checks.py", "until", stop))
                   for _ in range(2)]
        cluster.wait_for("worker1", "round 20")
        os.kill(cluster.procs["scheduler0"][0].pid, signal.SIGKILL)
        killed = time.monotonic()
        stop.write_text("")
        for name in workers:
            cluster.procs[name][0].wait(max(1.0, killed + 30 - time.monotonic()))
        for name in workers:
            code, out = cluster.procs[name][0].returncode, cluster.output(name)
            assert code == 1 and "ROUNDS OK" in out, "%s exited %s:\n%s" % (name, code, out)
            assert out.count("could not leave the job cleanly") == 1, out
            assert "scheduler 1" in out and "is dead" in out, out
            assert "Traceback" not in out and "Exception ignored" not in out, out
