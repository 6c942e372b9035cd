"""Synchronous training on the server (the default): rounds of sums that the workers apply,
or, once the workers sent an optimizer (kController, as MXNet's ``dist_sync`` workers do with
``update_on_kvstore``), rounds the servers' optimizer applies.

Each round every worker pushes a key once (acked at once, or held by pacing, see
:mod:`.pacing`) and pulls it once; the pushes are summed by the key's summing thread, and a
pull is answered with the round's sum when all ``num_workers`` pushes of that round are summed.
Rounds are counted per (key, worker); see :mod:`.rounds` for the double buffering. A pushpull
is a push followed by a pull and gets one answer, with the sum; a pull riding along with a push
is answered under its own timestamp when the round is summed. A push whose ``round`` extension
field is set must match the server's count (the compressed path always sets it).

With an optimizer, the summing thread that completes a key's round applies it to the key's
weights (its value) before any pull can read the round: the round's answer is the new weights,
and each partition is updated as soon as its own round is summed, while the others are still
on the wire. A failed update is the answer to every pull of that round.
"""
import logging
from typing import Optional, Tuple

import numpy as np

from ..mxproto import WAITING_SHOWN, ServerCommand
from .compressed import claimed_round
from .datapath import Answers, DataPath, describe_sum
from .pacing import ImmediateAcks, PacedAcks
from .rounds import FailedRound, KeyRounds
from .store import publish

__all__ = ["SummedRounds"]

log = logging.getLogger(__name__)


class SummedRounds(DataPath):
    """The BytePS server's data path in synchronous training: each key's rounds of sums."""

    quick = True

    def __init__(self, answers: Answers, pacing: Optional[Tuple[int, float]] = None):
        """``pacing``: (lead bytes, hold seconds) to pace round pushes' acknowledgements, or
        None to acknowledge them at once."""
        super().__init__(answers)
        self.acks = (PacedAcks(answers.num_workers, *pacing) if pacing is not None
                     else ImmediateAcks())
        #: ps key -> its weights as the servers' optimizer keeps them (once there is one)
        self._weights = {}
        # the summing threads' work, as stages of the server profile (profiler.py)
        self._accumulate = answers.timed("sum", self._accumulate, describe_sum)

    def worker_command(self, head, sender: int, body: bytes, keys) -> Optional[bytes]:
        """``BYTEPS_WAITING``: the rounds that wait for ``sender``'s push (see mxproto)."""
        if head != ServerCommand.BYTEPS_WAITING:
            return None
        found = []
        for key in keys:
            waiting = key.rounds.waiting_for(sender)
            if waiting is not None:
                found.append(b"%d:%d:%s" % (key.ps_key, waiting[0],
                                            b",".join(b"%d" % s for s in waiting[1])))
                if len(found) == WAITING_SHOWN:
                    break
        return b";".join(found)

    def depart(self, sender: int, keys) -> None:
        """Worker ``sender`` left (elastic workers): each round that waited only for its push
        closes, on its key's summing thread, scaled to the whole job's pushes. (The server's
        :class:`Departed`, which every key's rounds read, keys made meanwhile too, holds it
        already.)"""
        for key in keys:
            for r in key.rounds.depart(sender):
                self._answers.submit(key.thread, lambda k=key, r=r: self._close_without(k, r))

    def admit(self, sender: int, keys) -> None:
        """A late worker in the departed ``sender``'s place joins every key's next round."""
        self._answers.departed.readmit(sender)
        for key in keys:
            key.rounds.admit(sender)

    def _close_without(self, key, r: int) -> None:
        """Summing thread: round ``r`` of ``key`` closes if no push it waits for is due."""
        tokens, answer = key.rounds.recheck(r, self._finish(key))
        for token in tokens:
            self._answer(token, answer)

    def _finish(self, key):
        """What a complete round of ``key`` goes through: the servers' optimizer, if sent."""
        if self._answers.updater is None:
            return None
        return lambda total: self._update(key, total)

    def new_rounds(self, ps_key: int, values: np.ndarray) -> KeyRounds:
        answers = self._answers
        return KeyRounds(ps_key, answers.seats, values.size, values.dtype, answers.departed,
                         scale_to=answers.num_workers)

    def push(self, req, server, key, values: np.ndarray, pull: bool, attached=None) -> None:
        """Count the push in its round; answer it (a pushpull: with the round's sum); sum."""
        r = key.rounds.begin_push(req.sender, claimed_round(req))
        if pull:
            self.pull(req.sender, (req, server), key)
        else:
            self._ack_push(req, server, values.nbytes)
        self._pull_attached(attached, server, key)
        self._answers.submit(key.thread, lambda: self._accumulate(key, r, values))

    def begin_sum(self, req, server, key, values: np.ndarray, r: int) -> None:
        """A push of ``key``'s round ``r`` (as claimed): counted, acknowledged, summed (with
        the servers' optimizer, the workers then pull the round's weights uncompressed)."""
        r = key.rounds.begin_push(req.sender, r)
        self._ack_push(req, server, values.nbytes)
        self._answers.submit(key.thread, lambda: self._accumulate(key, r, values))

    def push_batch(self, req, server, keys, values) -> None:
        """Each key's push counted and summed; the batch acknowledged once."""
        for key, part in zip(keys, values):
            r = key.rounds.begin_push(req.sender)
            self._answers.submit(key.thread,
                                 lambda k=key, r=r, v=part: self._accumulate(k, r, v))
        self._ack_push(req, server, sum(part.nbytes for part in values))

    def pull(self, sender: int, token, key) -> None:
        """Answered when the pulled round is summed: now, or by the push that completes it."""
        self._answer(token, key.rounds.request_pull(sender, token))

    def _ack_push(self, req, server, nbytes: int) -> None:
        """Acknowledge a round push now, or (pacing on) once the other workers caught up."""
        self.acks.ack(req.sender, nbytes, lambda: self._answers.ack(req, server))

    def _answer(self, token, answer) -> None:
        """Answer a pull with its round's answer (None: not complete yet)."""
        if isinstance(answer, FailedRound):
            self._answers.fail(token, answer.message)
        elif answer is not None:
            self._answers.deliver(token, answer)

    def _accumulate(self, key, r: int, values: np.ndarray) -> None:
        """Summing thread: add a push to its round; a complete round (updated by the servers'
        optimizer, if the workers sent one) answers its pulls."""
        tokens, answer = key.rounds.accumulate(r, values, self._finish(key))
        for token in tokens:
            self._answer(token, answer)

    def _update(self, key, total: np.ndarray) -> Optional[str]:
        """The optimizer applied to ``key``'s weights with its round's sum ``total``, which
        becomes the new weights (the round's answer); None, or why it failed."""
        if key.value is None:
            return ("ps key %d: its weights were lost when this server was restarted (the "
                    "servers' optimizer keeps them here)" % key.ps_key)
        weights = self._weights.get(key.ps_key)
        if weights is None:       # the optimizer's own copy, updated in place every round
            weights = self._weights[key.ps_key] = np.array(key.value, copy=True)
        try:
            self._answers.update_in_place(key.ps_key, total, weights)
        except Exception as exc:      # a failing optimizer must not stop the summing thread
            log.exception("update of ps key %d failed", key.ps_key)
            return "update of ps key %d failed: %s" % (key.ps_key, exc)
        np.copyto(total, weights)
        # what a plain pull reads: a copy, which no later update changes under a send
        key.value = publish(weights.copy())
        return None
