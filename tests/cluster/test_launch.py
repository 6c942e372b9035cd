"""The launcher: pure planning (environments, --env, hostfiles, placement) and the launcher run as
users run it, with tiny programs as nodes (output, exit codes, stopping, no orphans)."""
import os
import re
import shlex
import signal
import subprocess
import sys

import pytest

from kvstore_byteps.launcher import cli, job, plan
from kvstore_byteps.launcher.plan import Host, LaunchError
from kvstore_byteps.config import Config, Env, Role
from tests.support.procs import pid_alive, wait_until
from tests.support.paths import REPO


# Every process registers its pid as a file in $PIDDIR, so the test knows what to check is dead.
CHILD = """
import os, signal, sys, time
piddir = os.environ["PIDDIR"]
open(os.path.join(piddir, str(os.getpid())), "w").close()
action = sys.argv[1]
if action == "hello":
    print("out", os.environ["DMLC_ROLE"], os.environ.get("DMLC_WORKER_ID", "-"))
    print("err", os.environ["DMLC_ROLE"], file=sys.stderr)
elif action == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(60)
elif action == "sleep":
    time.sleep(60)
elif action == "family":  # a node with a child of its own (registered too), e.g. a data loader
    import subprocess
    subprocess.Popen([sys.executable, __file__, "sleep"])
    time.sleep(60)
elif action == "fail":  # worker RANK exits with CODE once COUNT processes registered; others sleep
    rank, code, count = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    if os.environ["DMLC_WORKER_ID"] != rank:
        time.sleep(60)
    deadline = time.monotonic() + 30
    while len(os.listdir(piddir)) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    sys.exit(code)
"""


# ---- pure parts ---------------------------------------------------------------------------

def test_role_env_gives_workers_their_rank_and_everyone_the_cluster():
    worker = plan.role_env(Role.WORKER, 3, 4, 2, "127.0.0.1", 9000, "127.0.0.1")
    scheduler = plan.role_env(Role.SCHEDULER, None, 4, 2, "127.0.0.1", 9000, "127.0.0.1")
    assert worker[plan.WORKER_ID] == "3"
    assert plan.WORKER_ID not in scheduler
    config = Config.from_env(worker)  # what a worker's library will make of it
    assert (config.role, config.num_workers, config.num_servers) == (Role.WORKER, 4, 2)
    assert (config.root_uri, config.root_port, config.node_host) == ("127.0.0.1", 9000, "127.0.0.1")
    assert Config.from_env(scheduler).role is Role.SCHEDULER


def test_role_env_keeps_extra_variables_but_not_over_its_own():
    env = plan.role_env(Role.SERVER, 0, 1, 1, "h", 9000, "h", {"FOO": "1", Env.ROLE: "worker"})
    assert env["FOO"] == "1" and env[Env.ROLE] == "server"


def test_plan_job_orders_roles_and_selects_programs():
    server_argv, server_env = plan.server_program(plan.ServerProgram.BYTEPS_KNOB, "py")
    shape = plan.JobShape(2, 2, plan.local_hosts(), 9000)
    specs = plan.plan_job(shape, ["train"], ["sched"], server_argv, server_env, {"X": "y"})
    assert [s.label for s in specs] == ["scheduler", "server 0", "server 1", "worker 0", "worker 1"]
    assert specs[1].argv == ("py", "-c", "import mxnet")
    assert specs[1].env[Env.KVSTORE_SERVER] == "byteps"
    assert Env.KVSTORE_SERVER not in specs[3].env
    assert specs[4].argv == ("train",) and specs[4].env["X"] == "y"


@pytest.mark.parametrize("program, argv, knob", [
    (plan.ServerProgram.BYTEPS, ["py", "-m", "kvstore_byteps.server"], None),
    (plan.ServerProgram.MXNET, ["py", "-c", "import mxnet"], "mxnet"),
    (plan.ServerProgram.BYTEPS_KNOB, ["py", "-c", "import mxnet"], "byteps"),
])
def test_server_programs(program, argv, knob):
    got_argv, env = plan.server_program(program, "py")
    assert got_argv == argv and env.get(Env.KVSTORE_SERVER) == knob


