"""The exit status a worker's program asked for, recorded as ``sys.exit(N)``, ``exit(N)`` or
``quit(N)`` is called on the main thread.

A ``dist_byteps`` worker leaves the job in an exit hook (mxnet_patch/worker_exit.py), and an exit
hook cannot read the status: Python works it out of the SystemExit after the program ended,
where no Python code sees it. The worker needs it: a program that exits with a status other
than 0 while the others still train would otherwise wait for them in the shutdown barrier
while they wait for its pushes (BYTEPS_REQUEST_TIMEOUT, 300 s), and the launcher would report
the exit status 1 of that failure instead of the program's. A program that raises SystemExit
itself, or catches the SystemExit of a call and goes on, is not told apart: the first leaves
as a program that ended normally, the second as one that exited with the caught status.
"""
import builtins
import sys
import threading
from typing import Optional

__all__ = ["install", "requested"]

_requested: Optional[tuple] = None      # (the argument of the exit call,) once made


def _record(status) -> None:
    global _requested
    if threading.current_thread() is threading.main_thread():   # elsewhere it ends a thread
        _requested = (status,)


class _RecordingExit:
    """``builtins.exit``/``quit`` (site's Quitter objects) that record their status first."""

    def __init__(self, quitter):
        self._quitter = quitter

    def __call__(self, code=None):
        _record(code)
        self._quitter(code)

    def __repr__(self):
        return repr(self._quitter)


def install() -> None:
    """Record the status of every exit call from now on. Idempotent."""
    if getattr(sys.exit, "_kvstore_byteps", False):
        return
    original = sys.exit

    def exit(status=None):
        _record(status)
        original(status)
    exit._kvstore_byteps = True
    exit.__doc__ = original.__doc__
    sys.exit = exit
    for name in ("exit", "quit"):
        quitter = getattr(builtins, name, None)
        if quitter is not None and not isinstance(quitter, _RecordingExit):
            setattr(builtins, name, _RecordingExit(quitter))


def requested() -> Optional[int]:
    """The exit status the program asked for, as Python makes it (None: 0; an int: itself, as
    the system keeps its low byte; anything else is printed: 1); None if it asked for none."""
    if _requested is None:
        return None
    status = _requested[0]
    if status is None:
        return 0
    if isinstance(status, int):
        return status & 0xFF
    return 1
