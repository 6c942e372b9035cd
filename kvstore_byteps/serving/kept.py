"""What the data paths that keep the weights on the servers (asynchronous training, backup
workers) share: which version of each key's weights every worker last read. Pure.

Each key's ``rounds`` (:class:`~.asynchronous.Versions`, :class:`~.backup_rounds.BackupRounds`)
counts the changes to its weights and the count each worker last read; a worker that closes
with an older count holds weights that differ from the servers' final ones and is told so.
"""

__all__ = ["KeptWeights"]


class KeptWeights:
    """Base of the data paths whose servers keep the weights: the reads they note."""

    @staticmethod
    def note_read(sender: int, key) -> None:
        """``sender`` read ``key``'s weights with a plain pull."""
        key.rounds.note_read(sender)

    @staticmethod
    def stale(sender: int, keys) -> int:
        """How many of ``keys`` ``sender`` last read before their latest change."""
        return sum(1 for key in keys if key.rounds.stale(sender))
