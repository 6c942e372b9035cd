"""Asynchronous training on the server (``BYTEPS_ENABLE_ASYNC=1``): pushes are added into the
weights, pulls read them as they are.

BytePS's asynchronous mode: each worker pushes a change of the weights (its own optimizer
made it, see ``mxnet_patch/async_training.py``); a key's summing thread adds it into the
stored weights, in whatever order changes come, and only then answers the push, so a worker
that reads after its acknowledged push finds its change in (read-your-writes). A pull is
answered at once with the weights as they are. No round, no waiting for other workers.

Each key counts the changes that altered its weights and, per worker, the count it last read
(:class:`Versions`): once every worker finished, a worker whose count is behind ends with
weights that differ from the servers' (``BYTEPS_STALE``; the worker warns).
"""
import threading
from typing import Callable

import numpy as np

from .datapath import Answers, describe_sum
from .kept import KeptWeights
from .store import publish

__all__ = ["AsyncAdds"]


class AsyncAdds(KeptWeights):
    """The BytePS server's data path in asynchronous training."""

    #: why a pull cannot ride along with a push here (it is answered at once instead)
    riding_pull_refusal = ("a pull riding along with a push needs synchronous rounds (this "
                           "server has BYTEPS_ENABLE_ASYNC on)")
    compression_refusal = ("gradient compression needs synchronous training "
                           "(BYTEPS_ENABLE_ASYNC is on)")
    quick = True

    def __init__(self, answers: Answers):
        super().__init__(answers)
        self._add = answers.timed(
            "sum", self._add, lambda key, values, then: describe_sum(key, None, values))

    def new_rounds(self, ps_key: int, values: np.ndarray) -> "Versions":
        """No rounds: a key is its weights, and the versions of them each worker read."""
        return Versions()

    def push(self, req, server, key, values: np.ndarray, pull: bool, attached=None) -> None:
        """Add ``values`` to ``key``'s weights, then answer: the push's ack, or (a pushpull)
        the weights with the change in."""
        answers = self._answers
        if pull:
            def then():
                key.rounds.note_read(req.sender)
                answers.deliver((req, server), key.value)
        else:
            then = lambda: answers.ack(req, server)                   # noqa: E731
        answers.submit(key.thread, lambda: self._add(key, values, then))
        self._pull_attached(attached, server, key)

    def push_batch(self, req, server, keys, values) -> None:
        """A batch of changes, acknowledged once, after every key has its change added."""
        added = _Countdown(len(keys), lambda: self._answers.ack(req, server))
        for key, part in zip(keys, values):
            self._answers.submit(key.thread, lambda k=key, v=part: self._add(k, v, added.done))

    def pull(self, sender: int, token, key) -> None:
        """Answer at once with the weights as they are."""
        key.rounds.note_read(sender)
        self._answers.deliver(token, key.value)

    @staticmethod
    def _add(key, values: np.ndarray, then: Callable[[], None]) -> None:
        # a new array each time: pulls answered meanwhile keep the previous weights intact
        key.value = publish(np.add(key.value, values))
        if values.any():            # a read of the weights pushes zeros: no change
            key.rounds.version += 1
        # the push is answered (acked or read back) only now: a worker's pull after its acked
        # push reads weights that hold its change
        then()


class Versions:
    """How many changes altered one key's weights, and the count each worker last read.

    ``version`` is written by the key's summing thread only; a read notes the count before
    it reads the weights, so a change added in between makes the worker look behind (never
    the reverse)."""

    def __init__(self):
        self.version = 0
        self._read = {}

    def note_read(self, sender: int) -> None:
        self._read[sender] = self.version

    def stale(self, sender: int) -> bool:
        return self._read.get(sender, 0) != self.version


class _Countdown:
    """Runs ``then`` when :meth:`done` was called ``count`` times (from any threads)."""

    def __init__(self, count: int, then: Callable[[], None]):
        self._left, self._then = count, then
        self._lock = threading.Lock()

    def done(self) -> None:
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._then()
