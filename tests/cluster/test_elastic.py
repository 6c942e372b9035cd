"""Elastic workers (``launch.py --min-workers N``, BYTEPS_MIN_WORKERS) on real processes: the
digits demo, 4 workers x 2 servers, one worker killed with SIGKILL mid-epoch (after its
backward pass, before its push: tests/apps/elastic_demo.py). The others finish, exit 0 and
hold identical parameters (the demo checks that through the store and fails otherwise), with
the servers' optimizer and with the updates on the workers, where rank 0 dies (its parts,
initialising keys and stopping the servers, fall to the lowest rank left). The launcher's
supervision on stand-in processes: a worker killed by a signal leaves, one that exits with a
status of its own ends the job, and so does the loss of more workers than the minimum allows
(the demo's job with two of four killed under --min-workers 3 ends with 137 naming both: run
by hand; the scheduler's side is unit-tested). With --max-restarts 1 the killed worker starts
again and takes its place back at the others' next commit: the demo (the servers' weights, or
rank 1's hand-over where the workers update), a BytePS-style DistributedTrainer
(tests/apps/elastic_collective.py) and Module.fit (tests/apps/elastic_module.py) end with
four identical workers; the launcher restarts at most K times, counts a restarted worker's
failure and exit status 75 (taken for lost while it lived on) as losses, and stops restarted
workers that had not joined when the others finished. With --max-workers 5 a fifth worker
started by the command the launcher prints joins the running job (the demo, a Horovod-style
trainer): five identical workers. Parts without a network: tests/unit/test_elastic.py,
test_elastic_joins.py, test_elastic_grow.py, test_handover.py."""
import io
import os
import re
import subprocess
import sys

import pytest

from kvstore_byteps.config import Role
from kvstore_byteps.launcher.job import Job
from kvstore_byteps.launcher.plan import ProcSpec
from tests.support.cluster import APPS
from tests.support.paths import REPO
from tests.support.demo import LAUNCH

pytestmark = pytest.mark.timeout(150)

#: over ZeroMQ a lost worker is noticed within the heartbeat timeout (the default 30 s is for
#: real jobs); over byteps_tcp (the default van's link between our nodes) at once, when its
#: connection to the scheduler closes
HEARTBEATS = ["--env", "PS_HEARTBEAT_INTERVAL=1", "--env", "PS_HEARTBEAT_TIMEOUT=4"]


def elastic_demo(spawn, kill_ranks, kill_step, *options, epochs=4, env=None):
    argv = [sys.executable, LAUNCH, "-n", "4", "-s", "2", "--min-workers", "3",
            "--timeout", "120", *options, sys.executable,
            "%s/elastic_demo.py" % APPS, kill_ranks, str(kill_step), "--epochs", str(epochs)]
    proc = spawn(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                 text=True)
    out, _ = proc.communicate(timeout=140)
    return proc.returncode, out


@pytest.mark.parametrize("kill_rank,kill_step,options,noticed", [
    # (rank 2 killed mid-epoch, the servers' optimizer and the default van: the restart test
    # below, which sees it leave first)
    # before its first step: the others initialise the keys after it left (a key made after
    # a departure waited for its pushes, a helper found: the job hung)
    (1, 1, (), "its connection to the scheduler closed"),
    # the workers update, rank 0 dies; ZeroMQ: the heartbeats tell
    (0, 25, ("--env", "MXNET_UPDATE_ON_KVSTORE=0", "--env", "DMLC_PS_VAN_TYPE=zmq",
             *HEARTBEATS), "no heartbeat for"),
], ids=["first-step-rank1", "workers-update-rank0-zmq"])
def test_the_others_finish_with_identical_parameters_when_a_worker_is_killed(
        spawn, kill_rank, kill_step, options, noticed):
    status, out = elastic_demo(spawn, str(kill_rank), kill_step, *options)
    assert status == 0, out
    assert ("[launch] worker %d was killed by SIGKILL; the job goes on with 3 of 4 workers "
            "(--min-workers 3)" % kill_rank) in out
    assert re.search(r"worker rank %d \(node \d+\) at \S+ left the job \(%s"
                     % (kill_rank, noticed), out), out
    # every worker compared its parameters with the others' (a difference raises, and a
    # raising worker ends the job for everyone); rank 0 prints the demo's lines
    if kill_rank != 0:
        # (kv.num_workers follows the membership: three now)
        assert out.count("parameters identical on all 3 workers") == 1, out
        accuracy = float(re.search(r"final test accuracy (\S+)", out).group(1))
        assert accuracy > 0.85, out


