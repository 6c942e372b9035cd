"""Synchronous training with backup workers on the server (``BYTEPS_BACKUP_WORKERS=b``).

The servers keep the weights and run the optimizer, as MXNet's ``dist_sync`` servers do with
``update_on_kvstore``: rank 0 sends the optimizer (kController, restricted-unpickled here).
A round of a key closes when ``W - b`` workers pushed it (:mod:`.backup_rounds`); the sum of
those ``c`` gradients is scaled by ``W / c``, so an update has the size of a full round's
(the optimizer's ``rescale_grad`` is set for ``W`` workers' batches, as in ``dist_sync``), and
applied once; the round's pulls get the new weights. A round with its ``W - b`` waits a
little for the workers still on time (a timed recheck on the key's summing thread). A late push
(computed on the weights of the round closed last, or arriving while its round's update is
computed) joins the open round as one more gradient (its pull is answered at once with the
current weights), an older one is dropped and counted; a round also closes once every
worker present pushed into it (never a wait for a worker's next push: see
:mod:`.backup_rounds`); a worker that waits in a barrier or finished (``BYTEPS_ABSENT``) is not
waited for. Once ``W - b`` workers finished training, the job's training is over: no round
closes any more, and
a late worker's pulls are answered with an error that tells it so (``errors.TRAINING_OVER``;
its next step raises ``TrainingOver``).
"""
import logging
import time

import numpy as np

from ..config.training import BACKUP_WAIT_PERCENT
from ..errors import TRAINING_OVER, ProtocolError
from ..mxproto import Presence
from ..words import count
from .backup_rounds import ENDED, SHORTAGE_GRACE, BackupRounds
from .datapath import Answers, describe_sum
from .kept import KeptWeights
from .store import publish

__all__ = ["BackupWorkers"]

log = logging.getLogger(__name__)