def test_scheduler_programs():
    assert plan.scheduler_argv(plan.SchedulerProgram.BYTEPS, "py")[1:] == [
        "-m", "kvstore_byteps.scheduler"]
    assert plan.scheduler_argv(plan.SchedulerProgram.MXNET, "py")[1:] == ["-c", "import mxnet"]


def test_env_options_take_mxnets_forms():
    environ = {"OMP_NUM_THREADS": "7", "EMPTY": ""}
    got = plan.parse_env_options(["A=1", "B=x=y", "C=", "OMP_NUM_THREADS:3", "PATH=/a:/b",
                                  "D:x=y", "EMPTY"], environ)
    assert got == {"A": "1", "B": "x=y", "C": "", "OMP_NUM_THREADS": "3", "PATH": "/a:/b",
                   "D": "x=y", "EMPTY": ""}
    assert plan.parse_env_options(["OMP_NUM_THREADS"], environ) == {"OMP_NUM_THREADS": "7"}


@pytest.mark.parametrize("bad, says", [
    ("=1", "expected NAME=VALUE"), ("A B=1", "expected NAME=VALUE"),
    (Env.ROOT_PORT + "=1", "set by the launcher"), (plan.WORKER_ID + ":0", "set by the launcher"),
    ("NOT_SET_HERE", "it is not set"),
])
def test_env_options_refuse_clearly(bad, says):
    with pytest.raises(LaunchError, match=says) as exc:
        plan.parse_env_options([bad], {}, "--env-worker")
    assert str(exc.value).startswith("--env-worker")


def test_hostfile_forms():
    text = """# comment
    alpha
    bob@beta:2222   # a user and an ssh port
    198.18.0.7 slots=2
    [fe80::1]:23
    """
    assert plan.parse_hostfile(text) == [Host("alpha"), Host("bob@beta", 2222),
                                         Host("198.18.0.7", 22, 2), Host("fe80::1", 23)]
    assert plan.parse_hostfile("bob@beta:2222")[0].address == "beta"


@pytest.mark.parametrize("text, says", [
    ("", "names no hosts"), ("# only a comment\n", "names no hosts"),
    ("a\nb:xx\n", "line 2 ('b:xx'): ssh port 'xx'"), ("a:70000", "not a number in 1-65535"),
    ("a slots=0", "slots=N"), ("a cpus=2", "slots=N"), ("a;rm -rf /", "is not a host name"),
])
def test_bad_hostfiles_name_the_line(text, says):
    with pytest.raises(LaunchError, match=re.escape(says)):
        plan.parse_hostfile(text, "hosts.txt")


def test_placement_is_round_robin_servers_then_workers_as_mxnet():
    hosts = [Host("h%d" % i) for i in range(4)]
    assert plan.place_nodes(hosts, 2, 2) == (0, [0, 1], [2, 3])
    assert plan.place_nodes(hosts, 4, 4) == (0, [0, 1, 2, 3], [0, 1, 2, 3])
    assert plan.place_nodes(hosts[:1], 2, 3) == (0, [0, 0], [0, 0, 0])
    assert plan.place_nodes(hosts + [Host("h4")], 2, 2, scheduler_host=0, first_host=1) == (
        0, [1, 2], [3, 4])  # the netns launcher: a host per node, the scheduler's alone


def test_placement_respects_slots():
    hosts = [Host("a", slots=1), Host("b", slots=3)]
    assert plan.place_nodes(hosts, 1, 4) == (0, [0], [1, 0, 1, 1])
    with pytest.raises(LaunchError, match="5 workers do not fit in the hostfile's 4 slots"):
        plan.place_nodes(hosts, 1, 5)
    with pytest.raises(LaunchError, match="scheduler host 2"):
        plan.place_nodes(hosts, 1, 1, scheduler_host=2)


def test_plan_on_hosts_gives_each_node_its_host_and_the_schedulers_address():
    hosts = (Host("root@a"), Host("b"), Host("c"))
    shape = plan.JobShape(2, 1, hosts, 9091, scheduler_host=1)
    specs = plan.plan_job(shape, ["train"], ["sched"], ["serve"], env_all={"ALL": "1"},
                          env_server={"S": "1"}, env_worker={"W": "1"})
    by_label = {s.label: s for s in specs}
    assert by_label["scheduler"].env[Env.NODE_HOST] == "b"
    assert {s.env[Env.ROOT_URI] for s in specs} == {"b"}
    assert (by_label["server 0"].env[Env.NODE_HOST], by_label["worker 0"].env[Env.NODE_HOST],
            by_label["worker 1"].env[Env.NODE_HOST]) == ("a", "b", "c")
    assert by_label["server 0"].env["S"] == "1" and "W" not in by_label["server 0"].env
    assert by_label["worker 1"].env["W"] == "1" and "S" not in by_label["worker 1"].env
    assert all(s.env["ALL"] == "1" for s in specs)


