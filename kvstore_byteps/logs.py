"""Logging set-up for command-line entry points (the library itself only creates loggers),
and :class:`PeerLog`, which keeps a misbehaving peer from flooding the log."""
import logging
import os
import sys
import threading

from .config import Config
from .errors import ClusterStartError, ConfigError, JobAbortedError

_LEVELS = {"TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO,
           "WARNING": logging.WARNING, "ERROR": logging.ERROR, "FATAL": logging.CRITICAL}


def _level(config: Config) -> int:
    """BYTEPS_LOG_LEVEL, lowered to INFO by PS_VERBOSE=1 and to DEBUG by PS_VERBOSE>=2."""
    level = _LEVELS[config.log_level]
    if config.verbose:
        level = min(level, logging.INFO if config.verbose == 1 else logging.DEBUG)
    return level


def _format(who: str) -> str:
    return "%(asctime)s " + who + " %(levelname)s %(name)s: %(message)s"


def setup_logging(config: Config, who: str) -> None:
    """Log to stderr at BYTEPS_LOG_LEVEL (PS_VERBOSE >= 1 lowers it to INFO, 2 to DEBUG)."""
    logging.basicConfig(level=_level(config), format=_format(who))


#: The loggers of the library proper (worker processes: the user's program owns the root logger).
LIBRARY_LOGGERS = ("kvstore_byteps", "mxnet_patch")
_QUIET_LEVELS = ("ERROR", "FATAL")


def setup_library_logging(config: Config, who: str) -> None:
    """In a user's process (a worker): our loggers at BYTEPS_LOG_LEVEL / PS_VERBOSE, to stderr.

    Only our own loggers get a handler (once), and they stop propagating, so the user's logging
    set-up is untouched and our lines are not printed twice.
    """
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(_level(config))
        if not any(getattr(h, "_kvstore_byteps", False) for h in logger.handlers):
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter(_format(who)))
            handler._kvstore_byteps = True
            logger.addHandler(handler)
        logger.propagate = False


def announce(config: Config, text: str) -> None:
    """One start-up line on stderr that users see by default (not with BYTEPS_LOG_LEVEL=ERROR)."""
    if config.log_level not in _QUIET_LEVELS:
        print("[kvstore_byteps] " + text, file=sys.stderr, flush=True)


def config_errors_in_one_line() -> None:
    """In a user's process (a worker): a ConfigError, ClusterStartError or JobAbortedError of
    ours that nothing caught ends the process with one line on stderr (and exit code 1, as any uncaught exception), not a traceback: it
    says what to set, and the traceback through the user's script and ours says nothing more.
    Every other exception still reaches the hook that was there before. Idempotent."""
    previous = sys.excepthook
    if getattr(previous, "_kvstore_byteps", False):
        return

    def hook(kind, error, traceback):
        if isinstance(error, ConfigError):
            print("[kvstore_byteps] configuration error: %s" % error, file=sys.stderr, flush=True)
        elif isinstance(error, ClusterStartError):     # it names the peer and what to check
            print("[kvstore_byteps] the cluster did not form: %s" % error, file=sys.stderr,
                  flush=True)
        elif isinstance(error, JobAbortedError):       # it names who ended the job, and why
            print("[kvstore_byteps] the job was ended: %s" % _first_line(error),
                  file=sys.stderr, flush=True)
        else:
            previous(kind, error, traceback)
    hook._kvstore_byteps = True
    sys.excepthook = hook


def _first_line(error: BaseException) -> str:
    """``error``'s message without the type and notes MXNet's engine adds when it raises it
    again in the program (``JobAbortedError: ...`` then ``in kvstore-byteps stage ...``)."""
    text = str(error).split("\n")[0]
    prefix = type(error).__name__ + ": "
    return text[len(prefix):] if text.startswith(prefix) else text


def uptime() -> str:
    """``4.2 s after this process started`` (Linux's /proc), or empty."""
    try:
        with open("/proc/self/stat") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            now = float(f.read().split()[0])
        return "%.1f s after this process started" % (now - started / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return ""


class PeerLog:
    """Logs the first problem of each peer in full (with the traceback, if asked for) and
    after that only every ``every``-th, with a count: a peer sending thousands of bad messages
    must not bury the log, and the first one still says what was wrong."""

    def __init__(self, logger: logging.Logger, every: int = 1000):
        self.logger, self.every = logger, every
        self._counts = {}
        self._lock = threading.Lock()

    def warning(self, peer, text: str, *args, exc_info: bool = False) -> None:
        self._log(logging.WARNING, peer, text, args, exc_info)

    def error(self, peer, text: str, *args, exc_info: bool = False) -> None:
        self._log(logging.ERROR, peer, text, args, exc_info)

    def _log(self, level: int, peer, text: str, args, exc_info: bool) -> None:
        with self._lock:
            count = self._counts[peer] = self._counts.get(peer, 0) + 1
        if count == 1:
            self.logger.log(level, text + " (more problems from this peer: only counted)", *args,
                            exc_info=exc_info)
        elif count % self.every == 0:
            self.logger.log(level, "%d problems from %s so far, the latest: " + text, count,
                            peer, *args)

    def count(self, peer) -> int:
        with self._lock:
            return self._counts.get(peer, 0)
