"""The seam between the BytePS server and its training mode's data path. Pure.

One data path per server, chosen once when the server is built from the job's training mode
(``Config.training_mode``), one module per mode:

* :mod:`.summed`: synchronous rounds of sums that the workers apply (the default), or that
  the servers' optimizer applies at each round's end once the workers sent one;
* :mod:`.asynchronous`: the weights kept here, each worker's change added as it comes;
* :mod:`.backup`: the weights kept here, rounds of ``W - b`` pushes through the optimizer.

The server checks a request and finds its key, then hands the push or pull to its path
(:class:`DataPath`); it never asks which path it has. A path answers through :class:`Answers`,
the few things of the server it may use, never the server itself.
"""
from typing import Callable, Optional

import numpy as np

from ..errors import ProtocolError
from ..van.wire.keys import PARTITION_BITS
from .batch import BatchSlot
from .pacing import ImmediateAcks
from .rounds import Departed

__all__ = ["Answers", "DataPath", "describe_sum"]


def describe_sum(key, r: Optional[int], values: np.ndarray) -> tuple:
    """A summation task as the server profile names it."""
    return "sum ps key %d" % key.ps_key, {"round": r, "bytes": int(values.nbytes)}


class Answers:
    """What a data path may do on its server: answer requests and pull tokens, run work on a
    key's summing thread (timed as a profile stage), and read the job's size, the optimizer
    the workers sent and the MXNet key of a ps key."""

    def __init__(self, num_workers: int, summing, timed: Callable, send_answer: Callable,
                 refuse: Callable, answer: Callable, updater: Callable, mxnet_key: Callable,
                 departed: Optional[Departed] = None, seats: int = 0):
        """``send_answer(server, req, **kwargs)``, ``refuse(req, server, message)`` and
        ``answer(req, server, value)`` answer a request; ``updater()`` is the optimizer now
        (None: none set); ``timed(category, fn, describe)`` is the profiler's; ``departed``:
        the server's workers that left the job (elastic workers); ``seats``: the most workers
        a growing job has (rounds are scaled to ``num_workers``)."""
        self.departed = departed or Departed()
        self.num_workers, self.summing, self.timed = num_workers, summing, timed
        self.seats = max(seats, num_workers)
        self.send_answer, self.refuse, self.answer = send_answer, refuse, answer
        self._updater, self.mxnet_key = updater, mxnet_key

    @property
    def updater(self):
        return self._updater()

    def update(self, ps_key: int, grad: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """The optimizer the workers sent applied to ``ps_key``'s ``weights`` with ``grad``:
        the new weights. ProtocolError if none was sent.

        Its state is kept under ``-1 - local key`` (unique on this server, and never an MXNet
        key, so a partition cannot take another parameter's multipliers), given the
        learning-rate and weight-decay multipliers of the MXNet key the partition belongs to
        (MXNet's server updates by MXNet key)."""
        updater, index = self._optimizer_for(ps_key)
        return updater(index, grad, weights)

    def update_in_place(self, ps_key: int, grad: np.ndarray, weights: np.ndarray) -> None:
        """As :meth:`update`, into ``weights`` (writable, owning its memory), without copies
        where the optimizer can (MXNet's)."""
        updater, index = self._optimizer_for(ps_key)
        in_place = getattr(updater, "update_in_place", None)
        if in_place is not None:
            in_place(index, grad, weights)
        else:
            weights[:] = updater(index, grad, weights)

    def _optimizer_for(self, ps_key: int) -> tuple:
        """(the updater, ``ps_key``'s state index), the index given its multipliers."""
        updater = self._updater()
        if updater is None:
            raise ProtocolError("no optimizer: the workers' store sends it before the rounds "
                                "the servers update (gluon.Trainer and Module.fit do; or "
                                "kv.set_optimizer)")
        local = self.mxnet_key(ps_key)
        alias = getattr(updater, "alias", None)
        if alias is not None:
            alias(-1 - local, local >> PARTITION_BITS)
        return updater, -1 - local

    def ack(self, req, server) -> None:
        """Answer a push with no values."""
        self.send_answer(server, req)

    def submit(self, thread: int, task: Callable[[], None], delay: float = 0.0) -> None:
        """Run ``task`` on summing thread ``thread``, after what is queued there (with
        ``delay``: not before ``delay`` seconds from now)."""
        self.summing.submit(thread, task, delay)

    def deliver(self, token, value: np.ndarray) -> None:
        """Answer a pull token (``(req, server)`` or a batch's slot) with ``value``."""
        if isinstance(token, BatchSlot):
            token.fill(value)
        else:
            req, server = token
            self.answer(req, server, value)

    def fail(self, token, message: str, quiet: bool = False) -> None:
        """Answer a pull token with an error (a batch once, for all its slots); logged unless
        ``quiet`` (an answer that is no failure: the training is over)."""
        if isinstance(token, BatchSlot):
            token.batch.fail(message)
        elif quiet:
            self.send_answer(token[1], token[0], error=message)
        else:
            req, server = token
            self.refuse(req, server, message)

    def serve_attached(self, attached, server, serve: Callable[[], None]) -> None:
        """Run ``serve`` for a pull that rode along with a push already acknowledged: a
        refusal must answer the pull (the push has its answer)."""
        try:
            serve()
        except ProtocolError as exc:
            self.refuse(attached, server, str(exc))


class DataPath:
    """One training mode's BytePS data path: where a key's pushes go and how its pulls are
    answered. A token is ``(req, server)`` or a batch's slot (:meth:`Answers.deliver`)."""

    #: why a pull cannot ride along with a push here (None: it can)
    riding_pull_refusal: Optional[str] = None
    #: why this mode cannot take gradient compression (None: it can)
    compression_refusal: Optional[str] = None
    #: how round pushes are acknowledged (pacing.py): at once unless a path paces them
    acks = ImmediateAcks()
    #: whether its pushes and pulls are only counted, queued for a summing thread and
    #: answered, never waiting or running an optimizer: the server may then take them on the
    #: van's receive loop
    quick = False

    def __init__(self, answers: Answers):
        self._answers = answers

    def new_rounds(self, ps_key: int, values: np.ndarray):
        """The per-key state of a key initialised with ``values`` (its ``rounds``)."""
        raise NotImplementedError

    def push(self, req, server, key, values: np.ndarray, pull: bool, attached=None) -> None:
        """A push of ``key`` (checked); ``pull``: a pushpull; ``attached``: a pull riding
        along with it (:mod:`.riding`), or None."""
        raise NotImplementedError

    def push_batch(self, req, server, keys, values) -> None:
        """A push of several keys (checked), one value array per key, answered once."""
        raise NotImplementedError

    def pull(self, sender: int, token, key) -> None:
        """A pull of ``key`` by ``sender``, answered through ``token``."""
        raise NotImplementedError

    def begin_sum(self, req, server, key, values: np.ndarray, r: int) -> None:
        """A decoded compressed push of ``key``'s round ``r`` (compressed.py)."""
        raise ProtocolError(self.compression_refusal or "no compressed pushes here")

    def note_read(self, sender: int, key) -> None:
        """``sender`` read ``key``'s value with a default-type pull."""

    def worker_command(self, head, sender: int, body: bytes, keys) -> Optional[bytes]:
        """A worker's ``BYTEPS_ABSENT`` or ``BYTEPS_STALE`` (``keys``: every key now): the
        answer's body if the path answers it, else None (the server's table answers)."""
        return None

    def depart(self, sender: int, keys) -> None:
        """Worker ``sender`` left the job (elastic workers; ``keys``: every key now): no
        round may wait for it any more. Only synchronous rounds accept elastic workers
        (config: BYTEPS_MIN_WORKERS), so the other paths never get here."""
        raise ProtocolError("worker %d left, but this training mode has no elastic workers"
                            % sender)

    def admit(self, sender: int, keys) -> None:
        """A late worker took the departed worker ``sender``'s place (elastic workers), the
        others between rounds: it takes part in every key's rounds from the next on (the
        server's :class:`.rounds.Departed` no longer holds it)."""
        raise ProtocolError("worker %d joins, but this training mode has no elastic workers"
                            % sender)

    def close(self, keys) -> None:
        """The server closes (its summing threads are stopped)."""

    def _pull_attached(self, attached, server, key) -> None:
        """Answer the pull riding along with a push of ``key``, if there is one."""
        if attached is not None:
            self._answers.serve_attached(
                attached, server, lambda: self.pull(attached.sender, (attached, server), key))