def test_num_servers_defaults_to_num_workers_as_in_mxnet():
    assert cli.parse_args(["-n", "3", "prog"]).num_servers == 3
    assert cli.parse_args(["-n", "3", "-s", "1", "prog"]).num_servers == 1


def test_our_servers_are_the_default():
    assert cli.parse_args(["-n", "1", "prog"]).server == "byteps"


def test_exit_status_maps_signals_like_a_shell():
    assert [job.exit_status(c) for c in (0, 3, -9, -15, 137)] == [0, 3, 137, 143, 137]
    assert job.describe_exit(-9) == "was killed by SIGKILL"
    assert job.describe_exit(143) == "was killed by SIGTERM"  # as a guard reports it


def test_dry_run_prints_every_process_and_starts_none(capsys):
    assert cli.main(["-n", "2", "-s", "1", "--dry-run", "--env", "FOO=a b",
                        "--", "python", "train.py", "-n", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("]")[0] + "]" for line in lines] == [
        "[scheduler]", "[server 0]", "[worker 0]", "[worker 1]"]
    assert "DMLC_WORKER_ID=1" in lines[3] and "FOO='a b'" in lines[3]
    assert lines[3].endswith("python train.py -n 5")  # the worker's own -n is not ours


@pytest.mark.parametrize("argv, says", [
    (["--launcher", "ssh"], "--launcher ssh needs -H HOSTFILE"),
    (["-H", "hosts"], "--hostfile is for --launcher ssh"),
    (["--hosts", "3"], "--hosts is for --launcher netns"),
    (["--launcher", "netns", "--link-rate", "1gbps"], "expected a rate in bits per second"),
    (["--launcher", "netns", "--link-rate", "fast"], "expected a rate in bits per second"),
    (["--env", "DMLC_ROLE=server"], "DMLC_ROLE is set by the launcher"),
])
def test_bad_options_get_one_clear_error(capsys, argv, says):
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(["-n", "1", *argv, "prog"], environ={})
    assert exc.value.code == 2
    assert says in capsys.readouterr().err


def test_unreadable_hostfile_is_one_line(tmp_path, capsys):
    assert cli.main(["-n", "1", "--launcher", "ssh", "-H", str(tmp_path / "nope"), "prog"]) == \
        job.EXIT_SPAWN_FAILED
    assert "cannot read hostfile %s: No such file or directory" % (tmp_path / "nope") \
        in capsys.readouterr().err


# ---- the launcher as a process ------------------------------------------------------------

@pytest.fixture
def run_launch(spawn, tmp_path):
    """Start launch.py with CHILD programs; returns (proc, piddir). ``programs`` are CHILD args."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    piddir = tmp_path / "pids"
    piddir.mkdir()

    def child(*args):
        return shlex.join([sys.executable, str(script), *args])

    def start(scheduler, server, worker, *options, servers=1, workers=2):
        argv = [sys.executable, os.path.join(REPO, "launch.py"), "-n", str(workers),
                "-s", str(servers), "--scheduler-cmd", child(*scheduler),
                "--server-cmd", child(*server), "--env", "PIDDIR=%s" % piddir, *options,
                *shlex.split(child(*worker))]
        proc = spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return proc, piddir

    yield start
    # The launcher's children live in their own sessions; should a broken launcher leave any
    # behind, spawn's teardown cannot find them once it is gone, so kill them by registered pid.
    for pid in registered_pids(piddir):
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


def registered_pids(piddir):
    return [int(name) for name in os.listdir(piddir)]


@pytest.mark.timeout(60)
def test_output_is_prefixed_with_role_and_rank(run_launch):
    proc, piddir = run_launch(["hello"], ["hello"], ["hello"], servers=2)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert {"[worker 0] out worker 0", "[worker 1] out worker 1", "[server 0] out server -",
            "[server 1] out server -", "[scheduler] out scheduler -"} <= set(out.splitlines())
    assert {"[worker 1] err worker", "[server 1] err server", "[scheduler] err scheduler"} \
        <= set(err.splitlines())
    assert len(registered_pids(piddir)) == 5


@pytest.mark.timeout(60)
def test_failing_worker_sets_exit_code_and_kills_everyone(run_launch):
    # scheduler + 2 servers + 2 workers = 5; worker 1 fails once all have started.
    proc, piddir = run_launch(["sleep"], ["sleep"], ["fail", "1", "3", "5"], servers=2)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 3, err
    assert "[launch] worker 1 (on this machine) exited with code 3; stopping all processes" in err
    # the launcher said why it stops the others; their guards do not add "the launcher went away"
    assert "[guard]" not in err, err
    pids = registered_pids(piddir)
    assert len(pids) == 5
    assert [p for p in pids if pid_alive(p)] == []


@pytest.mark.timeout(60)
def test_timeout_kills_everyone_even_a_process_ignoring_sigterm(run_launch):
    proc, piddir = run_launch(["sleep"], ["stubborn"], ["sleep"], "--timeout", "1")
    wait_until(lambda: len(registered_pids(piddir)) == 4, 20, "4 processes to start")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == job.EXIT_TIMEOUT, err
    assert "timed out after 1 s; still running: scheduler, server 0, worker 0, worker 1" in err
    assert "[server 0] [guard] %s still running 3 s after SIGTERM; sending SIGKILL" \
        % sys.executable in err
    assert [p for p in registered_pids(piddir) if pid_alive(p)] == []


@pytest.mark.timeout(60)
def test_servers_that_outlive_the_workers_fail_the_job(run_launch):
    proc, piddir = run_launch(["hello"], ["sleep"], ["hello"], "--grace", "0.5")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == job.EXIT_SERVERS_LINGER, err
    assert "server 0 did not exit within 0.5 s after the workers finished" in err
    assert [p for p in registered_pids(piddir) if pid_alive(p)] == []


def test_a_launch_without_workers_waits_for_its_nodes_past_the_grace():
    """bpslaunch by role starts only a scheduler or a server: "no worker running" is true
    from the start, and is no reason to stop nodes that are still serving the job."""
    nodes = [plan.ProcSpec(role, None, (sys.executable, "-c", "import time; time.sleep(1.5)"),
                           {}) for role in (Role.SCHEDULER, Role.SERVER)]
    assert job.Job(nodes, grace=0.1, timeout=30).run() == 0


def test_a_failed_node_is_named_with_its_detail():
    """bpslaunch labels a worker by the rank users know (``worker 3``); the library's own
    messages name the host's worker rank, which the detail gives too."""
    import io
    crash = plan.ProcSpec(Role.WORKER, 3, (sys.executable, "-c", "raise SystemExit(3)"), {},
                          detail="worker host 1, local rank 1")
    log = io.StringIO()
    assert job.Job([crash], log=log).run() == 3
    assert ("[launch] worker 3 (worker host 1, local rank 1; on this machine) exited with "
            "code 3; stopping all processes") in log.getvalue()


@pytest.mark.timeout(60)
def test_sigterm_stops_the_job(run_launch):
    proc, piddir = run_launch(["sleep"], ["sleep"], ["sleep"])
    wait_until(lambda: len(registered_pids(piddir)) == 4, 20, "4 processes to start")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "received SIGTERM; stopping all processes" in err
    assert [p for p in registered_pids(piddir) if pid_alive(p)] == []


@pytest.mark.timeout(60)
def test_sigkill_of_the_launcher_leaves_no_node_behind(run_launch):
    # The launcher cannot clean up after SIGKILL: the guards see their pipe close and stop
    # their nodes' whole process groups (a node's own child, and a node ignoring SIGTERM, too).
    proc, piddir = run_launch(["sleep"], ["stubborn"], ["family"])
    wait_until(lambda: len(registered_pids(piddir)) == 6, 20, "6 processes to start")
    proc.kill()
    proc.wait(timeout=10)
    wait_until(lambda: not [p for p in registered_pids(piddir) if pid_alive(p)], 20,
               "every node to die after the launcher was SIGKILLed")


@pytest.mark.timeout(60)
def test_log_dir_gets_one_file_per_node(run_launch, tmp_path):
    logs = tmp_path / "logs"
    proc, _ = run_launch(["hello"], ["hello"], ["hello"], "--log-dir", str(logs))
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert sorted(os.listdir(logs)) == ["scheduler.log", "server-0.log", "worker-0.log",
                                        "worker-1.log"]
    assert set((logs / "worker-1.log").read_text().splitlines()) == {"out worker 1", "err worker"}
    assert "[worker 1] out worker 1" in out  # the console keeps its prefixed copy


def test_console_script_is_the_same_launcher():
    import shutil
    script = shutil.which("kvstore-byteps-launch", path=os.path.dirname(sys.executable))
    if script is None:
        pytest.skip("kvstore-byteps-launch is not installed beside %s (run from an install, as "
                    ".ci/run does)" % sys.executable)
    done = subprocess.run([script, "-n", "2", "--dry-run", "prog"], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert [line.split("]")[0] + "]" for line in done.stdout.splitlines()] == [
        "[scheduler]", "[server 0]", "[server 1]", "[worker 0]", "[worker 1]"]


STORE_PROBE = "import mxnet as mx; kv = mx.kv.create('dist_byteps'); print('rank', kv.rank)"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("server, says", [
    ("byteps", "2 BytePS servers (the BytePS data path); van byteps_tcp (auto: every peer is "
               "ours)"),
    # the default van: byteps_tcp to our scheduler and itself, ZeroMQ to MXNet's servers
    ("mxnet", "2 MXNet's own servers (MXNet's key layout, no BytePS data path); van auto: "
              "byteps_tcp to nodes 1,9, zmq to nodes 8,10 (upstream MXNet)"),
])
def test_rank_0_says_what_it_talks_to_and_workers_honour_ps_verbose(spawn, server, says):
    argv = [sys.executable, os.path.join(REPO, "launch.py"), "-n", "2", "--server", server,
            "--timeout", "90", "--env", "PS_VERBOSE=1", sys.executable, "-c", STORE_PROBE]
    proc = spawn(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate(timeout=100)
    assert proc.returncode == 0, out
    assert "[worker 0] [kvstore_byteps] dist_byteps: 2 workers, %s; partitions of " % says in out
    # our servers: the size rank 0 chose for its link (loopback: fast); MXNet's: BytePS's
    sized = "bytes (sized for rank 0's link to the servers: " in out
    assert sized == (server == "byteps") and ("partitions of 4096000 bytes" in out or sized)
    assert out.count("[kvstore_byteps] dist_byteps:") == 1  # rank 0 only
    # the prefix is the rank the scheduler gave (DMLC_WORKER_ID is honoured by our scheduler)
    assert "[worker 0] rank 0" in out and "[worker 1] rank 1" in out
    assert re.search(r"\[worker 1\] .* \[worker\] INFO kvstore_byteps\.engine\.worker: worker "
                     r"rank 1 of 2 talks to %s servers" % server, out), out


@pytest.mark.parametrize("module", ["kvstore_byteps.server", "kvstore_byteps.scheduler"])
def test_node_entry_points_answer_help_and_refuse_unknown_arguments(module):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_", "BYTEPS_"))}
    helped = subprocess.run([sys.executable, "-m", module, "--help"], env=env, timeout=60,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert helped.returncode == 0 and "DMLC_PS_ROOT_PORT" in helped.stdout, helped.stdout
    wrong = subprocess.run([sys.executable, "-m", module, "--bogus"], env=env, timeout=60,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert wrong.returncode == 2 and "--bogus" in wrong.stdout, wrong.stdout


def test_p3_flag_sets_the_p3_van_on_every_node_as_mxnets_launcher_does():
    args = cli.parse_args(["-n", "2", "--p3", "python", "t.py"], {})
    assert args.env_all["DMLC_PS_VAN_TYPE"] == "p3"
    explicit = cli.parse_args(["-n", "2", "--p3", "--env", "DMLC_PS_VAN_TYPE=zmq", "python",
                               "t.py"], {})
    assert explicit.env_all["DMLC_PS_VAN_TYPE"] == "zmq"     # an explicit --env wins
