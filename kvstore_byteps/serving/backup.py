"""Synchronous training with backup workers on the server (``BYTEPS_BACKUP_WORKERS=b``).

The servers keep the weights and run the optimizer, as MXNet's ``dist_sync`` servers do with
``update_on_kvstore``: rank 0 sends the optimizer (kController, restricted-unpickled here).
A round of a key closes when ``W - b`` workers pushed it (:mod:`.backup_rounds`); the sum of
those ``c`` gradients is scaled by ``W / c``, so an update has the size of a full round's
(the optimizer's ``rescale_grad`` is set for ``W`` workers' batches, as in ``dist_sync``), and
applied once; the round's pulls get the new weights. A late push is dropped and counted; a
worker that waits in a barrier or leaves (``BYTEPS_ABSENT``) is not waited for.
"""
import logging
from typing import Callable

import numpy as np

from ..errors import ProtocolError
from ..van.kv_keys import PARTITION_BITS
from .backup_rounds import BackupRounds
from .store import publish

__all__ = ["BackupWorkers"]

log = logging.getLogger(__name__)


class BackupWorkers:
    """The BytePS server's data path with backup workers (plugged into BytePSServer)."""

    riding_pull_refusal = None      # a riding pull is answered when its round closes
    compression_refusal = ("gradient compression cannot be used with backup workers "
                           "(BYTEPS_BACKUP_WORKERS): the servers run the optimizer on the "
                           "rounds' sums")

    def __init__(self, server, backup_workers: int, describe: Callable):
        self._server = server
        self.backup_workers = backup_workers
        self._absent = set()            # workers away now (keys made meanwhile start so)
        self._add = server.profiler.timed("sum", self._add, describe)

    def new_rounds(self, ps_key: int, values: np.ndarray) -> BackupRounds:
        rounds = BackupRounds(ps_key, self._server.num_workers, self.backup_workers,
                              values.size, values.dtype)
        for sender in list(self._absent):
            rounds.set_absent(sender, True)
        return rounds

    def push(self, req, server, key, values: np.ndarray, pull: bool) -> None:
        """Count (or drop, if stale) a gradient of ``key``; answer the push at once, or (a
        pushpull) with the weights once its round closed."""
        r = key.rounds.begin_push(req.sender)
        if pull:
            self.pull(req.sender, (req, server), key)
        else:
            self._server.send_answer(server, req)
        self._sum(key, r, values)

    def push_batch(self, req, server, keys, values) -> None:
        """A batch of gradients, one per key, each counted or dropped; acknowledged once."""
        rounds = [key.rounds.begin_push(req.sender) for key in keys]
        self._server.send_answer(server, req)
        for key, r, part in zip(keys, rounds, values):
            self._sum(key, r, part)

    def _sum(self, key, r, values: np.ndarray) -> None:
        if r is None:
            log.debug("key %d: a stale push dropped (%d so far)", key.ps_key, key.rounds.dropped)
            return
        self._server.summing.submit(key.thread, lambda: self._add(key, r, values))

    def pull(self, sender: int, token, key) -> None:
        """The first weights newer than the round ``sender`` pushed: now or at its close."""
        if key.rounds.request_pull(sender, token) is not None:
            self._server.deliver(token, key.value)

    def absent(self, sender: int, absent: bool, keys) -> None:
        """``sender`` pushes nothing for now (waits in a barrier, or left): close the rounds
        of ``keys`` that no longer need its push; or it is back."""
        (self._absent.add if absent else self._absent.discard)(sender)
        for key in keys:
            key.rounds.set_absent(sender, absent)
            if absent:
                self._server.summing.submit(key.thread, lambda k=key: self._close(
                    k, k.rounds.recheck()))

    def _index(self, ps_key: int) -> int:
        """The index the optimizer keeps ``ps_key``'s state under: ``-1 - local key`` (unique
        on this server, and never an MXNet key, so a partition cannot take another
        parameter's multipliers), given the learning-rate and weight-decay multipliers of
        the MXNet key the partition belongs to (MXNet's server updates by MXNet key)."""
        local = self._server.mxnet_key(ps_key)
        alias = getattr(self._server.updater, "alias", None)
        if alias is not None:
            alias(-1 - local, local >> PARTITION_BITS)
        return -1 - local

    @staticmethod
    def close(keys) -> None:
        """Say how many late pushes were dropped (the server is done)."""
        keys = list(keys)
        dropped = sum(key.rounds.dropped for key in keys)
        log.info("backup workers: %d late push(es) dropped over %d key(s), %d round(s)",
                 dropped, len(keys), sum(key.rounds.version for key in keys))

    def _add(self, key, r: int, values: np.ndarray) -> None:
        self._close(key, key.rounds.add(r, values))

    def _close(self, key, complete) -> None:
        """Summing thread: apply the optimizer to a complete round, answer its pulls."""
        if complete is None:
            return
        total, count = complete
        server = self._server
        grad = total if count == server.num_workers else total * (server.num_workers / count)
        try:
            if server.updater is None:
                raise ProtocolError("no optimizer: with BYTEPS_BACKUP_WORKERS the servers run "
                                    "the optimizer, set by the workers' store (gluon.Trainer "
                                    "and Module.fit do; or kv.set_optimizer)")
            key.value = publish(server.updater(self._index(key.ps_key), grad,
                                               key.value).astype(key.dtype, copy=False))
            error = None
        except ProtocolError as exc:  # answered to every pull of the round: the workers say it
            error = str(exc)
        except Exception as exc:      # a failing optimizer must not stop the summing thread
            log.exception("update of ps key %d failed", key.ps_key)
            error = "update of ps key %d failed: %s" % (key.ps_key, exc)
        for token in key.rounds.close():
            if error is None:
                server.deliver(token, key.value)
            else:
                server.fail(token, error)
