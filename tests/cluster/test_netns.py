"""The emulated network (--launcher netns): shaped links, the demo over it, and clean-up.

Needs root (network namespaces, tc); skipped with the reason otherwise.
"""
import os
import re
import signal
import subprocess
import sys

import pytest

from kvstore_byteps.launcher import cli, job, netns
from kvstore_byteps.launcher.plan import LaunchError
from tests.support.procs import pid_alive, wait_until
from tests.support.netns_support import our_namespaces, requires_netns
from tests.support.paths import REPO
from tests.support.demo import run_demo

LAUNCH = os.path.join(REPO, "launch.py")
DEMO = os.path.join(REPO, "examples", "train_digits.py")
SLEEP = "%s -c 'import time; time.sleep(60)'" % sys.executable


# ---- pure parts ---------------------------------------------------------------------------

@pytest.mark.parametrize("text, bits", [("1gbit", 10 ** 9), ("100mbit", 10 ** 8),
                                        ("2.5Gbit", 25 * 10 ** 8), ("500kbit", 5 * 10 ** 5)])
def test_rates_in_bits(text, bits):
    assert netns.parse_rate(text) == bits


@pytest.mark.parametrize("text", ["1gbps", "1g", "fast", "0gbit", "-1mbit", "100bit"])
def test_bad_rates_are_refused(text):
    with pytest.raises(LaunchError, match="link rate"):
        netns.parse_rate(text)


def test_tbf_bucket_holds_a_gso_segment_and_two_ms_of_traffic():
    assert netns.tbf_args(10 ** 9)[:6] == ["tbf", "rate", "1000000000bit", "burst", "250000",
                                           "latency"]
    assert netns.tbf_args(10 ** 6)[4] == str(64 * 1024)


