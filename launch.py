#!/usr/bin/env python3
"""Start a parameter-server job on this machine: one scheduler, S servers and N workers.

    python launch.py -n 2 -s 1 python train.py --kv-store dist_byteps

Every process gets the DMLC environment that ps-lite, MXNet and BytePS read (role, cluster size,
the scheduler's address on 127.0.0.1 and a port free at start-up); workers also get their rank as
``DMLC_WORKER_ID``. Output lines are prefixed with the role and rank (``[worker 0] ...``). The
first process that fails stops the whole job and its exit code becomes the launcher's; so do
Ctrl-C, SIGTERM and ``--timeout``. Each process runs in its own process group, and stopping means
SIGTERM to every group, then SIGKILL to those still alive after a short grace.
"""
import argparse
import dataclasses
import enum
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Dict, IO, List, Mapping, Optional, Sequence, Tuple

from kvstore_byteps.config import Env, Role

#: BytePS's name for a worker's rank (ps-lite assigns ids itself; BytePS tools read this one).
WORKER_ID = Env.WORKER_ID
LOCALHOST = "127.0.0.1"
#: Variables the launcher sets itself; ``--env`` may not override them.
RESERVED = (Env.ROLE, Env.NUM_WORKER, Env.NUM_SERVER, Env.ROOT_URI, Env.ROOT_PORT,
            Env.NODE_HOST, WORKER_ID)

EXIT_SERVERS_LINGER = 1
EXIT_SPAWN_FAILED = 127
EXIT_TIMEOUT = 124
POLL_INTERVAL_S = 0.05
KILL_GRACE_S = 3.0
READER_JOIN_S = 5.0


class Launcher(enum.Enum):
    """Where the processes run."""

    LOCAL = "local"
    SSH = "ssh"


class SchedulerProgram(enum.Enum):
    """Which program the scheduler runs."""

    BYTEPS = "byteps"
    MXNET = "mxnet"


class ServerProgram(enum.Enum):
    """Which program each server runs."""

    BYTEPS = "byteps"            # our server, without MXNet
    MXNET = "mxnet"              # upstream MXNet's C++ server
    BYTEPS_KNOB = "byteps-knob"  # `import mxnet` with MXNET_KVSTORE_SERVER=byteps: our server via the hook


class LaunchError(Exception):
    """The launcher itself could not do what was asked (bad option, a program that won't start)."""


@dataclasses.dataclass(frozen=True)
class ProcSpec:
    """One process to start: its role, rank, argv and the variables set on top of our environment."""

    role: Role
    rank: Optional[int]
    argv: Tuple[str, ...]
    env: Mapping[str, str]

    @property
    def label(self) -> str:
        """``scheduler``, ``server 1``, ``worker 0``: how messages and output prefixes name it."""
        name = self.role.name.lower()
        return name if self.rank is None else "%s %d" % (name, self.rank)


def scheduler_argv(program: SchedulerProgram, python: str = sys.executable) -> List[str]:
    """The scheduler's command line for ``program``."""
    if program is SchedulerProgram.BYTEPS:
        return [python, "-m", "kvstore_byteps.scheduler"]
    return [python, "-c", "import mxnet"]


def server_program(program: ServerProgram,
                   python: str = sys.executable) -> Tuple[List[str], Dict[str, str]]:
    """A server's command line and the extra variables that select its implementation."""
    if program is ServerProgram.BYTEPS:
        return [python, "-m", "kvstore_byteps.server"], {}
    # Set the knob either way so a stray MXNET_KVSTORE_SERVER in our environment can't flip it.
    kind = "byteps" if program is ServerProgram.BYTEPS_KNOB else "mxnet"
    return [python, "-c", "import mxnet"], {Env.KVSTORE_SERVER: kind}


def parse_env_pairs(pairs: Sequence[str]) -> Dict[str, str]:
    """Turn ``["K=V", ...]`` into a dict; raise LaunchError on a malformed or reserved name."""
    result = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise LaunchError("--env %r: expected NAME=VALUE" % pair)
        if name in RESERVED:
            raise LaunchError("--env %r: %s is set by the launcher" % (pair, name))
        result[name] = value
    return result