@pytest.mark.parametrize("kill_rank,options", [
    (2, ()),                                                    # the servers hold the weights
    (0, ("--env", "MXNET_UPDATE_ON_KVSTORE=0")),    # rank 1 hands them over (and the buckets)
], ids=["servers-update-rank2", "workers-update-rank0"])
def test_a_killed_worker_restarts_and_takes_its_place_back(spawn, kill_rank, options,
                                                          tmp_path):
    """launch.py --max-restarts 1: a worker killed mid-epoch starts again, joins at the
    others' next commit (the demo's State.commit() after every step) and the job ends with
    four workers holding identical parameters (momentum too, where the workers update). (The
    others hold their end until it asks, join_hold.py: under load its start may take longer
    than their training.)"""
    status, out = elastic_demo(spawn, str(kill_rank), 25, "--max-restarts", "1", *options,
                               epochs=20, env=held(tmp_path))
    assert status == 0, out
    # it left at once (its connection closed), the job went on, then it came back
    assert re.search(r"worker rank %d \(node \d+\) at \S+ left the job \(its connection to "
                     r"the scheduler closed" % kill_rank, out), out
    assert ("[launch] worker %d was killed by SIGKILL; restarting it (restart 1 of 1)"
            % kill_rank in out), out
    joined = re.search(r"joined the job at the other workers' commit (\d+) .* after asking, "
                       r"(\S+) s after this process started", out)
    # (killed in its third epoch, two commits made: it joins at a later one)
    assert joined and int(joined.group(1)) > 2 and float(joined.group(2)) < 30, out
    assert out.count("parameters identical on all 4 workers") == 1, out


@pytest.mark.parametrize("style,defer", [("bps", "1")])     # ("hvd", "0"): run by hand
def test_a_collective_style_worker_restarts_and_takes_its_place_back(spawn, style, defer,
                                                                     tmp_path):
    """BytePS's (and Horovod's) DistributedTrainer (the workers update, with momentum): rank
    1 killed at step 50 restarts, skips the start-up broadcasts, takes rank 0's parameters
    and optimizer state at the others' next commit (its first forward pass, deferred, still
    computes on its initial weights: its first step pushes zeros); all four end with the same
    parameters."""
    env = dict(held(tmp_path), STYLE=style, DEFER=defer, KILL_STEP="50", KILL_RANK="1",
               STEPS="500")
    same_parameters(restarted_job(spawn, "elastic_collective.py", env), 4, late="1")


def held(tmp_path):
    """The environment in which the test apps' workers hold their last commits until a late
    worker asks to join (tests/apps/join_hold.py)."""
    return dict(os.environ, HOLD_FOR_JOIN=str(tmp_path / "asked"))


def restarted_job(spawn, app, env):
    """``launch.py -n 4 -s 2 --min-workers 3 --max-restarts 1`` running tests/apps/``app``:
    its output, once it exited 0."""
    argv = [sys.executable, LAUNCH, "-n", "4", "-s", "2", "--min-workers", "3",
            "--max-restarts", "1", "--timeout", "120", sys.executable, "%s/%s" % (APPS, app)]
    proc = spawn(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                 text=True)
    out, _ = proc.communicate(timeout=140)
    assert proc.returncode == 0, out
    return out


def same_parameters(out, workers, late):
    """Every worker printed the same DIGEST of its parameters, rank ``late`` as joined late."""
    digests = re.findall(r"DIGEST (\d) (\w+) joined_late=(\w+)", out)
    assert sorted(rank for rank, _, _ in digests) == [str(r) for r in range(workers)], out
    assert len({digest for _, digest, _ in digests}) == 1, out
    assert [rank for rank, _, joined in digests if joined == "True"] == [late], out


