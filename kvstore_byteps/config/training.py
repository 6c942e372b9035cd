"""The job's training mode (synchronous, asynchronous, backup workers), as every node reads it,
and what each mode refuses: servers that cannot run it, a restarted server, compression. Pure."""
import dataclasses
from typing import Optional

from ..words import count
from .variables import Env
from .vocabulary import Training

#: BYTEPS_BACKUP_WAIT's default: a round with its W - b pushes waits at most this percentage
#: of the key's last round for the workers still on time (serving/backup_rounds.py)
BACKUP_WAIT_PERCENT = 25


@dataclasses.dataclass(frozen=True)
class TrainingMode:
    """The job's training mode, as every node reads it from its environment
    (``Config.training_mode``). Workers tell our servers theirs in the server probe
    (:attr:`name`), and a server that trains otherwise refuses them: a sum taken for weights,
    or weights for a sum, would be silently wrong. Pure."""

    kind: Training = Training.SYNC
    backup_workers: int = 0
    #: BYTEPS_BACKUP_WAIT, a percentage (the servers' alone: not part of the mode's name)
    backup_wait: int = dataclasses.field(default=BACKUP_WAIT_PERCENT, compare=False)

    @classmethod
    def of(cls, enable_async: bool, backup_workers: int,
           backup_wait: int = BACKUP_WAIT_PERCENT) -> "TrainingMode":
        """The mode ``BYTEPS_ENABLE_ASYNC`` and ``BYTEPS_BACKUP_WORKERS`` choose (unchecked),
        with ``BYTEPS_BACKUP_WAIT``."""
        if enable_async:
            return cls(Training.ASYNC)
        return (cls(Training.BACKUP_WORKERS, backup_workers, backup_wait) if backup_workers
                else cls())

    @classmethod
    def parse(cls, text: str) -> Optional["TrainingMode"]:
        """The mode whose :attr:`name` is ``text`` (a worker's probe), or None."""
        words = text.split(" ")
        backup = int(words[2]) if len(words) > 2 and words[2].isdecimal() else 0
        modes = [cls(), cls(Training.ASYNC)] + [cls(Training.BACKUP_WORKERS, backup)] * (backup > 0)
        return next((mode for mode in modes if mode.name == text), None)

    @property
    def name(self) -> str:
        """``sync``, ``async`` or ``sync with N backup workers``: what a worker tells the
        servers in the probe."""
        if self.kind is Training.BACKUP_WORKERS:
            return "sync with %s" % count(self.backup_workers, "backup worker")
        return self.kind.value

    @property
    def variable(self) -> Optional[str]:
        """The variable that chose this mode (None: plain synchronous training)."""
        return {Training.SYNC: None, Training.ASYNC: Env.ENABLE_ASYNC,
                Training.BACKUP_WORKERS: Env.BACKUP_WORKERS}[self.kind]

    @property
    def summed(self) -> bool:
        """Rounds of sums that the workers apply themselves (plain synchronous training)."""
        return self.kind is Training.SYNC

    @property
    def asynchronous(self) -> bool:
        return self.kind is Training.ASYNC

    def refusal(self, extensions_missing: Optional[str]) -> Optional[str]:
        """Why this mode cannot run against the servers found (``extensions_missing``: what
        MXNet's servers lack), or None. MXNet's servers keep a push instead of adding it and
        know no backup workers: every update would be silently wrong."""
        if self.summed or not extensions_missing:
            return None
        return ("%s needs kvstore-byteps servers; %s (or train with MXNet's own "
                "dist_sync/dist_async on them)" % (self.variable, extensions_missing))

    @property
    def unrecoverable(self) -> Optional[str]:
        """Why a restarted server cannot be recovered in this mode, or None."""
        return None if self.summed else "training %s, the server kept the weights" % self.name

    @property
    def compression_refusal(self) -> Optional[str]:
        if self.summed:
            return None
        return ("gradient compression needs synchronous training without backup workers "
                "(unset %s)" % self.variable)
