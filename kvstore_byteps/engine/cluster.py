"""A worker's life in the job: joining it (the start-up barrier, the KV worker, the server probe
and the partition layout rank 0 chose, with the link test it measures by), commands to every
server, the workers' barriers (watched, :mod:`.stuck`), finishing the training and MXNet's
exit sequence. Knows nothing of rounds; keys it names through ``name_of``."""
import dataclasses
import logging
from typing import Callable, List, Optional, Tuple

import numpy as np

from ..config import Config, ServerKind
from ..errors import ConfigError, KVStoreBytePSError
from ..mxproto import Presence, RequestType, ServerCommand, encode_cmd
from ..van.kv import open_worker
from ..van.runtime.barriers import join_kind
from ..van.runtime.departures import seat_words
from ..van.runtime.postoffice import Postoffice
from ..van.wire.message import (ALL_GROUP, SERVER_GROUP, WORKER_GROUP, id_to_rank,
                                server_rank_to_id)
from . import sizing
from .fusion import BUCKET_INDEX
from .joins import JoinPort, Joins
from .layout import server_kind
from .modes import tell_presence
from .partition import decode_ps_key
from .stuck import BarrierPort, Waiting, WorkerBarriers, parse as parse_waiting

__all__ = ["Cluster"]

log = logging.getLogger(__name__)


