"""The digits demo under the engines users start jobs with: a real Slurm (slurmctld + slurmd on
127.0.0.1, started for this module) and Open MPI's mpirun.

Each run must give byte for byte the parameters of the local launcher, exit 0 and leave nothing
running (no Slurm job or step, no process of the job); too few tasks stop at once with one line;
a worker that fails fails the job with its exit status, naming it. Needs root and Debian's
slurm-wlm + munge / openmpi-bin (.ci/run installs them when it runs as root); skipped with the
reason otherwise.
"""
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from kvstore_byteps.launcher import netns
from tests.support import slurm_cluster
from tests.support.demo import DEMO, LAUNCH
from tests.support.netns_support import SshCluster, requires_netns, sshd_unavailable_reason
from tests.support.paths import REPO
from tests.support.procs import descendants

NODE_MODULE = "kvstore_byteps.launcher.node"
EPOCHS = 2
JOB_TIMEOUT_S = 150
#: the environment every demo run gets (as tests/support/demo.py's run_demo)
TIMEOUTS = ("BYTEPS_START_TIMEOUT=60", "BYTEPS_REQUEST_TIMEOUT=90")

requires_slurm = pytest.mark.skipif(slurm_cluster.missing() is not None,
                                    reason="no private Slurm: %s" % slurm_cluster.missing())
requires_mpi = pytest.mark.skipif(shutil.which("mpirun") is None,
                                  reason="mpirun not installed: apt-get install openmpi-bin")


@pytest.fixture
def local_params(demo_reference):
    """2 workers x 2 servers (the shared reference run)."""
    return demo_reference.params


@pytest.fixture
def slurm_hosts(tmp_path_factory):
    """A Slurm of three machines: node kvb<i> on host i of an emulated network (198.18.0.<i+1>).
    Per test: a process has one emulated network at a time (its names carry the pid)."""
    with netns.EmulatedNetwork(3) as net:
        cluster = slurm_cluster.SlurmCluster(tmp_path_factory.mktemp("slurm-hosts"), net)
        yield cluster
        cluster.stop()


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    cluster = slurm_cluster.SlurmCluster(tmp_path_factory.mktemp("slurm"))
    yield cluster
    cluster.stop()


def _demo_args(params):
    return [sys.executable, DEMO, "--epochs", str(EPOCHS), "--save-params", str(params)]


def _launch_args(launcher, workers=2, servers=2):
    argv = [sys.executable, LAUNCH, "--launcher", launcher, "-n", str(workers), "-s",
            str(servers), "--timeout", str(JOB_TIMEOUT_S)]
    for setting in TIMEOUTS:
        argv += ["--env", setting]
    return argv


def _run(argv, env=None, timeout=JOB_TIMEOUT_S + 30):
    done = subprocess.run(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, start_new_session=True)
    return done.returncode, done.stdout


