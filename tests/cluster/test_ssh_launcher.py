"""--launcher ssh for real: an sshd in each host namespace of an emulated cluster.

The launcher runs inside host 0's namespace, as a user logged in there would, and reaches every
host (itself included) over ssh with a key made for the test. Needs root and openssh-server
(.ci/run installs it when it runs as root); skipped with the reason otherwise.
"""
import os
import re
import shlex
import signal
import subprocess
import sys

import pytest

import kvstore_byteps
from kvstore_byteps.launcher import netns, ssh
from kvstore_byteps.config import Role
from kvstore_byteps.launcher.plan import Host, ProcSpec
from tests.support.procs import pid_alive, wait_until
from tests.support.netns_support import SshCluster, sshd_unavailable_reason
from tests.support.paths import REPO

LAUNCH = os.path.join(REPO, "launch.py")
DEMO = os.path.join(REPO, "examples", "train_digits.py")

requires_sshd = pytest.mark.skipif(sshd_unavailable_reason() is not None,
                                   reason="ssh cluster unavailable: %s" % sshd_unavailable_reason())


# ---- pure parts ---------------------------------------------------------------------------

def test_remote_command_quotes_everything_for_the_remote_shell():
    line = ssh.remote_command(["python", "-m", "x", "a b", "$HOME"], {"B": "2 3", "A": "1;rm"})
    assert line == "exec env 'A=1;rm' 'B=2 3' python -m x 'a b' '$HOME'"
    assert shlex.split(line)[2:4] == ["A=1;rm", "B=2 3"]


def test_ssh_never_prompts_and_notices_dead_hosts():
    argv = ssh.ssh_base(Host("bob@h", 2222), ["-i", "key"])
    assert argv[-3:] == ["-i", "key", "bob@h"] and "BatchMode=yes" in argv
    assert argv[argv.index("-p") + 1] == "2222" and "ServerAliveInterval=5" in argv


def test_each_node_runs_under_the_guard_in_the_workdir():
    starter = ssh.SshStarter([Host("a"), Host("b")], "/venv/bin/python", "/work dir")
    spec = ProcSpec(Role.WORKER, 1, ("python", "train.py"), {"DMLC_ROLE": "worker"}, host=1)
    argv, _ = starter.command(spec, {})
    assert argv[-2] == "b" and starter.where(spec) == "b"
    assert shlex.split(argv[-1]) == [
        "exec", "env", "DMLC_ROLE=worker", "/venv/bin/python", "-m", "kvstore_byteps.launcher.guard",
        "--cwd", "/work dir", "--path-prepend", "/venv/bin", "--", "python", "train.py"]


# ---- on an emulated cluster with an sshd per host ---------------------------------------------

@pytest.fixture
def ssh_cluster(tmp_path):
    """``make()``: hosts on 1 Gbit/s links with an sshd each (``sshd_on``: {host: extra sshd
    config lines} for only some hosts)."""
    made = []

    def make(num_hosts=4, rate="1gbit", sshd_on=None):
        net = netns.EmulatedNetwork(num_hosts, netns.parse_rate(rate))
        net.create()
        made.append(net)
        cluster = SshCluster(net, tmp_path)
        made.append(cluster)
        return cluster.start(sshd_on)

    yield make
    for thing in reversed(made):
        (thing.stop if isinstance(thing, SshCluster) else thing.destroy)()


def _launcher(cluster, hostfile, *options):
    return (cluster.net.exec_argv(0)
            + [sys.executable, LAUNCH, "--launcher", "ssh", "-H", str(hostfile),
               "--ssh-args", shlex.join(cluster.ssh_args()), *options])