def stand_in(role, rank, how=None):
    """A node that exits 0 after a while (workers first, one after the other), or as ``how``
    says: ``kill`` (SIGKILL), ``kill-once`` (SIGKILL unless it was restarted), ``linger`` (a
    restarted one sleeps a minute), ``fail-restarted`` (killed, then restarted exits 3),
    ``left-once`` (exits EXIT_LEFT, as one taken for lost while it lived on, unless restarted)
    or a status."""
    delay = {Role.SCHEDULER: 1.0, Role.SERVER: 1.0, Role.WORKER: 0.1 + 0.2 * rank}[role]
    restarted = "os.environ.get('BYTEPS_RESTART_COUNT')"
    end = {"kill": "os.kill(os.getpid(), signal.SIGKILL)",
           "kill-once": "%s or os.kill(os.getpid(), signal.SIGKILL)" % restarted,
           "linger": "time.sleep(60 if %s else 0); os.kill(os.getpid(), signal.SIGKILL)"
                     % restarted,
           "fail-restarted": "sys.exit(3) if %s else os.kill(os.getpid(), signal.SIGKILL)"
                             % restarted,
           "left-once": "sys.exit(0 if %s else 75)" % restarted}.get(how)
    end = end or "sys.exit(%d)" % (how or 0)
    argv = (sys.executable, "-c", "import os, signal, sys, time; time.sleep(%g); %s"
            % (delay, end))
    return ProcSpec(role=role, rank=rank if role is not Role.SCHEDULER else None, argv=argv,
                    env={})


def job(workers, log, restarts=0):
    return Job([stand_in(Role.SCHEDULER, 0), stand_in(Role.SERVER, 0)] + [
        stand_in(Role.WORKER, r, how) for r, how in enumerate(workers)], min_workers=2, log=log,
        max_restarts=restarts)


def test_the_launcher_restarts_a_lost_worker_at_most_k_times():
    log = io.StringIO()
    assert job([None, "kill-once", None], log, restarts=1).run() == 0
    assert ("worker 1 was killed by SIGKILL; restarting it (restart 1 of 1)"
            in log.getvalue()), log.getvalue()
    log = io.StringIO()          # killed again: no restart left, the job goes on without it
    assert job([None, "kill", None], log, restarts=1).run() == 0
    assert "not restarted: --max-restarts 1 used up" in log.getvalue()
    assert "the job goes on with 2 of 3 workers" in log.getvalue(), log.getvalue()
    log = io.StringIO()          # a restarted worker that fails leaves again: the job goes on
    assert job([None, "fail-restarted", None], log, restarts=1).run() == 0
    assert "worker 1 exited with code 3; not restarted" in log.getvalue(), log.getvalue()
    log = io.StringIO()          # one the job took for lost while it lived on (a stall, a link
    assert job([None, "left-once", None], log, restarts=1).run() == 0      # down) restarts
    assert ("worker 1 exited with code 75 (the job took it for lost: it left); restarting it"
            in log.getvalue()), log.getvalue()
    # a second loss while the restarted worker has not joined (it said nothing yet) is below
    # the minimum, as the scheduler counts it: the job ends with the loss, not restarting it
    log = io.StringIO()
    assert job([None, "linger", "kill"], log, restarts=1).run() == 137
    assert ("worker 2 was killed by SIGKILL: 1 of 3 workers left, fewer than --min-workers 2 "
            "(restarted, not joined yet: worker 1)" in log.getvalue()), log.getvalue()
    # a restarted worker still running once the others finished had not joined: stopped
    log = io.StringIO()
    assert job([None, "linger", None], log, restarts=1).run() == 0
    assert ("worker 1: restarted, had not joined when the other workers finished the job; "
            "stopping it" in log.getvalue()), log.getvalue()


def test_the_launcher_lets_lost_workers_leave_until_too_few_are_left():
    log = io.StringIO()
    assert job([None, "kill", None], log).run() == 0
    assert ("worker 1 was killed by SIGKILL; the job goes on with 2 of 3 workers "
            "(--min-workers 2)" in log.getvalue()), log.getvalue()
    log = io.StringIO()
    assert job([None, "kill", "kill"], log).run() == 137
    assert ("worker 1 was killed by SIGKILL, worker 2 was killed by SIGKILL: 1 of 3 workers "
            "left, fewer than --min-workers 2" in log.getvalue()), log.getvalue()
    # a status the program chose (sys.exit, an uncaught error) ends the job as it always did
    log = io.StringIO()
    assert job([None, 3, None], log).run() == 3
    assert "worker 1 (on this machine) exited with code 3; stopping all" in log.getvalue()


