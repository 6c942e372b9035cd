"""What the data paths that keep the weights on the servers (asynchronous training, backup
workers) share: which version of each key's weights every worker last read, and the workers'
commands about themselves. Pure.

Each key's ``rounds`` (:class:`~.asynchronous.Versions`, :class:`~.backup_rounds.BackupRounds`)
counts the changes to its weights and the count each worker last read; a worker that closes
with an older count holds weights that differ from the servers' final ones and is told so
(``BYTEPS_STALE``). ``BYTEPS_ABSENT`` says where a worker is (:class:`~..mxproto.Presence`).
"""
from typing import Optional

from ..errors import ProtocolError
from ..mxproto import Presence, ServerCommand
from .datapath import DataPath

__all__ = ["KeptWeights"]


class KeptWeights(DataPath):
    """Base of the data paths whose servers keep the weights: the reads they note."""

    @staticmethod
    def note_read(sender: int, key) -> None:
        """``sender`` read ``key``'s weights with a plain pull."""
        key.rounds.note_read(sender)

    @staticmethod
    def stale(sender: int, keys) -> int:
        """How many of ``keys`` ``sender`` last read before their latest change."""
        return sum(1 for key in keys if key.rounds.stale(sender))

    def worker_command(self, head, sender: int, body: bytes, keys) -> Optional[bytes]:
        """``BYTEPS_STALE``: how ``sender``'s weights compare (answered here);
        ``BYTEPS_ABSENT``: rounds stop (or start) waiting for it (the server answers)."""
        if head == ServerCommand.BYTEPS_STALE:
            return b"%d/%d" % (self.stale(sender, keys), len(keys))
        if head == ServerCommand.BYTEPS_WAITING:    # rounds here never wait for one worker
            return b""
        try:
            presence = Presence(body)
        except ValueError:
            raise ProtocolError("BYTEPS_ABSENT with body %r" % body) from None
        self.absent(sender, presence, keys)
        return None

    def absent(self, sender: int, presence: Presence, keys) -> None:
        """``sender`` is away, back or done (``presence``)."""