@requires_sshd
@pytest.mark.timeout(240)
def test_two_by_two_training_over_ssh_equals_the_local_run(ssh_cluster, spawn, tmp_path,
                                                          demo_reference):
    cluster = ssh_cluster()
    hostfile = tmp_path / "hosts"
    hostfile.write_text("".join("%s\n" % cluster.net.address(h) for h in range(4)))
    demo = [sys.executable, DEMO, "--epochs", "2"]
    common = ["-n", "2", "-s", "2", "--timeout", "150", "--env", "BYTEPS_START_TIMEOUT=60"]
    over_ssh = spawn(_launcher(cluster, hostfile, *common, "--log-dir", str(tmp_path / "logs"),
                               *demo, "--save-params", str(tmp_path / "ssh.params")),
                     cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = over_ssh.communicate(timeout=180)
    assert over_ssh.returncode == 0, out
    assert "[launch] 4 hosts passed the preflight; scheduler on 198.18.0.1:" in out
    assert "198.18.0.1: scheduler, server 0; 198.18.0.2: server 1; 198.18.0.3: worker 0; " \
           "198.18.0.4: worker 1" in out
    assert "[worker 0] [digits] parameters identical on all 2 workers" in out
    assert "[digits] final test accuracy" in (tmp_path / "logs" / "worker-0.log").read_text()
    assert (tmp_path / "ssh.params").read_bytes() == demo_reference.params


@requires_sshd
@pytest.mark.timeout(120)
def test_preflight_names_each_failing_host_and_starts_nothing(ssh_cluster, spawn, tmp_path):
    old = tmp_path / "old" / "kvstore_byteps"
    old.mkdir(parents=True)
    (old / "__init__.py").write_text('__version__ = "0.0.1-old"\n')
    # host 1 has an older copy first on its path; host 2 runs no sshd; host 3 is fine
    cluster = ssh_cluster(sshd_on={0: [], 1: ["SetEnv PYTHONPATH=%s" % old.parent], 3: []})
    hostfile = tmp_path / "hosts"
    hostfile.write_text("".join("%s\n" % cluster.net.address(h) for h in range(4)))
    proc = spawn(_launcher(cluster, hostfile, "-n", "2", "--", "sh", "-c", "exit 9"), cwd=REPO,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 127, err
    assert "[launch] preflight failed on 2 of 4 hosts:" in err
    assert "198.18.0.2: kvstore-byteps 0.0.1-old is installed there, %s here" \
        % kvstore_byteps.__version__ in err
    assert re.search(r"198\.18\.0\.3: not reachable with ssh in BatchMode \(port 22\): .*"
                     r"Connection refused", err), err
    assert "198.18.0.1" not in err.split("preflight failed")[1]  # fine hosts are not listed
    assert "[worker" not in out + err                             # nothing was started


@requires_sshd
@pytest.mark.timeout(120)
def test_preflight_refuses_a_busy_scheduler_port_and_a_missing_workdir(ssh_cluster, spawn,
                                                                        tmp_path):
    cluster = ssh_cluster(num_hosts=2)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("%s\n%s\n" % (cluster.net.address(0), cluster.net.address(1)))
    blocker = subprocess.Popen(cluster.net.exec_argv(0) + [
        sys.executable, "-c", "import socket, time; s = socket.socket(); "
        "s.bind(('', 9555)); s.listen(); print('bound', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert blocker.stdout.readline().strip() == "bound"
        errors = []
        for options in (["--port", "9555"], ["--workdir", "/nonexistent"]):
            proc = spawn(_launcher(cluster, hostfile, *options, "-n", "1", "true"), cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            errors.append(proc.communicate(timeout=90)[1])
            assert proc.returncode == 127, errors[-1]
    finally:
        blocker.kill()
        blocker.wait()
    assert "[launch] preflight failed on 1 of 2 hosts:\n  198.18.0.1: the scheduler's port " \
           "9555 is not free (Address already in use)" in errors[0]
    assert "preflight failed on 2 of 2 hosts" in errors[1]
    for host in ("198.18.0.1", "198.18.0.2"):
        assert "%s: working directory /nonexistent does not exist there" % host in errors[1]


@requires_sshd
@pytest.mark.timeout(120)
def test_sigkill_of_the_launcher_stops_every_remote_node(ssh_cluster, spawn, tmp_path):
    cluster = ssh_cluster(num_hosts=2)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("%s\n%s\n" % (cluster.net.address(0), cluster.net.address(1)))
    piddir = tmp_path / "pids"
    piddir.mkdir()
    # each node registers its pid, then ignores SIGTERM and sleeps (the guard must SIGKILL it)
    script = tmp_path / "node.py"
    script.write_text("import os, signal, sys, time\n"
                      "open(os.path.join(sys.argv[1], str(os.getpid())), 'w').close()\n"
                      "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                      "time.sleep(90)\n")
    node = [sys.executable, str(script), str(piddir)]
    proc = spawn(_launcher(cluster, hostfile, "-n", "2", "-s", "2", "--scheduler-cmd",
                           shlex.join(node), "--server-cmd", shlex.join(node), "--", *node),
                 cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: len(os.listdir(piddir)) == 5, 60, "5 remote nodes to start")
    pids = [int(p) for p in os.listdir(piddir)]
    # SIGKILL the launcher only: it cannot clean up; its ssh clients and the remote guards must.
    os.kill(proc.pid, signal.SIGKILL)  # `ip netns exec` execs: this is the launcher
    wait_until(lambda: not [p for p in pids if pid_alive(p)], 30,
               "every remote node to die after the launcher was SIGKILLed")
    proc.wait(timeout=10)


@requires_sshd
@pytest.mark.timeout(120)
def test_slots_give_each_hosts_workers_their_local_ranks_over_ssh(ssh_cluster, spawn, tmp_path):
    """``-n 4`` on two hosts of ``slots=2``: the variables reach the workers over ssh, and each
    host's two workers are local ranks 0 and 1 of 2 (``mx.gpu(hvd.local_rank())``)."""
    cluster = ssh_cluster(num_hosts=2)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("%s slots=2\n%s slots=2\n" % (cluster.net.address(0),
                                                      cluster.net.address(1)))
    show = [sys.executable, "-c", "import os; print('PLACE', *(os.environ[n] for n in ("
            "'DMLC_NODE_HOST', 'DMLC_WORKER_ID', 'BYTEPS_LOCAL_RANK', 'BYTEPS_LOCAL_SIZE', "
            "'DMLC_NUM_WORKER')))"]
    proc = spawn(_launcher(cluster, hostfile, "-n", "4", "-s", "2", "--timeout", "60",
                           "--scheduler-cmd", "true", "--server-cmd", "true", "--", *show),
                 cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0, out
    places = sorted(line.split("PLACE ")[1] for line in out.splitlines() if "PLACE " in line)
    assert places == ["198.18.0.1 0 0 2 4", "198.18.0.1 2 1 2 4",
                      "198.18.0.2 1 0 2 4", "198.18.0.2 3 1 2 4"], out
