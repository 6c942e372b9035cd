"""Start the planned nodes, copy their output with a ``[role rank]`` prefix, decide the exit status.

Every node runs under ``kvstore_byteps.launcher.guard`` with a pipe from us as its standard input
(see guard.py): if this launcher dies, even by SIGKILL, every node stops. A ``NodeStarter`` says
how a node's command line becomes a local process: directly, inside a network namespace, or
through ssh. The first node that fails stops the job and its exit status becomes ours; so do
Ctrl-C, SIGTERM, SIGHUP and the timeout. With elastic workers (``min_workers``), a worker that
is lost (killed by a signal) leaves the job instead while at least that many workers are left;
with ``max_restarts`` K, it is started again (at most K times per worker; the restarted process
has ``BYTEPS_RESTART_COUNT`` set) and takes its place back at the others' next commit.
"""
import dataclasses
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Dict, List, Mapping, Optional, Sequence, Tuple

from kvstore_byteps.config import Role
from kvstore_byteps.errors import EXIT_LEFT, JOINED_LINE

from .guard import STOP_WORD
from .procs import die_with_parent, exit_status
from .plan import LaunchError, ProcSpec

EXIT_SERVERS_LINGER = 1
EXIT_SPAWN_FAILED = 127
EXIT_TIMEOUT = 124
#: ssh's status when the connection to a remote node dropped (its host is gone)
EXIT_CONNECTION_LOST = 255
POLL_INTERVAL_S = 0.05
#: the variable a restarted worker finds its restart's number in (1, 2, ...)
RESTART_COUNT = "BYTEPS_RESTART_COUNT"
#: how long restarted workers may still run once the others finished (they had not joined:
#: a worker that joined passes the others' shutdown barrier with them)
UNJOINED_GRACE_S = 5.0
#: How long nodes get to exit after we close their pipes and SIGTERM them (the guard itself waits
#: 3 s before its SIGKILL), before we SIGKILL what is left.
STOP_GRACE_S = 5.0
#: How long nodes get to stop on the guard's word before we SIGTERM them (a guard stops its node
#: with SIGTERM at once, and SIGKILLs it after 3 s).
WORD_GRACE_S = 4.0
#: How long a node killed by a signal waits to be blamed, in case the signal came to us too.
SIGNAL_RACE_S = 0.5
READER_JOIN_S = 5.0
GUARD_MODULE = "kvstore_byteps.launcher.guard"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def guard_argv(python: str, argv: Sequence[str], cwd: Optional[str] = None,
               path_prepend: Optional[str] = None) -> List[str]:
    """``argv`` run under the guard by ``python``."""
    prefix = [python, "-m", GUARD_MODULE]
    if cwd:
        prefix += ["--cwd", cwd]
    if path_prepend:
        prefix += ["--path-prepend", path_prepend]
    return prefix + ["--"] + list(argv)


class NodeStarter:
    """How a node's spec becomes a local process. The default: the guard on this machine."""

    def __init__(self, python: str = sys.executable):
        self.python = python

    def command(self, spec: ProcSpec, base_env: Mapping[str, str]) -> Tuple[List[str], Dict[str, str]]:
        """The local argv and environment that start ``spec``."""
        return guard_argv(self.python, spec.argv), {**base_env, **spec.env}

    def where(self, spec: ProcSpec) -> str:
        """Where the node runs, for messages."""
        return "this machine"


def describe_exit(returncode: int) -> str:
    """``exited with code 3`` / ``was killed by SIGKILL``."""
    code = exit_status(returncode)
    if returncode < 0 or code > 128:
        try:
            return "was killed by %s" % signal.Signals(code - 128).name
        except ValueError:
            pass
    if code == EXIT_LEFT:
        return "exited with code %d (the job took it for lost: it left)" % code
    return "exited with code %d" % code


def log_file_name(spec: ProcSpec) -> str:
    """``scheduler.log``, ``server-1.log``, ``worker-0.log``."""
    return spec.label.replace(" ", "-") + ".log"




