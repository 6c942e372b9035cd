"""What a worker's engine does that depends on the training mode (``config.TrainingMode``)
beyond what the mode says of itself: backup workers tell the servers when this worker pushes
nothing for a while. Pure: ``command`` sends through the caller's KV worker."""
from typing import Callable

from ..config import TrainingMode
from ..mxproto import Presence, ServerCommand

__all__ = ["tell_presence"]


def tell_presence(mode: TrainingMode, command: Callable, presence: Presence) -> None:
    """Backup workers: tell the servers that this worker pushes nothing for now (it waits in a
    barrier), has finished training, or is back; ``command(head, body, what)`` sends and
    waits. Nothing in the other modes."""
    if mode.backup_workers:
        command(ServerCommand.BYTEPS_ABSENT, presence.value,
                "telling the servers this worker is %s" % presence.name.lower())
