"""Runs one node's command and ties its life to the launcher's: ``python -m kvstore_byteps.launcher.guard``.

The launcher starts every node through this guard with a pipe as the guard's standard input, and
writes to it only :data:`STOP_WORD` when it stops the job on purpose (the guard then stops its
node without a word: the launcher has said why). When the launcher dies, however it dies (SIGKILL included), the kernel closes
the pipe; over ssh the remote sshd closes the channel when the ssh client dies. Either way the
guard reads end-of-file and stops the node's whole process group (SIGTERM, then SIGKILL after a
grace), so no scheduler, server or worker outlives its launcher, locally or on a remote host.
The guard also forwards SIGTERM/SIGINT/SIGHUP to the group and exits with the node's status
(128 + N for a node killed by signal N), except when the launcher stopped it with its word: then
0, since the launcher has decided the job's status and said why (under Slurm a status other
than 0 made srun print a line per node, and a step that srun had to cancel two).

    python -m kvstore_byteps.launcher.guard [--cwd DIR] [--path-prepend DIR] -- CMD [ARGS...]
"""
import argparse
import os
import selectors
import signal
import subprocess
import sys
from typing import List, Mapping, Optional, Sequence

from .procs import EXIT_CANNOT_START, die_with_parent, exit_status

KILL_GRACE_S = 3.0
#: What the launcher writes on the pipe before closing it when it stops the job itself.
STOP_WORD = b"stop\n"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _say(text: str) -> None:
    """A guard message on stderr, best effort: when the launcher is gone, so is the pipe our
    stderr goes to, and the guard must still stop its node (a BrokenPipeError must not win)."""
    try:
        print("[guard] " + text, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


class Guard:
    """One node's process group, its exit status, and the watch on the launcher's pipe."""

    def __init__(self, argv: Sequence[str], cwd: Optional[str] = None,
                 env: Optional[Mapping[str, str]] = None, output: Optional[int] = None):
        guard_pid = os.getpid()
        #: the stop signal passed on to the node, if any (it did not fail by itself then)
        self.signalled: Optional[int] = None
        self.stopped_by_launcher = False     # its word came: the launcher stops the job
        self.proc = subprocess.Popen(
            # output: None (ours) or subprocess.PIPE (stdout and stderr, for whoever copies them)
            list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=output, stderr=output,
            start_new_session=True,
            preexec_fn=lambda: die_with_parent(signal.SIGKILL, guard_pid))

    def _forward(self, signum: int) -> None:
        # Once: a stop comes both as the launcher's word and as its signal, and some nodes take
        # a second signal as "give up now" (mpirun then exits before stopping its ranks).
        if self.signalled is None:
            self.signalled = signum
            self.signal_group(signum)

    def signal_group(self, signum: int) -> None:
        """Signal the node's process group (it may outlive the node's first process)."""
        try:
            os.killpg(self.proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Signal the group, and SIGKILL it if the node is still running after the grace."""
        self._forward(signum)
        try:
            self.proc.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            _say("%s still running %g s after %s; sending SIGKILL"
                 % (self.proc.args[0], KILL_GRACE_S, signal.Signals(signum).name))
            self.signal_group(signal.SIGKILL)
            try:
                self.proc.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:  # e.g. stuck in the kernel (D state)
                _say("%s (pid %d) survived SIGKILL for %g s; leaving it"
                     % (self.proc.args[0], self.proc.pid, KILL_GRACE_S))

    def run(self, watch_fd: Optional[int], early_signal: Optional[int] = None) -> int:
        """Wait for the node or for end-of-file on ``watch_fd``; return the shell exit status.
        ``early_signal``: a stop signal that arrived while the node was being started."""
        for signum in STOP_SIGNALS:
            signal.signal(signum, lambda s, _f: self._forward(s))
        if early_signal is not None:
            self._forward(early_signal)
        selector = selectors.DefaultSelector()
        if watch_fd is not None:
            try:
                selector.register(watch_fd, selectors.EVENT_READ)
            except (ValueError, OSError):  # not a pipe/socket (e.g. a file): nothing to watch
                watch_fd = None
        try:
            self._watch(selector, watch_fd)
        finally:
            if self.proc.poll() is None:  # the guard itself failed: never leave the node behind
                self.signal_group(signal.SIGKILL)
        code = self.proc.poll()   # finished, or stop() gave up on it after SIGKILL
        self.signal_group(signal.SIGKILL)  # whatever the node left behind in its group
        if self.stopped_by_launcher:
            return 0
        return exit_status(code) if code is not None else 128 + signal.SIGKILL

    def _watch(self, selector, watch_fd: Optional[int]) -> None:
        while self.proc.poll() is None:
            if watch_fd is not None and selector.select(timeout=0.2):
                try:
                    data = os.read(watch_fd, 4096)
                except OSError:
                    data = b""
                if not data or STOP_WORD in data:
                    if STOP_WORD not in data:  # no word: the launcher died
                        _say("the launcher went away; stopping %s" % self.proc.args[0])
                    self.stopped_by_launcher = STOP_WORD in data
                    self.stop()
                    return
            elif watch_fd is None:
                try:
                    self.proc.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    pass


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point; see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m kvstore_byteps.launcher.guard",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--cwd", help="run the node in this directory")
    parser.add_argument("--path-prepend", metavar="DIR",
                        help="put DIR first on PATH (the launcher's Python's bin directory)")
    parser.add_argument("--no-watch", action="store_true",
                        help="do not watch standard input for the launcher going away")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("missing the node's command")
    env = None
    if args.path_prepend:  # what activating a virtualenv does, so `python train.py` is ours
        env = dict(os.environ, PATH=args.path_prepend + os.pathsep + os.environ.get("PATH", ""))
    if args.cwd and not os.path.isdir(args.cwd):
        _say("cannot run %s: directory %s does not exist on this host" % (command[0], args.cwd))
        return EXIT_CANNOT_START
    # A stop signal (e.g. the launcher's death signal) may come while the node is starting:
    # note it, start the node, then pass it on, so the node never runs on unguarded.
    early: List[int] = []
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda s, _f: early.append(s))
    try:
        guard = Guard(command, cwd=args.cwd, env=env)
    except OSError as exc:
        _say("cannot start %s: %s" % (command[0], exc))
        return EXIT_CANNOT_START
    return guard.run(None if args.no_watch else sys.stdin.fileno(),
                     early[0] if early else None)


if __name__ == "__main__":
    sys.exit(main())
