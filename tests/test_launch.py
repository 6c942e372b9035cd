"""launch.py: the pure planning functions, and the launcher run as users run it (tiny programs)."""
import os
import shlex
import signal
import subprocess
import sys

import pytest

import launch  # a script at the repository root (importable: tests/ is a package under it)
from kvstore_byteps.config import Config, Env, Role
from tests.conftest import pid_alive, wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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
    worker = launch.role_env(Role.WORKER, 3, num_workers=4, num_servers=2, root_port=9000)
    scheduler = launch.role_env(Role.SCHEDULER, None, num_workers=4, num_servers=2, root_port=9000)
    assert worker[launch.WORKER_ID] == "3"
    assert launch.WORKER_ID not in scheduler
    config = Config.from_env(worker)  # what a worker's library will make of it
    assert (config.role, config.num_workers, config.num_servers) == (Role.WORKER, 4, 2)
    assert (config.root_uri, config.root_port, config.node_host) == ("127.0.0.1", 9000, "127.0.0.1")
    assert Config.from_env(scheduler).role is Role.SCHEDULER


def test_role_env_keeps_extra_variables_but_not_over_its_own():
    env = launch.role_env(Role.SERVER, 0, 1, 1, 9000, {"FOO": "1", Env.ROLE: "worker"})
    assert env["FOO"] == "1" and env[Env.ROLE] == "server"


def test_plan_job_orders_roles_and_selects_programs():
    server_argv, server_env = launch.server_program(launch.ServerProgram.BYTEPS_KNOB, "py")
    specs = launch.plan_job(2, 2, 9000, ["train"], ["sched"], server_argv, server_env, {"X": "y"})
    assert [s.label for s in specs] == ["scheduler", "server 0", "server 1", "worker 0", "worker 1"]
    assert specs[1].argv == ("py", "-c", "import mxnet")
    assert specs[1].env[Env.KVSTORE_SERVER] == "byteps"
    assert Env.KVSTORE_SERVER not in specs[3].env
    assert specs[4].argv == ("train",) and specs[4].env["X"] == "y"


@pytest.mark.parametrize("program, argv, knob", [
    (launch.ServerProgram.BYTEPS, ["py", "-m", "kvstore_byteps.server"], None),
    (launch.ServerProgram.MXNET, ["py", "-c", "import mxnet"], "mxnet"),
    (launch.ServerProgram.BYTEPS_KNOB, ["py", "-c", "import mxnet"], "byteps"),
])
def test_server_programs(program, argv, knob):
    got_argv, env = launch.server_program(program, "py")
    assert got_argv == argv and env.get(Env.KVSTORE_SERVER) == knob


def test_scheduler_programs():
    assert launch.scheduler_argv(launch.SchedulerProgram.BYTEPS, "py")[1:] == [
        "-m", "kvstore_byteps.scheduler"]
    assert launch.scheduler_argv(launch.SchedulerProgram.MXNET, "py")[1:] == ["-c", "import mxnet"]


def test_parse_env_pairs():
    assert launch.parse_env_pairs(["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}
    for bad in ("A", "=1", Env.ROOT_PORT + "=1", launch.WORKER_ID + "=0"):
        with pytest.raises(launch.LaunchError):
            launch.parse_env_pairs([bad])


def test_exit_status_maps_signals_like_a_shell():
    assert [launch.exit_status(c) for c in (0, 3, -9, -15)] == [0, 3, 137, 143]


def test_dry_run_prints_every_process_and_starts_none(capsys):
    assert launch.main(["-n", "2", "-s", "1", "--dry-run", "--env", "FOO=a b",
                        "--", "python", "train.py", "-n", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("]")[0] + "]" for line in lines] == [
        "[scheduler]", "[server 0]", "[worker 0]", "[worker 1]"]
    assert "DMLC_WORKER_ID=1" in lines[3] and "FOO='a b'" in lines[3]
    assert lines[3].endswith("python train.py -n 5")  # the worker's own -n is not ours


def test_ssh_launcher_is_refused_clearly(capsys):
    with pytest.raises(SystemExit) as exc:
        launch.parse_args(["-n", "1", "-s", "1", "--launcher", "ssh", "prog"])
    assert exc.value.code == 2
    assert "not implemented yet" in capsys.readouterr().err


def test_readme_documents_every_variable_and_the_test_command():
    with open(os.path.join(ROOT, "README.md")) as readme:
        text = readme.read()
    names = [v for k, v in vars(Env).items() if k.isupper()]
    assert [n for n in names if "| `%s` |" % n not in text] == []
    with open(os.path.join(ROOT, ".ci", "run")) as ci:
        assert "python -m pytest -q tests" in ci.read()  # what the README says .ci/run runs
    assert "**Run the tests**: `bash .ci/run`" in text and "`python -m pytest -q tests`" in text


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
        argv = [sys.executable, os.path.join(ROOT, "launch.py"), "-n", str(workers),
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
    assert "[launch] worker 1 exited with code 3; stopping all processes" in err
    pids = registered_pids(piddir)
    assert len(pids) == 5
    assert [p for p in pids if pid_alive(p)] == []


@pytest.mark.timeout(60)
def test_timeout_kills_everyone_even_a_process_ignoring_sigterm(run_launch):
    proc, piddir = run_launch(["sleep"], ["stubborn"], ["sleep"], "--timeout", "1")
    wait_until(lambda: len(registered_pids(piddir)) == 4, 20, "4 processes to start")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == launch.EXIT_TIMEOUT, err
    assert "timed out after 1 s; still running: scheduler, server 0, worker 0, worker 1" in err
    assert "server 0 ignored SIGTERM" in err
    assert [p for p in registered_pids(piddir) if pid_alive(p)] == []


@pytest.mark.timeout(60)
def test_servers_that_outlive_the_workers_fail_the_job(run_launch):
    proc, piddir = run_launch(["hello"], ["sleep"], ["hello"], "--grace", "0.5")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == launch.EXIT_SERVERS_LINGER, err
    assert "server 0 did not exit within 0.5 s after the workers finished" in err
    assert [p for p in registered_pids(piddir) if pid_alive(p)] == []


@pytest.mark.timeout(60)
def test_sigterm_stops_the_job(run_launch):
    proc, piddir = run_launch(["sleep"], ["sleep"], ["sleep"])
    wait_until(lambda: len(registered_pids(piddir)) == 4, 20, "4 processes to start")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "received SIGTERM; stopping all processes" in err
    assert [p for p in registered_pids(piddir) if pid_alive(p)] == []