def role_env(role: Role, rank: Optional[int], num_workers: int, num_servers: int,
             root_port: int, extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The variables one process gets on top of the launcher's environment. Pure."""
    env = dict(extra or {})
    # Unbuffered Python children, so prefixed lines appear as they happen (unless the user chose).
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update({
        Env.ROLE: role.name.lower(),
        Env.NUM_WORKER: str(num_workers),
        Env.NUM_SERVER: str(num_servers),
        Env.ROOT_URI: LOCALHOST,
        Env.ROOT_PORT: str(root_port),
        Env.NODE_HOST: LOCALHOST,
    })
    if role is Role.WORKER:
        env[WORKER_ID] = str(rank)
    return env


def plan_job(num_workers: int, num_servers: int, root_port: int, worker_argv: Sequence[str],
             scheduler_cmd: Sequence[str], server_cmd: Sequence[str],
             server_env: Optional[Mapping[str, str]] = None,
             extra_env: Optional[Mapping[str, str]] = None) -> List[ProcSpec]:
    """Every process of the job, scheduler first, then servers, then workers. Pure."""
    extra = dict(extra_env or {})

    def spec(role, rank, argv, own=None):
        env = role_env(role, rank, num_workers, num_servers, root_port, {**extra, **(own or {})})
        return ProcSpec(role, rank, tuple(argv), env)

    specs = [spec(Role.SCHEDULER, None, scheduler_cmd)]
    specs += [spec(Role.SERVER, i, server_cmd, server_env) for i in range(num_servers)]
    specs += [spec(Role.WORKER, i, worker_argv) for i in range(num_workers)]
    return specs


def free_port(host: str = LOCALHOST) -> int:
    """A TCP port that is free now (the scheduler binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def exit_status(returncode: int) -> int:
    """A child's return code as a shell exit status (killed by signal N -> 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(returncode: int) -> str:
    """``exited with code 3`` / ``was killed by SIGKILL``."""
    if returncode < 0:
        try:
            return "was killed by %s" % signal.Signals(-returncode).name
        except ValueError:
            return "was killed by signal %d" % -returncode
    return "exited with code %d" % returncode


class _Output:
    """Copies a child's stream to ours line by line with a prefix; lines never interleave."""

    _lock = threading.Lock()

    def __init__(self, stream: IO[bytes], prefix: str, sink: IO[bytes]):
        self._stream, self._prefix, self._sink = stream, prefix.encode(), sink
        self.thread = threading.Thread(target=self._pump, name="output " + prefix, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        for line in iter(self._stream.readline, b""):
            if not line.endswith(b"\n"):
                line += b"\n"
            with self._lock:
                try:
                    self._sink.write(self._prefix + line)
                    self._sink.flush()
                except (OSError, ValueError):
                    pass  # our stdout is gone (e.g. a closed pipe); keep draining the child's
        self._stream.close()


class _Child:
    """A started process, in its own process group (and session)."""

    def __init__(self, spec: ProcSpec, base_env: Mapping[str, str]):
        self.spec = spec
        try:
            self.proc = subprocess.Popen(
                list(spec.argv), env={**base_env, **spec.env}, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            raise LaunchError("cannot start %s (%s): %s"
                              % (spec.label, shlex.join(spec.argv), exc)) from None
        prefix = "[%s] " % spec.label
        self.outputs = [_Output(self.proc.stdout, prefix, sys.stdout.buffer),
                        _Output(self.proc.stderr, prefix, sys.stderr.buffer)]

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def signal_group(self, signum: int) -> None:
        """Signal the whole group, which may outlive its leader (a worker's own children)."""
        try:
            os.killpg(self.proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


class Job:
    """Runs the planned processes to completion and decides the exit status."""

    def __init__(self, specs: Sequence[ProcSpec], timeout: Optional[float] = None,
                 grace: float = 30.0, base_env: Optional[Mapping[str, str]] = None,
                 log: IO[str] = sys.stderr):
        self._specs, self._timeout, self._grace = list(specs), timeout, grace
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._log_stream = log
        self._children: List[_Child] = []
        self._signal: Optional[int] = None

    def run(self) -> int:
        """Start everything, wait for the outcome, stop whatever is left; return the exit status."""
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._start_all()
            return self._supervise()
        except LaunchError as exc:
            self._log(str(exc))
            return EXIT_SPAWN_FAILED
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum, _frame) -> None:
        self._signal = signum  # acted on by the supervising loop, never mid-cleanup

    def _log(self, text: str) -> None:
        print("[launch] " + text, file=self._log_stream, flush=True)

    def _start_all(self) -> None:
        for spec in self._specs:
            if self._signal is not None:
                return
            self._children.append(_Child(spec, self._base_env))

    def _supervise(self) -> int:
        started = time.monotonic()
        workers_done_at = None
        while True:
            now = time.monotonic()
            if self._signal is not None:
                self._log("received %s; stopping all processes" % signal.Signals(self._signal).name)
                return 128 + self._signal
            failed = next((c for c in self._children if c.proc.poll() not in (None, 0)), None)
            if failed is not None:
                code = failed.proc.returncode
                self._log("%s %s; stopping all processes" % (failed.spec.label, describe_exit(code)))
                return exit_status(code)
            running = [c for c in self._children if c.running]
            if not running:
                return 0
            if not any(c.spec.role is Role.WORKER for c in running):
                workers_done_at = workers_done_at or now
                if now - workers_done_at > self._grace:
                    self._log("%s did not exit within %g s after the workers finished; killing"
                              % (_labels(running), self._grace))
                    return EXIT_SERVERS_LINGER
            if self._timeout is not None and now - started > self._timeout:
                self._log("timed out after %g s; still running: %s; stopping all processes"
                          % (self._timeout, _labels(running)))
                return EXIT_TIMEOUT
            time.sleep(POLL_INTERVAL_S)

    def _stop_all(self) -> None:
        """SIGTERM every group, SIGKILL what is left after a grace, reap, flush the output."""
        alive = [c for c in self._children if c.running]
        for child in self._children:
            child.signal_group(signal.SIGTERM)  # also leftovers of groups whose leader is gone
        deadline = time.monotonic() + KILL_GRACE_S
        while any(c.running for c in alive) and time.monotonic() < deadline:
            time.sleep(POLL_INTERVAL_S)
        stubborn = [c for c in alive if c.running]
        if stubborn:
            self._log("%s ignored SIGTERM for %g s; sending SIGKILL" % (_labels(stubborn), KILL_GRACE_S))
        for child in self._children:
            child.signal_group(signal.SIGKILL)
        for child in self._children:
            try:
                child.proc.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                self._log("%s (pid %d) survived SIGKILL" % (child.spec.label, child.proc.pid))
        self._join_outputs()

    def _join_outputs(self) -> None:
        # A grandchild that inherited a pipe could hold it open forever: join with a deadline.
        deadline = time.monotonic() + READER_JOIN_S
        for child in self._children:
            for output in child.outputs:
                output.thread.join(max(0.0, deadline - time.monotonic()))


def _labels(children: Sequence[_Child]) -> str:
    return ", ".join(c.spec.label for c in children)


def _positive(kind):
    def parse(text):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError("expected a positive number, got %r" % text)
        return value
    parse.__name__ = kind.__name__  # argparse names the type in its "invalid int value" message
    return parse


def _nonnegative_float(text):
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError("expected a non-negative number, got %r" % text)
    return value


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parse the command line; exit with a usage error on bad input (a CLI entry point)."""
    p = argparse.ArgumentParser(prog="launch.py", description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--num-workers", type=_positive(int), required=True)
    p.add_argument("-s", "--num-servers", type=_positive(int), required=True)
    p.add_argument("--launcher", choices=[x.value for x in Launcher], default=Launcher.LOCAL.value)
    p.add_argument("--scheduler", choices=[x.value for x in SchedulerProgram],
                   default=SchedulerProgram.BYTEPS.value, help="scheduler program (default byteps)")
    p.add_argument("--server", choices=[x.value for x in ServerProgram],
                   default=ServerProgram.MXNET.value, help="server program (default mxnet)")
    p.add_argument("--scheduler-cmd", type=shlex.split, metavar="'CMD ARGS'",
                   help="run this shell-quoted command as the scheduler instead")
    p.add_argument("--server-cmd", type=shlex.split, metavar="'CMD ARGS'",
                   help="run this shell-quoted command as each server instead "
                        "(the --server choice's environment still applies)")
    p.add_argument("--timeout", type=_positive(float), metavar="SECONDS",
                   help="stop everything and fail after this long")
    p.add_argument("--grace", type=_nonnegative_float, default=30.0, metavar="SECONDS",
                   help="how long scheduler and servers may take to exit after the workers")
    p.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="set a variable in every process (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="print the processes, start none")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="CMD",
                   help="the worker program and its arguments")
    args = p.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        p.error("missing CMD: the program each worker runs")
    if Launcher(args.launcher) is not Launcher.LOCAL:
        p.error("--launcher %s is not implemented yet; use --launcher local" % args.launcher)
    try:
        args.extra_env = parse_env_pairs(args.env)
    except LaunchError as exc:
        p.error(str(exc))
    return args


def plan_from_args(args: argparse.Namespace, root_port: int) -> List[ProcSpec]:
    """The job the parsed command line asks for."""
    server_argv, server_env = server_program(ServerProgram(args.server))
    return plan_job(
        args.num_workers, args.num_servers, root_port, args.command,
        scheduler_cmd=args.scheduler_cmd or scheduler_argv(SchedulerProgram(args.scheduler)),
        server_cmd=args.server_cmd or server_argv, server_env=server_env,
        extra_env=args.extra_env)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command-line entry point; returns the exit status."""
    args = parse_args(argv)
    specs = plan_from_args(args, free_port())
    if args.dry_run:
        for spec in specs:
            assignments = " ".join("%s=%s" % (k, shlex.quote(v)) for k, v in sorted(spec.env.items()))
            print("[%s] %s %s" % (spec.label, assignments, shlex.join(spec.argv)))
        return 0
    return Job(specs, timeout=args.timeout, grace=args.grace).run()


if __name__ == "__main__":
    sys.exit(main())