class Cluster:
    """One worker's membership of the job: its postoffice and KV worker, its rank, commands to
    the servers and the workers' barriers. Blocking methods, on the program's thread."""

    def __init__(self, config: Config, postoffice: Postoffice, name_of: Callable[[int], str]):
        """Nothing touches the network until :meth:`join`. ``name_of(key)``: how a key is
        shown in messages (the trace's name)."""
        self.config = config
        self.mode = config.training_mode
        self.po = postoffice
        self._name_of = name_of
        self.kv = None          # the KV layer's worker app (set at join)
        self.rank: Optional[int] = None
        #: bytes a second rank 0 measured to the servers when it sized the partitions
        self.link_rate: Optional[float] = None
        self._finished = False           # finish_training ran (its barrier passed)
        #: elastic joins (engine/joins.py; set at join)
        self.joins: Optional[Joins] = None
        #: the workers' barriers, watched for the others waiting for this worker's pushes
        self.barriers = WorkerBarriers(BarrierPort(
            lambda: self.rank, self._waiting_rounds,
            lambda timeout, kind: self.po.barrier(WORKER_GROUP, timeout=timeout, kind=kind),
            lambda why: self.po.end_job(why), self._name_ps_key))

    @property
    def num_workers(self) -> int:
        """The job's workers: DMLC_NUM_WORKER; in an elastic job those in it now (a worker
        counts from when it takes its seat until it leaves)."""
        if self.rank is None or not self.config.elastic:
            return self.config.num_workers
        return len(self.po.group_ids(WORKER_GROUP))

    def join(self) -> ServerKind:
        """Postoffice start and MXNet's start-up barrier, the KV worker, the server probe and,
        with our servers, rank 0's partition layout (:attr:`config` then has its partition
        size). Returns the servers' kind."""
        config = self.config
        self.po.start()
        self.joins = Joins(JoinPort(self._send_first, self.wait_bodies, self.command,
                                    self._join_barrier, self.leads, config.request_timeout),
                           late=self.po.joined, enabled=config.elastic)
        if self.po.joined:
            log.warning("worker rank %d takes %s in a running job: it joins at the others' "
                        "next State.commit()", self.po.my_rank,
                        seat_words(self.po.my_id, config))
        else:       # (a late worker's start-up barrier was passed long ago)
            self.po.barrier(ALL_GROUP)
        self.kv = open_worker(self.po)
        self.rank = self.po.my_rank
        # our servers check that they train as this worker does; MXNet's ignore the body
        probe = self.command(ServerCommand.BYTEPS_PROBE, self.mode.name.encode("utf-8"),
                             "the server probe")
        kind = server_kind(probe.bodies.values())
        if kind is ServerKind.BYTEPS:
            layout = self.agree_on_layout()
            if config.size_partitions_by_link:
                config = dataclasses.replace(config,
                                             partition_bytes=int(layout["partition_bytes"]))
            # rank 0's: every worker must lay a row_sparse key out alike
            self.config = dataclasses.replace(
                config, row_range_bytes=int(layout.get("row_range_bytes") or 0))
        return kind

    def agree_on_layout(self) -> dict:
        """Rank 0's layout, which every worker takes (sizing.py): the partition size (rank 0
        measures its link, unless BYTEPS_PARTITION_BYTES says) and the gradient buckets'
        capacity, which must be this worker's: a worker that fuses otherwise ends the job
        at start, saying so (fused differently, the workers sent each other's rounds in
        different server keys, and waited for each other until BYTEPS_REQUEST_TIMEOUT)."""
        config = self.config
        layout = sizing.agree_on_layout(
            None if self.po.joined else self.rank, self.po.num_servers, self.command,
            self.link_test,
            lambda: self.po.barrier(WORKER_GROUP, timeout=config.request_timeout),
            None if config.size_partitions_by_link else config.partition_bytes,
            config.fusion_bytes)
        self.link_rate = layout.get("rate")
        theirs = layout.get("fusion_bytes")       # None: rank 0 of an older release
        if theirs is not None and theirs != config.fusion_bytes:
            error = ConfigError(
                "worker rank %d has BYTEPS_FUSION_BYTES=%d, rank 0 %d: gradient buckets fuse "
                "keys by it, and workers that fuse otherwise cannot sum together: set the "
                "same BYTEPS_FUSION_BYTES on every worker" % (self.rank, config.fusion_bytes,
                                                              theirs))
            self.po.end_job(str(error))
            raise error
        return layout

    def link_test(self, body) -> None:
        """``body`` to every server at once as pushes they acknowledge and drop."""
        cmd = encode_cmd(RequestType.BYTEPS_LINK_TEST, np.float32)
        requests = [self.kv.send_push(server, cmd, b"", [0], body, [len(body)], "the link test")
                    for server in self.po.group_ids(SERVER_GROUP)]
        for request in requests:
            self.wait(request, "the link test")

    def wait(self, request, what: str):
        """``request``'s answer; its failure says this worker's rank and ``what`` it was."""
        try:
            return self.kv.wait(request)
        except KVStoreBytePSError as exc:
            raise type(exc)("worker rank %d, %s: %s" % (self.rank, what, exc)) from exc

    def command(self, head: ServerCommand, body: bytes, what: str):
        """Send a command to every server and wait for their answers; the request."""
        request = self.kv.command(head, body)
        self.wait(request, what)
        return request

    def barrier(self, what: str = "in a barrier of the workers (kv._barrier)") -> None:
        """Wait for every worker (``what`` it waits in, for messages). With backup workers, the
        servers' rounds do not wait for this worker's pushes meanwhile (the others may still be
        training). A late worker's barriers before it joined pass at once: the others passed
        theirs long ago."""
        if self.joins is not None and self.joins.joining:
            log.debug("worker rank %d, joining: %s passes at once", self.rank, what)
            return
        self._barrier(what, "")

    def declare_barrier(self, what: str) -> None:
        """The workers' pairing of a key's init (``what``: which). In elastic jobs its own
        kind: the workers that took a departed one's place are no members (they read the
        keys the others declared long ago without it, and never initialise one)."""
        if self.po.joined:
            return
        self._barrier(what, "declare" if self.config.elastic else "")

    def _barrier(self, what: str, kind: str) -> None:
        tell_presence(self.mode, self.command, Presence.AWAY)
        self.barriers.wait(what, self.config.request_timeout, kind=kind)   # engine/stuck.py
        tell_presence(self.mode, self.command, Presence.BACK)

    def _waiting_rounds(self) -> List[Waiting]:
        """Every server's rounds that wait for this worker's push (BYTEPS_WAITING)."""
        request = self.kv.command(ServerCommand.BYTEPS_WAITING, b"")
        self.kv.wait(request)
        return [w for body in request.bodies.values() for w in parse_waiting(body)]

    def _name_ps_key(self, ps_key: int) -> str:
        """``key 3 (conv0_weight) partition 1`` or ``gradient bucket 2``, from a ps key."""
        _, key, index = decode_ps_key(ps_key, self.po.num_servers)
        if index == BUCKET_INDEX:
            return "gradient bucket %d" % key
        return "%s partition %d" % (self._name_of(key), index)

    def set_optimizer(self, body: bytes, multi_precision: bool = False) -> None:
        """kController from rank 0 (MXNet's body: the optimizer pickled with protocol 0): the
        servers run it on the rounds' sums (synchronous training with update_on_kvstore, backup
        workers); then kSetMultiPrecision if ``multi_precision``, as MXNet's store sends it.
        Then a barrier: no worker may push before the servers have the optimizer (a round may
        close without rank 0's push; every worker calls this, as gluon and Module do).
        Blocking."""
        if self.po.joined:      # the servers run the others' optimizer already
            return
        if self.leads():
            self.command(ServerCommand.CONTROLLER, body, "setting the optimizer")
            if multi_precision:
                self.command(ServerCommand.SET_MULTI_PRECISION, b"",
                             "setting the optimizer's multi-precision")
        self.barrier()

    def finish_training(self) -> bool:
        """This worker trains no more. Where the servers keep the weights (asynchronous
        training, backup workers): tell them (backup workers: once W - b workers finished,
        the job's training is over) and wait for every worker to finish, so the servers'
        weights are final; True. Synchronous training: nothing to wait for (every worker holds
        the same weights), False. Once: the engine's close calls it too, so every worker
        passes its barrier exactly once whether or not the program called it. Blocking."""
        if self.mode.summed:
            return False
        if not self._finished:
            tell_presence(self.mode, self.command, Presence.DONE)
            # a finish barrier: the others' own barriers no longer wait for this worker
            self.barriers.wait("in its finish barrier", self.config.request_timeout,
                               kind="finish")
            self._finished = True
        return True

    def stale_keys(self) -> Tuple[int, int]:
        """After :meth:`finish_training`: ``(stale, keys)``, how many of the servers' keys
        this worker last read before their latest change (its weights differ from the
        servers' final ones) and of how many."""
        answers = self.command(ServerCommand.BYTEPS_STALE, b"", "comparing this worker's "
                               "weights with the servers'").bodies.values()
        counts = [tuple(map(int, bytes(body).split(b"/"))) for body in answers]
        return sum(c[0] for c in counts), sum(c[1] for c in counts)

    def warn_if_stale(self, training_over: bool) -> None:
        """One line if this worker's weights differ from the servers' final weights
        (``training_over``: a server said the job's training is over)."""
        stale, keys = self.stale_keys()
        if stale:
            # ended by TrainingOver, the script's own finish_training (after its loop) never ran
            advice = ("catch kvstore_byteps.TrainingOver around the training loop, then call "
                      "kvstore_byteps.finish_training(trainer or module)" if training_over
                      else "call kvstore_byteps.finish_training(trainer or module) after training")
            log.warning("worker rank %d ends with weights that differ from the servers' final "
                        "weights (%d of %d partitions read before their last change, training "
                        "%s): %s", self.rank, stale, keys, self.mode.name, advice)

    def leads(self) -> bool:
        """Whether this worker does rank 0's part now: it is rank 0, or the lowest rank
        still in an elastic job whose lower ranks left (never a late worker, which takes
        no part in what was set up before it came)."""
        late = self.po.roster.late
        ranks = [i for i in self.po.group_ids(WORKER_GROUP) if i not in late]
        return not self.po.joined and bool(ranks) and self.rank == id_to_rank(min(ranks))

    # -- elastic joins (engine/joins.py) ------------------------------------------------------
    def _send_first(self, head: ServerCommand, body: bytes):
        return self.kv.command(head, body, servers=[server_rank_to_id(0)])

    def wait_bodies(self, request, what: str) -> bytes:
        """A command to one server: its answer's body, waited for."""
        self.wait(request, what)
        return bytes(next(iter(request.bodies.values())))

    def _join_barrier(self, within: float, joiners) -> None:
        self.barriers.wait("in the join barrier (late workers %s join)" % sorted(joiners),
                           within, kind=join_kind(joiners))

    def leave(self, within: float, ending: Optional[str]) -> None:
        """MXNet's exit sequence: the shutdown barrier (Barrier(4); ``within`` seconds;
        ``ending``: why this worker leaves early, :mod:`.stuck`), kStopServer from rank 0,
        Barrier(7). (Rank 0, or the lowest rank still in an elastic job.)"""
        if self.joins is not None and ending is None:
            self.joins.finish()
        self.barriers.wait("in the shutdown barrier", within, cause=ending, kind="shutdown")
        if self.leads():
            self.command(ServerCommand.STOP_SERVER, b"", "kStopServer")
        self.po.finalize(timeout=within)

    def close(self) -> None:
        """Stop watching the barriers and stop the postoffice."""
        self.barriers.close()
        self.po.stop()
