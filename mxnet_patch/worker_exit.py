"""How a ``dist_byteps`` worker process ends: its store closed in an exit hook that runs before
any ``atexit`` handler, and the exit status the process leaves with.

A program that ended normally leaves the job as MXNet's workers do; one that exited with a
status (``sys.exit(N)``, recorded by :mod:`mxnet_patch.exit_status`) ends the job for every
node; one that raised gives the other workers a little time to leave with it. An exit hook
cannot raise, so a failure to leave exits the process with status 1 after one line saying why.
"""
import atexit
import logging
import os
import sys
import threading

from mxnet_patch import exit_status

__all__ = ["LEAVE_AFTER_FAILURE_S", "END_JOB_WAIT_S", "close_at_exit", "leave_at_exit"]

log = logging.getLogger("mxnet_patch.kvstore")     # the store says it, as it always did

#: After the script raised, how long the other workers get to leave the job with this one.
LEAVE_AFTER_FAILURE_S = 10.0
#: how long a worker whose program exited with a status waits for the scheduler's notice that
#: ended the job (sent to every node at once) before it exits anyway
END_JOB_WAIT_S = 2.0


def _flush_and_exit(code: int) -> None:
    """Exit now with ``code`` (from an exit hook, which cannot raise), output flushed first."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def close_at_exit(close) -> None:
    """Run ``close`` when the main thread has finished, before any ``atexit`` handler.

    A script may end with pushpulls still queued (any script without a final ``waitall``
    or a read of its outputs): ``close`` completes them, which needs the van. ``atexit``
    handlers run last-registered first, and pyzmq registers its garbage collector's (which
    zero-copy sends need) only at the first such send, after this store was made; MXNet's
    engine shutdown is one too. Python runs the ``threading`` module's exit hooks first (as
    ``concurrent.futures`` relies on), so ``close`` registered there still finds everything
    working.
    """
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        try:
            register(close)
            return
        except RuntimeError:    # the interpreter is already shutting down
            pass
    atexit.register(close)


def leave_at_exit(close, rank: int, postoffice, joining=lambda: False) -> None:
    """Record the program's exit status from now on and, as the process ends, leave the job
    (:class:`LeaveAtExit`): ``close(leave_within=None, ending=None)`` closes the store,
    ``rank`` is the worker's, ``postoffice`` its engine's (to end the job, see it aborted);
    ``joining()``: whether it is a late worker of an elastic job that has not joined yet."""
    exit_status.install()          # the program's sys.exit(N), for LeaveAtExit
    close_at_exit(LeaveAtExit(close, rank, postoffice, joining))


class LeaveAtExit:
    """The store's close as the process ends. If leaving fails (the scheduler is gone, say),
    the process exits with status 1 after one line saying why: a job whose shutdown failed
    must not look like a success, and an exit hook cannot raise (Python would print the
    traceback and exit 0).

    A program that exited with a status other than 0 (``sys.exit(N)``, recorded by
    :mod:`mxnet_patch.exit_status`) ends the job for every node at once, saying so, and
    every node exits with N (the launchers pass it on): the others may be waiting for this
    one's next push, and would keep it until BYTEPS_REQUEST_TIMEOUT.

    A script that ended with an uncaught exception (Python printed it and set
    ``sys.last_value``) gives the other workers LEAVE_AFTER_FAILURE_S to leave with it
    (they do when they all failed alike, e.g. a refused setting, and the servers then stop
    as usual): the others may instead be waiting for this one's next push, and would keep
    it until BYTEPS_REQUEST_TIMEOUT. Then it exits 1 (Python's status for an uncaught
    exception) and the launcher stops the job, naming this worker. A worker stopped by a
    job that another node ended exits with that job's status. A late worker of an elastic job
    that had not joined yet is in no round and no barrier: it exits 1 at once (it leaves) if
    its program failed, and exits as its program did where the others finished the job
    first."""

    def __init__(self, close, rank: int, postoffice, joining=lambda: False):
        self.close, self.rank, self.postoffice = close, rank, postoffice
        self.joining = joining

    def __call__(self) -> None:
        from kvstore_byteps.errors import JobFinished
        failure = getattr(sys, "last_value", None)
        status = exit_status.requested()
        if isinstance(self.postoffice.error, JobFinished):
            return      # a late worker the others finished without: in no round, no barrier
        if failure is not None and self.joining():
            log.error("dist_byteps worker rank %s stops on an uncaught %s before it joined the "
                      "job: it leaves", self.rank, type(failure).__name__)
            _flush_and_exit(1)
        if failure is None and status:
            self._end_job_exiting(status)
            return
        try:
            if failure is None:
                self.close()
            else:
                self.close(LEAVE_AFTER_FAILURE_S, ending="its program stopped on an uncaught "
                           "%s: %s" % (type(failure).__name__, str(failure).split("\n")[0]))
        except Exception as exc:    # KVStoreBytePSError, or MXNet's error from waitall
            self._exit_if_aborted()
            if failure is not None:
                log.error("dist_byteps worker rank %s stops on an uncaught %s; the other workers "
                          "did not stop with it within %g s: it leaves without them", self.rank,
                          type(failure).__name__, LEAVE_AFTER_FAILURE_S)
            else:
                log.error("dist_byteps worker rank %s could not leave the job cleanly: %s",
                          self.rank,
                          str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            _flush_and_exit(1)
        if failure is not None:
            self._exit_if_aborted()

    def _exit_if_aborted(self) -> None:
        """A job that a node ended (its reason said, in one line, on every node): exit now
        with its status (another node's ``sys.exit(N)``: N)."""
        from kvstore_byteps.errors import JobAbortedError, exit_status as aborted_status
        aborted = self.postoffice.error
        if isinstance(aborted, JobAbortedError):
            _flush_and_exit(aborted_status(aborted))

    def _end_job_exiting(self, status) -> None:
        """The program exited with ``status`` (not 0): end the job for every node, which all
        exit with it, and exit at once with ``status``, without the shutdown barriers: first,
        so that the launchers name this worker (the others stop on the notice)."""
        reason = "its program exited with status %d (sys.exit)" % status
        log.error("dist_byteps worker rank %s: %s; the job ends for every node", self.rank,
                  reason)
        postoffice = self.postoffice
        try:
            postoffice.end_job(reason, status)
        except Exception as exc:    # the scheduler is gone: the launcher ends the job
            log.debug("could not ask the scheduler to end the job: %s", exc)
        else:   # the scheduler's notice, sent to every node, stops this one's van too
            postoffice.wait_stopped(END_JOB_WAIT_S)
        _flush_and_exit(status)
