"""Error hierarchy of kvstore-byteps.

Errors are split by whose fault they are: ``ConfigError`` (the user's environment),
``ProtocolError`` (a peer sent something malformed), ``PeerError`` (a peer is gone or
answered with an error), ``DeadlineError`` (a wait ran past its deadline; the message names
what was awaited).
"""
import time


class KVStoreBytePSError(Exception):
    """Base class of every error raised by kvstore-byteps."""


class ConfigError(KVStoreBytePSError, ValueError):
    """A configuration value (usually an environment variable) is missing or invalid."""


class ProtocolError(KVStoreBytePSError):
    """A message received from a peer violates the wire protocol."""


class PeerError(KVStoreBytePSError):
    """A peer failed: it disconnected, or answered a request with an error."""


class DeadlineError(KVStoreBytePSError, TimeoutError):
    """A wait ran past its deadline. The message names what was awaited."""


class ClusterStartError(DeadlineError):
    """The cluster did not form in time (scheduler unreachable, nodes missing)."""


#: How a server marks, in the text of an error answer (all the wire carries), that it refused the
#: worker's configuration (a ConfigError at the server): the worker then raises ConfigError too.
CONFIG_REFUSAL = "configuration: "


def config_refusal(text: str) -> str:
    """The error answer of a server that refuses a worker's configuration for ``text``."""
    return CONFIG_REFUSAL + text


def refused_configuration(error: str):
    """The refusal's text if ``error`` (an error answer) refused the configuration, else None."""
    return error[len(CONFIG_REFUSAL):] if error.startswith(CONFIG_REFUSAL) else None


class TrainingOver(SystemExit):
    """Raised by a worker's next training step once the job's training is over without it:
    with backup workers (``BYTEPS_BACKUP_WORKERS=b``) the job ends when ``W - b`` workers
    finished, and a worker still training then stops. It derives from ``SystemExit`` with exit
    status 0: uncaught, the process ends cleanly (its store closes as at any exit), and
    ``except Exception`` does not swallow it. Catch it to run code after the training loop on
    that worker (e.g. ``kvstore_byteps.finish_training`` and saving on rank 0). In an elastic
    job, a late worker's ``State()`` raises it where the others finished before it joined."""

    def __init__(self, message: str):
        super().__init__(0)
        self.message = message

    def __str__(self) -> str:
        return self.message


#: How a server marks, in the text of an error answer, that the job's training is over (backup
#: workers): the worker's step is not an error, its next step raises :class:`TrainingOver`.
TRAINING_OVER = "training over: "


def training_over(error) -> bool:
    """Whether ``error`` (a failed request's exception, or None) says the training is over."""
    return isinstance(error, PeerError) and TRAINING_OVER in str(error)


class AuthenticationError(ConfigError):
    """A peer did not prove it holds the cluster's key (``BYTEPS_AUTH_KEY``), or refused ours.
    The message names the peer and the likely cause (a different key, or no key on one side)."""


class JobAbortedError(PeerError):
    """A node ended the job on purpose and said why (e.g. a server refused the optimizer that
    MXNet's workers sent, which they would not notice): every node stops with the reason, and
    exits with :attr:`status` (a worker's ``sys.exit(N)``: N; otherwise 1)."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status if 0 < status < 256 else 1
        #: another node ended the job (this node's postoffice sets it)
        self.elsewhere = False

    def again(self) -> "JobAbortedError":
        """A new error of this type saying the same (raised again where this node's work
        stops)."""
        error = type(self)(str(self), self.status)
        error.elsewhere = self.elsewhere
        return error


class JobFinished(JobAbortedError):
    """The other workers finished the job before this late worker (elastic workers, seated in
    a departed or vacant place) joined it: it has nothing to train. Its ``State()`` raises
    :class:`TrainingOver` for it (exit status 0)."""

    @property
    def reason(self) -> str:
        """The scheduler's words, without what this worker was doing when they came (the
        errors raised from this one add that)."""
        error, seen = self, {id(self)}
        while isinstance(error.__cause__, JobFinished) and id(error.__cause__) not in seen:
            error = error.__cause__
            seen.add(id(error))
        return str(error)


#: the exit status of a worker that was taken for lost (elastic workers: it stalled, or its
#: link went down, past the heartbeat timeout) and left the job while it lived on: launch.py
#: counts it lost, and restarts it with --max-restarts (BSD's EX_TEMPFAIL: try again)
EXIT_LEFT = 75

#: how a late worker's log line says it joined (engine/joins.py): launch.py reads it in a
#: restarted worker's output, and counts it back in the job from then on
JOINED_LINE = "joined the job at the other workers' commit"

#: a node stopped by a job another node ended exits this much later, so that the node that
#: ended it exits first and the launchers, which name the first node that failed, name it
EXIT_AFTER_OTHERS_END_S = 1.0


def exit_status(error: BaseException) -> int:
    """The exit status a node that stops on ``error`` ends with: a job's abort status, else 1.
    A job another node ended: after EXIT_AFTER_OTHERS_END_S (blocking)."""
    if not isinstance(error, JobAbortedError):
        return 1
    if error.elsewhere:
        time.sleep(EXIT_AFTER_OTHERS_END_S)
    return error.status