class BackupWorkers(KeptWeights):
    """The BytePS server's data path with backup workers."""

    riding_pull_refusal = None      # a riding pull is answered when its round closes
    compression_refusal = ("gradient compression cannot be used with backup workers "
                           "(BYTEPS_BACKUP_WORKERS): the servers run the optimizer on the "
                           "rounds' sums")

    def __init__(self, answers: Answers, backup_workers: int,
                 wait: float = BACKUP_WAIT_PERCENT / 100.0):
        """``wait``: how long a round with its W - b pushes waits for the workers still on
        time, as a fraction of the key's last round (BYTEPS_BACKUP_WAIT)."""
        super().__init__(answers)
        self.backup_workers, self.wait = backup_workers, wait
        self._absent = set()            # workers away now (keys made meanwhile start so)
        self._done = set()              # workers that finished training
        self._add = answers.timed("sum", self._add, describe_sum)

    def new_rounds(self, ps_key: int, values: np.ndarray) -> BackupRounds:
        rounds = BackupRounds(ps_key, self._answers.num_workers, self.backup_workers,
                              values.size, values.dtype, self.wait)
        for sender in list(self._absent):
            rounds.set_absent(sender, True)
        for sender in list(self._done):
            rounds.finish(sender)
        return rounds

    def push(self, req, server, key, values: np.ndarray, pull: bool, attached=None) -> None:
        """Count (or drop, if stale) a gradient of ``key``; answer the push at once, or (a
        pushpull) with the weights once its round closed."""
        r = key.rounds.begin_push(req.sender)
        if pull:
            self.pull(req.sender, (req, server), key)
        else:
            self._answers.ack(req, server)
        self._sum(key, r, values)
        self._pull_attached(attached, server, key)

    def push_batch(self, req, server, keys, values) -> None:
        """A batch of gradients, one per key, each counted or dropped; acknowledged once."""
        rounds = [key.rounds.begin_push(req.sender) for key in keys]
        self._answers.ack(req, server)
        for key, r, part in zip(keys, rounds, values):
            self._sum(key, r, part)

    def _sum(self, key, r, values: np.ndarray) -> None:
        if r is None:     # too stale to sum, but its sender counts: the round may be complete
            log.debug("key %d: a push dropped (%d so far)", key.ps_key, key.rounds.dropped)
            self._recheck(key)
            return
        self._answers.submit(key.thread, lambda: self._add(key, r, values))

    def pull(self, sender: int, token, key) -> None:
        """The first weights newer than the round ``sender`` pushed: now or at its close."""
        version = key.rounds.request_pull(sender, token)
        if version == ENDED:
            self._answers.fail(token, self._over, quiet=True)
        elif version is not None:
            self._answers.deliver(token, key.value)
        else:
            self._watch_shortage(key)

    def absent(self, sender: int, presence: Presence, keys) -> None:
        """``sender`` pushes nothing for now (waits in a barrier) or finished training: close
        the rounds of ``keys`` that no longer need its push (none once the training is over);
        or it is back."""
        if presence is Presence.DONE:
            self._finish(sender, keys)
            return
        if sender in self._done:        # a barrier after its training: it stays done
            return
        absent = presence is Presence.AWAY
        (self._absent.add if absent else self._absent.discard)(sender)
        for key in keys:
            for token in key.rounds.set_absent(sender, absent):
                self._answers.fail(token, self._over, quiet=True)
            self._watch_shortage(key)
            self._recheck(key)

    def _watch_shortage(self, key) -> None:
        """Fewer than W - b workers present (the others in a barrier): if that lasts
        SHORTAGE_GRACE, the training is over for the workers still pushing."""
        spell = key.rounds.shortage_to_watch()
        if spell:
            self._answers.submit(key.thread, lambda: self._end_shortage(key, spell),
                                 SHORTAGE_GRACE)

    def _end_shortage(self, key, spell: int) -> None:
        for token in key.rounds.end_shortage(spell):
            self._answers.fail(token, self._over, quiet=True)

    def _finish(self, sender: int, keys) -> None:
        self._absent.add(sender)
        self._done.add(sender)
        if len(self._done) == self._answers.num_workers - self.backup_workers:
            log.info("backup workers: %s of %d finished training: the job's training is over, "
                     "later pushes are dropped", len(self._done), self._answers.num_workers)
        for key in keys:
            for token in key.rounds.finish(sender):
                self._answers.fail(token, self._over, quiet=True)
            self._recheck(key)

    def _recheck(self, key, delay: float = 0.0) -> None:
        self._answers.submit(key.thread, lambda: self._close(key, key.rounds.recheck()), delay)

    @property
    def _over(self) -> str:
        """The answer to a late worker's pull once the training is over."""
        waiting = len(self._absent - self._done)
        return TRAINING_OVER + (
            "%s of %d finished training%s (BYTEPS_BACKUP_WORKERS=%d), so the job's training is "
            "over; this worker's late gradient was not applied"
            % (len(self._done), self._answers.num_workers,
               " and %d wait%s in a barrier" % (waiting, "" if waiting > 1 else "s")
               if waiting else "", self.backup_workers))

    @staticmethod
    def close(keys) -> None:
        """Say how many pushes joined a later round or were dropped (the server is done)."""
        keys = list(keys)

        def total(field, noun, plural):
            return count(sum(getattr(key.rounds, field) for key in keys), noun, plural)
        log.info("backup workers over %s, %s (%s closed without a worker on time after "
                 "waiting for it): %s joined a later round, %s dropped, %s after the end of "
                 "training", count(len(keys), "key"), total("version", "round", ""),
                 total("waited_out", "round", ""),
                 total("joined_late", "late push", "late pushes"),
                 total("dropped", "push", "pushes"), total("dropped_after_end", "push", "pushes"))

    def _add(self, key, r: int, values: np.ndarray) -> None:
        self._close(key, key.rounds.add(r, values))

    def _close(self, key, complete) -> None:
        """Summing thread: apply the optimizer to a complete round, answer its pulls."""
        if complete is None:
            due = key.rounds.due()      # it waits a little for the workers still on time
            if due is not None:
                self._recheck(key, due - time.monotonic())
            return
        total, count = complete
        answers = self._answers
        grad = total if count == answers.num_workers else total * (answers.num_workers / count)
        try:
            key.value = publish(answers.update(key.ps_key, grad, key.value)
                                .astype(key.dtype, copy=False))
            error = None
        except ProtocolError as exc:  # answered to every pull of the round: the workers say it
            error = str(exc)
        except Exception as exc:      # a failing optimizer must not stop the summing thread
            log.exception("update of ps key %d failed", key.ps_key)
            error = "update of ps key %d failed: %s" % (key.ps_key, exc)
        for token in key.rounds.close():
            if error is None:
                answers.deliver(token, key.value)
            else:
                answers.fail(token, error)