def test_without_root_one_clear_error(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert cli.main(["-n", "1", "--launcher", "netns", "prog"]) == job.EXIT_SPAWN_FAILED
    err = capsys.readouterr().err
    assert "--launcher netns needs root (CAP_NET_ADMIN)" in err and err.count("\n") == 1


def test_dry_run_places_every_node_on_its_own_host(capsys):
    assert cli.main(["-n", "2", "-s", "2", "--launcher", "netns", "--dry-run", "prog"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "[scheduler] on 198.18.0.1", "[server 0] on 198.18.0.2", "[server 1] on 198.18.0.3",
        "[worker 0] on 198.18.0.4", "[worker 1] on 198.18.0.5"]
    assert all("DMLC_PS_ROOT_URI=198.18.0.1 " in line for line in lines)


# ---- on a real emulated network -------------------------------------------------------------

@requires_netns
@pytest.mark.timeout(120)
def test_links_are_shaped_to_the_rate_in_both_directions():
    # A benchmark-style check with generous bounds: a timed bulk transfer lands within 20%.
    rate = netns.parse_rate("1gbit")
    with netns.EmulatedNetwork(3, rate) as net:
        for sender, receiver in ((0, 1), (1, 0), (2, 1)):
            measured = netns.measure_link_rate(net, sender, receiver, 60 * 10 ** 6)
            assert 0.8 * rate / 8 <= measured <= 1.2 * rate / 8, (sender, receiver, measured)
    assert our_namespaces(os.getpid()) == []


@requires_netns
@pytest.mark.timeout(200)
def test_demo_on_a_four_host_gigabit_cluster_equals_loopback(spawn, tmp_path, demo_reference):
    local = demo_reference.output
    emulated = run_demo(spawn, tmp_path / "netns.params", "--launcher", "netns", "--hosts", "4",
                         "--link-rate", "1gbit")
    assert "[launch] emulated network: 4 hosts on 1 Gbit/s (125.0 MB/s) links" in emulated
    assert "198.18.0.1: scheduler, server 0; 198.18.0.2: server 1; 198.18.0.3: worker 0; " \
           "198.18.0.4: worker 1" in emulated
    assert "[worker 0] [kvstore_byteps] dist_byteps: 2 workers, 2 BytePS servers" in emulated
    assert "[worker 0] [digits] parameters identical on all 2 workers" in local
    # rank 0 sized the partitions for its link (~1.6 MB at 125 MB/s, BytePS's 4 MB on an idle
    # loopback) and worker 1 cut its keys alike: the same parameters as on loopback
    assert 1000000 < _partition_bytes(emulated) < 2500000
    assert _partition_bytes(local) > _partition_bytes(emulated)
    assert (tmp_path / "netns.params").read_bytes() == demo_reference.params
    assert our_namespaces() == []


def _partition_bytes(out):
    found = re.search(r"partitions of (\d+) bytes \(sized for rank 0's link to the servers: "
                      r"\d+ MB/s\)", out)
    assert found, out
    return int(found.group(1))


@requires_netns
@pytest.mark.timeout(90)
@pytest.mark.parametrize("how", ["worker fails", "SIGTERM", "SIGINT", "timeout"])
def test_namespaces_and_processes_are_removed_on_every_exit(spawn, how):
    worker = ("%s -c 'import sys; sys.exit(3)'" % sys.executable) if how == "worker fails" \
        else SLEEP
    argv = [sys.executable, LAUNCH, "-n", "2", "-s", "1", "--launcher", "netns",
            "--scheduler-cmd", SLEEP, "--server-cmd", SLEEP]
    argv += ["--timeout", "2"] if how == "timeout" else []
    proc = spawn(argv + ["--", "sh", "-c", worker], stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, text=True)
    wait_until(lambda: len(our_namespaces(proc.pid)) == 5 or proc.poll() is not None, 30,
               "the emulated network of the launcher")
    nodes = []
    if how.startswith("SIG"):
        wait_until(lambda: len(_pids_in(proc.pid)) >= 4, 30, "4 nodes in the namespaces")
        nodes = _pids_in(proc.pid)
        proc.send_signal(getattr(signal, how))
    _, err = proc.communicate(timeout=60)
    expected = {"worker fails": 3, "SIGTERM": 143, "SIGINT": 130, "timeout": 124}[how]
    assert proc.returncode == expected, err
    assert our_namespaces(proc.pid) == []
    assert [p for p in nodes if pid_alive(p)] == []


@requires_netns
@pytest.mark.timeout(90)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_script_holding_a_network_removes_it_when_killed(spawn, signum):
    # a benchmark's ``with EmulatedNetwork(...)``: the default action of SIGTERM/SIGHUP would
    # end it at once and leave its namespaces until the next launcher's clean-up. The script
    # starts with both signals at their default, as from a shell: a suite run under nohup
    # passes SIGHUP on ignored, and the block leaves an ignored signal ignored
    script = ("import signal, sys, time\nsys.path.insert(0, %r)\n"
              "signal.signal(signal.SIGHUP, signal.SIG_DFL)\n"
              "signal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
              "from kvstore_byteps.launcher.netns import EmulatedNetwork\n"
              "with EmulatedNetwork(2):\n    print('ready', flush=True)\n    time.sleep(60)\n"
              % REPO)
    proc = spawn([sys.executable, "-c", script], stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    assert len(our_namespaces(proc.pid)) == 3
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, err
    assert our_namespaces(proc.pid) == []


def _pids_in(launcher_pid):
    pids = []
    for name in our_namespaces(launcher_pid):
        out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
        pids += [int(p) for p in out.stdout.split()]
    return pids


@requires_netns
@pytest.mark.timeout(90)
def test_after_a_sigkilled_launcher_the_nodes_die_and_the_next_launcher_removes_its_namespaces(
        spawn):
    proc = spawn([sys.executable, LAUNCH, "-n", "1", "-s", "1", "--launcher", "netns",
                  "--scheduler-cmd", SLEEP, "--server-cmd", SLEEP, "--", "sh", "-c", SLEEP],
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: len(_pids_in(proc.pid)) >= 3, 30, "3 nodes in the namespaces")
    nodes = _pids_in(proc.pid)
    proc.kill()
    proc.wait(timeout=10)
    wait_until(lambda: not [p for p in nodes if pid_alive(p)], 20,
               "the nodes to die after their launcher was SIGKILLed")
    assert len(our_namespaces(proc.pid)) == 4          # left behind: nobody could remove them
    removed = netns.remove_stale_namespaces()           # what the next launcher does first
    assert sorted(removed) == sorted("%s%d-%s" % (netns.NAME_PREFIX, proc.pid, n)
                                     for n in ("sw", "h0", "h1", "h2"))
    assert our_namespaces(proc.pid) == []
