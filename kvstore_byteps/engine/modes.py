"""How the job trains, as a worker's engine sees it: one object asked instead of flags tested.

* synchronous (the default): servers sum each round; the workers update;
* asynchronous (``BYTEPS_ENABLE_ASYNC=1``): servers add each worker's change into the weights;
* backup workers (``BYTEPS_BACKUP_WORKERS=b``): synchronous rounds that complete without the
  b slowest workers; servers keep the weights and run the optimizer.

Workers tell our servers which one in the server probe; a server that trains otherwise refuses
(see ``serving/byteps.py``). Pure: no network here (``absent`` sends through the caller's KV
worker).
"""
import dataclasses
from typing import Callable, Optional

from ..config import Config, Env
from ..mxproto import Presence, ServerCommand

__all__ = ["TrainingMode"]


@dataclasses.dataclass(frozen=True)
class TrainingMode:
    """The job's training mode, from the configuration every node reads alike."""

    #: ``Config.training_mode``: what a worker tells the servers in the probe
    name: str
    #: the variable that chose it (None: plain synchronous training)
    variable: Optional[str]
    backup_workers: int = 0

    @classmethod
    def of(cls, config: Config) -> "TrainingMode":
        variable = (Env.ENABLE_ASYNC if config.enable_async else
                    Env.BACKUP_WORKERS if config.backup_workers else None)
        return cls(config.training_mode, variable, config.backup_workers)

    @property
    def summed(self) -> bool:
        """Rounds of sums that the workers apply themselves (plain synchronous training)."""
        return self.variable is None

    @property
    def asynchronous(self) -> bool:
        return self.variable == Env.ENABLE_ASYNC

    def refusal(self, extensions_missing: Optional[str]) -> Optional[str]:
        """Why this mode cannot run against the servers found (``extensions_missing``: what
        MXNet's servers lack), or None. MXNet's servers keep a push instead of adding it and
        know no backup workers: every update would be silently wrong."""
        if self.summed or not extensions_missing:
            return None
        return ("%s needs kvstore-byteps servers; %s (or train with MXNet's own "
                "dist_sync/dist_async on them)" % (self.variable, extensions_missing))

    @property
    def unrestorable(self) -> Optional[str]:
        """Why a restarted server cannot be restored in this mode, or None."""
        return None if self.summed else "training %s, the server kept the weights" % self.name

    @property
    def compression_refusal(self) -> Optional[str]:
        if self.summed:
            return None
        return ("gradient compression needs synchronous training without backup workers "
                "(unset %s)" % self.variable)

    def absent(self, command: Callable, presence: Presence) -> None:
        """Backup workers: tell the servers that this worker pushes nothing for now (it waits
        in a barrier), has finished training, or is back; ``command(head, body, what)`` sends
        and waits."""
        if self.backup_workers:
            command(ServerCommand.BYTEPS_ABSENT, presence.value,
                    "telling the servers this worker is %s" % presence.name.lower())