def grow(spawn, program, env, started, fifth_within=30):
    """launch.py -n 4 --max-workers 5 runs ``program``; once its output has a line with
    ``started``, a fifth worker starts by the command the launcher printed, and must end
    within ``fifth_within`` s of the job. Returns (the launcher's status and output, the
    fifth's status and output)."""
    argv = [sys.executable, LAUNCH, "-n", "4", "-s", "2", "--min-workers", "3",
            "--max-workers", "5", "--timeout", "120", sys.executable, *program]
    proc = spawn(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                 text=True)
    seen, command, fifth = [], None, None
    for line in proc.stdout:            # (the launcher's --timeout bounds it)
        seen.append(line)
        if "start one more" in line:
            command = line.split("with: ", 1)[1].strip()
        if command and fifth is None and started in line:
            fifth = spawn(["bash", "-c", command], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    proc.wait(timeout=30)
    assert fifth is not None, "".join(seen)
    fifth_out, _ = fifth.communicate(timeout=fifth_within)
    return proc.returncode, "".join(seen), fifth.returncode, fifth_out


def test_a_fifth_worker_started_by_hand_joins_a_running_job_and_trains(spawn, tmp_path):
    """launch.py --max-workers 5: the demo (the servers update) with 4 workers; a fifth
    started after the first epoch by the command the launcher printed takes rank 4, joins at
    the others' next commit, trains a shard of its own and ends with the others: five
    identical workers, kv.num_workers 5, the rounds still scaled to 4 workers. (The demo
    unchanged but for the others' hold of their end until it asks, join_hold.py.)"""
    status, out, fifth_status, fifth_out = grow(
        spawn, ["%s/elastic_demo.py" % APPS, "none", "0", "--epochs", "20"], held(tmp_path),
        "] [digits] epoch 1/20")
    assert status == 0 and fifth_status == 0, out + fifth_out
    assert "worker rank 4 takes a new seat (the job grows to BYTEPS_MAX_WORKERS=5" in fifth_out
    assert re.search(r"joined the job at the other workers' commit \d+", fifth_out), fifth_out
    assert out.count("parameters identical on all 5 workers") == 1, out
    assert float(re.search(r"final test accuracy (\S+)", out).group(1)) > 0.85, out


def test_a_collective_style_fifth_worker_joins_with_the_others_parameters(spawn, tmp_path):
    """Horovod's DistributedTrainer (the workers update, with momentum; averages divide by
    the job's 4 workers on every worker): a fifth joins with rank 0's parameters and
    optimizer state; all five end with the same parameters."""
    env = dict(held(tmp_path), STYLE="hvd", STEPS="400")
    status, out, fifth_status, fifth_out = grow(
        spawn, ["%s/elastic_collective.py" % APPS], env, "[kvstore_byteps] dist_byteps:")
    assert status == 0 and fifth_status == 0, out + fifth_out
    same_parameters(out + fifth_out, 5, late="4")


@pytest.mark.parametrize("pause", ["0", "3"], ids=["asking", "setting-up"])
def test_a_fifth_worker_that_has_not_joined_when_the_others_finish_is_told_at_once(
        spawn, tmp_path, pause):
    """The others finish before the fifth joins (under load its start took longer than their
    training, and it asked to join for 30 s, then exited 1 blaming its link): the scheduler
    tells it when they pass their shutdown barrier; it ends, exit 0, saying why, whether
    it was asking to join or (told before its State() starts) setting up its trainer (a
    new user's run said the keys were initialised in different orders)."""
    env = dict(os.environ, STEPS="30", HOLD_END_FOR=str(tmp_path / "asking"),
               HOLD_END_PAUSE=pause)
    status, out, fifth_status, fifth_out = grow(
        spawn, ["%s/elastic_collective.py" % APPS], env, "[kvstore_byteps] dist_byteps:", 10)
    assert status == 0 and fifth_status == 0, out + fifth_out
    assert ("the other workers finished the job before worker rank 4 joined it"
            in fifth_out), fifth_out
    assert "this worker ends without training" in fifth_out, fifth_out
    assert "DIGEST 4" not in fifth_out and "heard nothing" not in fifth_out, fifth_out
    assert "Traceback" not in fifth_out and "same order" not in fifth_out, fifth_out
    assert out.count("DIGEST") == 4, out


def test_a_module_fit_worker_restarts_and_takes_its_place_back(spawn, tmp_path):
    """MXNet's Module.fit (the servers update, with momentum): State(kv, epoch=0) before fit,
    committed by its epoch_end_callback, fit resumed at begin_epoch=state.epoch. Rank 2,
    killed mid-epoch 3, restarts and joins at the others' next epoch end; all four end with
    the same parameters."""
    env = dict(held(tmp_path), KILL_EPOCH="3", EPOCHS="30")
    same_parameters(restarted_job(spawn, "elastic_module.py", env), 4, late="2")
