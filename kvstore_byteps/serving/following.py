"""Row_sparse pulls that follow a push (the ``after_push`` meta field). Pure bookkeeping.

A ``dist_byteps`` worker sends the pull of a row range right behind its push of that range,
before the push is answered, naming the push's timestamp: the server holds the pull until the
round that push joined is complete and updated, then answers it. (MXNet's worker waits for the
push's answer before it pulls: a round trip and a wake-up more a range, and on a busy
connection the pull queues behind every push sent meanwhile.) Timestamps of one worker grow,
so a pull is due once a round holding that worker's push of at least its timestamp is done;
a pull that overtook its push (a van that reorders) is held until the push's round is done.
"""
from typing import Callable, Dict, List, Tuple

__all__ = ["FollowingPulls"]


class FollowingPulls:
    """Per ps key: the newest push timestamp of each worker whose round is done, and the pulls
    held for a round. Not thread-safe: called under the server's lock."""

    def __init__(self):
        self._done: Dict[int, Dict[int, int]] = {}           # ps key -> sender -> timestamp
        self._held: Dict[int, List[Tuple[int, int, Callable]]] = {}

    def due(self, ps_key: int, sender: int, after: int) -> bool:
        """Whether a pull following ``sender``'s push ``after`` may be answered now."""
        return self._done.get(ps_key, {}).get(sender, after - 1) >= after

    def hold(self, ps_key: int, sender: int, after: int, answer: Callable[[], None]) -> None:
        """Keep ``answer`` (of a pull not yet due) for when its push's round is done."""
        self._held.setdefault(ps_key, []).append((sender, after, answer))

    def round_done(self, ps_key: int, pushes: List[Tuple[int, int]]) -> List[Callable]:
        """A round of ``ps_key`` holding ``pushes`` ``[(sender, timestamp)]`` is done (also a
        key's initialising push): the answers now due, to run."""
        done = self._done.setdefault(ps_key, {})
        for sender, timestamp in pushes:
            if timestamp > done.get(sender, timestamp - 1):
                done[sender] = timestamp
        held = self._held.get(ps_key)
        if not held:
            return []
        due = [entry for entry in held if done.get(entry[0], entry[1] - 1) >= entry[1]]
        if due:
            self._held[ps_key] = [entry for entry in held if entry not in due]
        return [answer for _, _, answer in due]