class OutputCopy:
    """Copies a child's stream to ours line by line with a prefix (and to a log file, if any)."""

    _lock = threading.Lock()

    def __init__(self, stream: IO[bytes], prefix: str, sink: IO[bytes], log: Optional[IO[bytes]],
                 watch: bytes = b""):
        """``watch``: a text whose line sets :attr:`seen` (a restarted worker's join)."""
        self._stream, self._prefix, self._sink, self._log = stream, prefix.encode(), sink, log
        self._watch, self.seen = watch, threading.Event()
        self.thread = threading.Thread(target=self._pump, name="output " + prefix, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        for line in iter(self._stream.readline, b""):
            if not line.endswith(b"\n"):
                line += b"\n"
            if self._watch and self._watch in line:
                self.seen.set()
            with self._lock:
                try:
                    self._sink.write(self._prefix + line)
                    self._sink.flush()
                except (OSError, ValueError):
                    pass  # our stdout is gone (e.g. a closed pipe); keep draining the child's
                if self._log is not None:
                    try:
                        self._log.write(line)
                        self._log.flush()
                    except (OSError, ValueError):
                        pass
        self._stream.close()


class _Child:
    """A started node: its local process (the guard, or ssh), in its own process group."""

    def __init__(self, spec: ProcSpec, starter: NodeStarter, base_env: Mapping[str, str],
                 log_dir: Optional[str]):
        self.spec = spec
        argv, env = starter.command(spec, base_env)
        try:
            # The guard gets SIGTERM when we die (it then stops its node); the pipe covers the
            # rest (over ssh, the ssh client gets the signal and the channel closes).
            launcher_pid = os.getpid()
            self.proc = subprocess.Popen(
                argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True,
                preexec_fn=lambda: die_with_parent(signal.SIGTERM, launcher_pid))
        except OSError as exc:
            raise LaunchError("cannot start %s (%s): %s"
                              % (spec.label, shlex.join(argv), exc)) from None
        # (a restarted worker's output goes on in the same log file)
        mode = "ab" if RESTART_COUNT in spec.env else "wb"
        self.log = open(os.path.join(log_dir, log_file_name(spec)), mode) if log_dir else None
        prefix = "[%s] " % spec.label if spec.prefixed else ""
        watch = JOINED_LINE.encode() if RESTART_COUNT in spec.env else b""
        self.outputs = [OutputCopy(self.proc.stdout, prefix, sys.stdout.buffer, self.log, watch),
                        OutputCopy(self.proc.stderr, prefix, sys.stderr.buffer, self.log, watch)]

    @property
    def joining(self) -> bool:
        """A restarted worker still running that has not said it joined (it does not count
        among the workers left, as the scheduler does not count it)."""
        return (RESTART_COUNT in self.spec.env and self.running
                and not any(out.seen.is_set() for out in self.outputs))

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def close_pipe(self) -> None:
        """The stop word, then end-of-file on the guard's watch: it stops its node quietly."""
        try:
            if self.proc.poll() is None:
                self.proc.stdin.write(STOP_WORD)
                self.proc.stdin.flush()
        except OSError:
            pass
        try:
            self.proc.stdin.close()
        except OSError:
            pass

    def signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


class Job:
    """Runs the planned nodes to completion and decides the exit status."""

    def __init__(self, specs: Sequence[ProcSpec], starter: Optional[NodeStarter] = None,
                 timeout: Optional[float] = None, grace: float = 30.0,
                 base_env: Optional[Mapping[str, str]] = None, log_dir: Optional[str] = None,
                 log: IO[str] = sys.stderr, min_workers: int = 0, max_restarts: int = 0):
        self._specs, self._timeout, self._grace = list(specs), timeout, grace
        self._min_workers, self._max_restarts = min_workers, max_restarts
        self._lost: List[_Child] = []    # workers that failed and left an elastic job
        self._restarted: List[_Child] = []   # failed workers started again (elastic)
        self._unjoined: List[_Child] = []    # restarted ones stopped: the job was over
        self._starter = starter or NodeStarter()
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._log_dir = log_dir
        self._log_stream = log
        self._children: List[_Child] = []
        self._signal: Optional[int] = None

    def run(self) -> int:
        """Start everything, wait for the outcome, stop whatever is left; return the exit status."""
        previous = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}
        try:
            if self._log_dir:
                os.makedirs(self._log_dir, exist_ok=True)
            self._start_all()
            return self._supervise()
        except (LaunchError, OSError) as exc:
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
            self._children.append(_Child(spec, self._starter, self._base_env, self._log_dir))

    def _supervise(self) -> int:
        started = time.monotonic()
        workers_done_at = finished_at = None
        # The linger rule is about workers this launch started: a launch of only a scheduler
        # or only servers (bpslaunch by role) has none, and its nodes end by themselves.
        has_workers = any(c.spec.role is Role.WORKER for c in self._children)
        while True:
            now = time.monotonic()
            if self._signal is not None:
                self._log("received %s; stopping all processes" % signal.Signals(self._signal).name)
                return 128 + self._signal
            failed = next((c for c in self._children if c.proc.poll() not in (None, 0)
                           and c not in self._lost and c not in self._restarted
                           and c not in self._unjoined), None)
            if failed is not None and self._killed_with_us(failed):
                continue       # our own stop signal came with it: say that instead
            if failed is not None:
                leaves = self._leaves(failed)
                if leaves:
                    continue
                code = failed.proc.returncode
                if leaves is None:
                    where = "on " + self._starter.where(failed.spec)
                    about = "; ".join(filter(None, (failed.spec.detail, where)))
                    self._log("%s (%s) %s; stopping all processes"
                              % (failed.spec.label, about, describe_exit(code)))
                return exit_status(code)
            running = [c for c in self._children if c.running]
            if not running:
                return 0
            finished_at = self._stop_unjoined(running, now, finished_at)
            if has_workers and not any(c.spec.role is Role.WORKER for c in running):
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

    def _leaves(self, failed: "_Child") -> Optional[bool]:
        """Elastic workers: whether the failed worker ``failed`` leaves the job, which goes on
        with at least ``min_workers`` workers (True, said once), or ends it (False, said
        naming every worker lost); None where the job is not elastic, ``failed`` is no worker,
        or its program chose its exit status (``sys.exit(N)``, an uncaught error: the job
        ends as without elastic workers, and the caller says why). A worker killed by a
        signal (killed, crashed, its machine preempted) is lost; so is a remote one whose
        connection dropped (ssh's 255), one the job took for lost while it lived on (it
        exits EXIT_LEFT), and a restarted one that fails in any way (it may not have joined:
        the scheduler does not let it end the job)."""
        code = exit_status(failed.proc.returncode)
        restarted = RESTART_COUNT in failed.spec.env    # a replacement: its failure is a loss
        if (not self._min_workers or failed.spec.role is not Role.WORKER
                or not (code > 128 or code in (EXIT_CONNECTION_LOST, EXIT_LEFT) or restarted)):
            return None
        self._lost.append(failed)
        workers = sum(1 for c in self._children if c.spec.role is Role.WORKER
                      and c not in self._restarted)
        joining = [c for c in self._children if c is not failed and c.joining]
        left = workers - len(self._lost) - len(joining)
        if left >= self._min_workers and self._restart(failed):
            return True
        if left >= self._min_workers:
            self._log("%s %s; the job goes on with %d of %d workers (--min-workers %d)"
                      % (failed.spec.label, describe_exit(failed.proc.returncode), left,
                         workers, self._min_workers))
            return True
        lost = ", ".join("%s %s" % (c.spec.label, describe_exit(c.proc.returncode))
                         for c in self._lost)
        self._log("%s: %d of %d workers left, fewer than --min-workers %d%s; stopping all "
                  "processes" % (lost, left, workers, self._min_workers,
                                 " (restarted, not joined yet: %s)" % _labels(joining)
                                 if joining else ""))
        return False

    def _restart(self, failed: "_Child") -> bool:
        """Start the lost worker ``failed`` again if it has restarts left (said, with why)."""
        done = int(failed.spec.env.get(RESTART_COUNT, 0))
        if done >= self._max_restarts:
            if self._max_restarts:
                self._log("%s %s; not restarted: --max-restarts %d used up"
                          % (failed.spec.label, describe_exit(failed.proc.returncode),
                             self._max_restarts))
            return False
        spec = dataclasses.replace(failed.spec, env={**failed.spec.env,
                                                     RESTART_COUNT: str(done + 1)})
        self._log("%s %s; restarting it (restart %d of %d); it takes its place back at the "
                  "others' next commit" % (failed.spec.label,
                                           describe_exit(failed.proc.returncode), done + 1,
                                           self._max_restarts))
        self._lost.remove(failed)
        self._restarted.append(failed)
        self._children.append(_Child(spec, self._starter, self._base_env, self._log_dir))
        return True

    def _stop_unjoined(self, running: List[_Child], now: float,
                       since: Optional[float]) -> Optional[float]:
        """Restarted workers still running UNJOINED_GRACE_S after every other worker
        finished (exit 0) never joined: the job's training was over. They are stopped, and
        their exit is no failure. Returns since when that is so (None: it is not)."""
        workers = [c for c in running if c.spec.role is Role.WORKER]
        if (not workers or any(RESTART_COUNT not in c.spec.env for c in workers)
                or not any(c.spec.role is Role.WORKER and c.proc.returncode == 0
                           for c in self._children)):
            return None
        if since is None or now - since < UNJOINED_GRACE_S:
            return since or now
        self._log("%s: restarted, had not joined when the other workers finished the job; "
                  "stopping it" % _labels(workers))
        for child in workers:
            self._unjoined.append(child)
            child.close_pipe()
        return None

    def _killed_with_us(self, failed: "_Child") -> bool:
        """Whether ``failed`` was killed by a signal that reached us too: a Ctrl-C goes to
        the terminal's whole foreground group, and salloc may cancel the job's steps on it;
        a node that died of it first must not be taken for the cause."""
        code = exit_status(failed.proc.returncode)
        if self._signal is not None or code <= 128:
            return False
        deadline = time.monotonic() + SIGNAL_RACE_S
        while self._signal is None and time.monotonic() < deadline:
            time.sleep(POLL_INTERVAL_S)
        return self._signal is not None

    def _stop_all(self) -> None:
        """The stop word down every pipe (each guard stops its node and exits 0), SIGTERM to
        the groups still running after a while, SIGKILL what is left after a grace, reap. The
        word first: under Slurm a SIGTERM to srun cancels its step, and slurmstepd and srun
        then print two lines per node."""
        alive = [c for c in self._children if c.running]
        for child in self._children:
            child.close_pipe()
        deadline = time.monotonic() + WORD_GRACE_S
        while any(c.running for c in alive) and time.monotonic() < deadline:
            time.sleep(POLL_INTERVAL_S)
        for child in self._children:
            child.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while any(c.running for c in alive) and time.monotonic() < deadline:
            time.sleep(POLL_INTERVAL_S)
        stubborn = [c for c in alive if c.running]
        if stubborn:
            self._log("%s still running %g s after SIGTERM; sending SIGKILL"
                      % (_labels(stubborn), STOP_GRACE_S))
        for child in self._children:
            child.signal_group(signal.SIGKILL)
        for child in self._children:
            try:
                child.proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self._log("%s (pid %d) survived SIGKILL" % (child.spec.label, child.proc.pid))
        self._join_outputs()

    def _join_outputs(self) -> None:
        # A grandchild that inherited a pipe could hold it open forever: join with a deadline.
        deadline = time.monotonic() + READER_JOIN_S
        for child in self._children:
            for output in child.outputs:
                output.thread.join(max(0.0, deadline - time.monotonic()))
            if child.log is not None:
                child.log.close()


def _labels(children: Sequence[_Child]) -> str:
    return ", ".join(c.spec.label for c in children)