def _job_processes(marker):
    """Pids of live processes whose environment holds ``marker`` (our SLURM_CONF, a port)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as f:
                environ = f.read()
            with open("/proc/%s/stat" % entry) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in environ and state != "Z":
            found.append(int(entry))
    return found


def _assert_nothing_left(slurm):
    """No Slurm job or step, and of the processes started with our SLURM_CONF only the daemons."""
    deadline = time.monotonic() + 15
    while True:
        daemons = {p.pid for p in slurm.procs}  # and their helpers (slurmctld's slurmscriptd)
        daemons.update(*(descendants(pid) for pid in list(daemons)))
        jobs, left = slurm.jobs(), set(_job_processes("SLURM_CONF=" + slurm.conf)) - daemons
        if not jobs and not left:
            return
        if time.monotonic() > deadline:
            pytest.fail("left running: jobs %s, processes %s" % (jobs, sorted(left)))
        time.sleep(0.2)


def test_a_failing_node_names_itself():
    # A worker whose command exits 3 says so, and the exit status is its.
    environ = {"PMI_RANK": "2", "PMI_SIZE": "3", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "kvstore_byteps.launcher.node", "-s", "1",
                           "--root-uri", "127.0.0.1", "--port", "1", "--node-host", "127.0.0.1",
                           "--", sys.executable, "-c", "print('hi'); raise SystemExit(3)"],
                          env=environ, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    assert done.stdout == "[worker 0] hi\n"
    assert done.stderr == ("[kvstore-byteps-node] worker 0 (MPICH rank 2 of 3, on 127.0.0.1) "
                           "exited with code 3\n")


# ------------------------------------------------------------------------------------ Slurm
@requires_slurm
@pytest.mark.timeout(240)
def test_launcher_slurm_inside_salloc_trains_as_the_local_launcher(slurm, local_params, tmp_path):
    params = tmp_path / "slurm.params"
    code, out = _run(["salloc", "-n", "5"] + _launch_args("slurm") + _demo_args(params),
                     env=slurm.env)
    assert code == 0, out
    assert "[launch] Slurm job" in out and "5 tasks on %s" % slurm_cluster.NODE in out, out
    assert params.read_bytes() == local_params
    _assert_nothing_left(slurm)


@requires_slurm
@pytest.mark.timeout(240)
def test_srun_tasks_take_their_roles_from_their_ranks(slurm, local_params, tmp_path):
    params = tmp_path / "srun.params"
    argv = ["srun", "-n", "5", "--kill-on-bad-exit=1", sys.executable, "-m", NODE_MODULE,
            "-s", "2"] + ["--env=" + s for s in TIMEOUTS] + ["--"] + _demo_args(params)
    code, out = _run(argv, env=slurm.env)
    assert code == 0, out
    assert "[kvstore-byteps-node] Slurm rank 0 of 5: the scheduler" in out, out
    assert "[worker 0] [digits] final test accuracy" in out, out
    assert params.read_bytes() == local_params
    _assert_nothing_left(slurm)


@requires_slurm
@pytest.mark.timeout(120)
def test_too_few_tasks_stop_at_once_with_one_line(slurm):
    started = time.monotonic()
    code, out = _run(["salloc", "-n", "3"] + _launch_args("slurm") + ["true"], env=slurm.env)
    assert code == 127, out
    said = [line for line in out.splitlines() if line.startswith("[launch]")]
    assert said == ["[launch] Slurm job %s has 3 tasks; 1 scheduler + 2 servers + 2 workers "
                    "need 5 (salloc -n 5, or #SBATCH --ntasks=5)" % said[0].split()[3]], out

    code, out = _run(["srun", "-n", "3", sys.executable, "-m", NODE_MODULE, "-s", "2", "true"],
                     env=slurm.env)
    assert code == 2, out
    said = [line for line in out.splitlines() if line.startswith("[kvstore-byteps-node]")]
    assert said == ["[kvstore-byteps-node] Slurm started 3 processes; 1 scheduler + 2 servers "
                    "+ at least 1 worker need at least 4 (srun -n / mpirun -np)"], out
    assert time.monotonic() - started < 60
    _assert_nothing_left(slurm)


@requires_slurm
@pytest.mark.timeout(120)
def test_a_failing_worker_fails_the_slurm_job_naming_it(slurm):
    code, out = _run(["salloc", "-n", "4"] + _launch_args("slurm", workers=1) +
                     ["bash", "-c", "sleep 1; exit 3"], env=slurm.env)
    assert code == 3, out
    said = ("[launch] worker 0 (on Slurm node %s) exited with code 3; stopping all processes"
            % slurm_cluster.NODE)
    assert said in out, out
    _assert_nothing_left(slurm)


ENDING = os.path.join(REPO, "tests", "apps", "ending.py")
#: what srun and slurmstepd print when the launcher has to cancel a node's step
SLURM_NOISE = ("slurmstepd", "CANCELLED", "task 0: Killed", "Exited with exit code 143")


@requires_slurm
@pytest.mark.timeout(180)
def test_a_worker_that_calls_sys_exit_3_ends_the_slurm_job_with_3_in_both_forms(slurm):
    # the job ends at once for every node (the worker's status is the job's): srun needs no
    # --kill-on-bad-exit to pass it on, and the launcher's stop cancels no step
    code, out = _run(["salloc", "-n", "4"] + _launch_args("slurm", servers=1) +
                     [sys.executable, ENDING, "exit"], env=slurm.env, timeout=90)
    assert code == 3, out
    assert ("[launch] worker 1 (on Slurm node %s) exited with code 3; stopping all processes"
            % slurm_cluster.NODE) in out, out
    assert not [line for line in out.splitlines() if any(n in line for n in SLURM_NOISE)], out
    code, out = _run(["srun", "-n", "4", sys.executable, "-m", NODE_MODULE, "-s", "1",
                      "--", sys.executable, ENDING, "exit"], env=slurm.env, timeout=90)
    assert code == 3, out
    assert "[kvstore-byteps-node] worker 1 (Slurm rank 3 of 4, on 127.0.0.1) exited with " \
           "code 3" in out, out
    assert out.count("exited with code 3") == 4, out          # every node, with its status
    _assert_nothing_left(slurm)


def _ctrl_c_after(argv, env, ready_text, timeout=90):
    """Run ``argv`` in a terminal of its own, press Ctrl-C once ``ready_text`` was printed;
    ``(exit status, output)``."""
    import pty
    import select
    pid, fd = pty.fork()
    if pid == 0:               # the child: argv in the terminal's foreground group
        try:
            os.chdir(REPO)
            os.execvpe(argv[0], argv, env)
        finally:
            os._exit(127)
    out, pressed, deadline = b"", False, time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not pressed and ready_text.encode() in out:
                os.write(fd, b"\x03")
                pressed = True
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    data = os.read(fd, 65536)
                except OSError:
                    data = b""
                if not data:
                    break
                out += data
    finally:
        done, status = os.waitpid(pid, os.WNOHANG)
        if not done:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
        os.close(fd)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


@requires_slurm
@pytest.mark.timeout(180)
def test_ctrl_c_to_a_job_under_salloc_exits_130_quietly_leaving_nothing(slurm):
    argv = (["salloc", "-n", "4"] + _launch_args("slurm", workers=2, servers=1) +
            [sys.executable, DEMO, "--epochs", "100000"])
    code, out = _ctrl_c_after(argv, slurm.env, "epoch 2/")
    assert code == 130, out
    # (the terminal echoes the ^C before the launcher's line)
    stopped = out.split("[launch] received SIGINT; stopping all processes")
    assert len(stopped) == 2 and "[launch]" not in stopped[1], out
    assert not [line for line in out.splitlines() if any(n in line for n in SLURM_NOISE)], out
    _assert_nothing_left(slurm)


@requires_slurm
@requires_netns
@pytest.mark.timeout(300)
def test_slurm_jobs_span_several_hosts(slurm_hosts, local_params, tmp_path):
    # Two workers (three would sum in arrival order, and floating-point sums of three depend
    # on it) on three hosts with the two servers and the scheduler.
    params = tmp_path / "salloc.params"
    code, out = _run(slurm_hosts.client + ["salloc", "-N", "3", "-n", "5"] +
                     _launch_args("slurm") + _demo_args(params), env=slurm_hosts.env)
    assert code == 0, out
    # placed as over ssh: servers, then workers round-robin; the scheduler on the first node
    assert ("5 tasks on kvb0,kvb1,kvb2; scheduler on 198.18.0.1:" in out and
            "198.18.0.1: scheduler, server 0, worker 1; 198.18.0.2: server 1; "
            "198.18.0.3: worker 0" in out), out
    assert params.read_bytes() == local_params

    params = tmp_path / "srun.params"
    argv = ["srun", "-N", "3", "-n", "5", "--kill-on-bad-exit=1", sys.executable, "-m",
            NODE_MODULE, "-s", "2"] + ["--env=" + s for s in TIMEOUTS] + ["--"] + _demo_args(params)
    code, out = _run(slurm_hosts.client + argv, env=slurm_hosts.env)
    assert code == 0, out
    assert "Slurm rank 0 of 5: the scheduler, at 198.18.0.1:" in out, out
    assert params.read_bytes() == local_params
    _assert_nothing_left(slurm_hosts)


# -------------------------------------------------------------------------------------- MPI
@requires_mpi
@pytest.mark.timeout(240)
def test_launcher_mpi_trains_as_the_local_launcher(local_params, tmp_path):
    params = tmp_path / "mpi.params"
    code, out = _run(_launch_args("mpi") + _demo_args(params))
    assert code == 0, out
    assert "[launch] Open MPI: 5 ranks" in out, out
    assert "[worker 0] [digits] final test accuracy" in out, out
    assert params.read_bytes() == local_params
    marker = "DMLC_PS_ROOT_PORT=%s" % out.split("scheduler on 127.0.0.1:")[1].split(",")[0]
    assert _job_processes(marker) == []


@requires_mpi
@pytest.mark.timeout(120)
def test_a_failing_worker_fails_the_mpi_job_naming_it():
    code, out = _run(_launch_args("mpi", workers=1) + ["bash", "-c", "sleep 1; exit 3"])
    assert code == 3, out
    assert "[kvstore-byteps-node] worker 0 (Open MPI rank 3 of 4, on 127.0.0.1) exited with " \
           "code 3" in out, out
    assert "[launch] mpirun (on this machine) exited with code 3" in out, out


@requires_mpi
@pytest.mark.skipif(sshd_unavailable_reason() is not None,
                    reason="no ssh cluster: %s" % sshd_unavailable_reason())
@pytest.mark.timeout(300)
def test_launcher_mpi_spans_the_hosts_of_its_hostfile(local_params, tmp_path):
    # Three hosts of an emulated network with an sshd each; mpirun (on host 0) reaches them
    # over ssh as on a real cluster, two slots per host: ranks 0-1 (scheduler, server 0) on
    # host 0, 2-3 (server 1, worker 0) on host 1, 4 (worker 1) on host 2.
    params = tmp_path / "mpi.params"
    with netns.EmulatedNetwork(3) as net:
        ssh = SshCluster(net, tmp_path).start()
        try:
            hostfile = tmp_path / "hosts"
            hostfile.write_text("".join("%s slots=2\n" % net.address(i) for i in range(3)))
            ssh_options = " ".join(ssh.ssh_args() + ["-o", "BatchMode=yes"])
            argv = (net.exec_argv(0) + _launch_args("mpi") +
                    ["-H", str(hostfile), "--mpirun-args=--mca plm_rsh_args '%s'" % ssh_options]
                    + _demo_args(params))
            code, out = _run(argv)
        finally:
            ssh.stop()
    assert code == 0, out
    assert "Open MPI rank 0 of 5: the scheduler, at 198.18.0.1:" in out, out
    assert params.read_bytes() == local_params


@requires_mpi
@pytest.mark.timeout(120)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_stopping_the_mpi_launcher_stops_every_rank(signum):
    argv = _launch_args("mpi", servers=1) + [sys.executable, DEMO, "--epochs", "100000"]
    proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    try:
        for line in proc.stdout:        # until the job trains
            lines.append(line)
            if "epoch 2/" in line:
                break
        out = "".join(lines)
        assert "epoch 2/" in out, out
        port = out.split("scheduler on 127.0.0.1:")[1].split(",")[0]
        os.kill(proc.pid, signum)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signum, out + rest
    deadline = time.monotonic() + 15
    while _job_processes("DMLC_PS_ROOT_PORT=" + port) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _job_processes("DMLC_PS_ROOT_PORT=" + port)
    for pid in left:                    # never leave them to the next test
        os.kill(pid, signal.SIGKILL)
    assert not left, "left running after the launcher stopped:\n" + out + rest
